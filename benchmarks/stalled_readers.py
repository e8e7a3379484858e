"""Clients that stop reading (issue 35): what they cost the serving processes' memory.

On the aggregated CPU app (configs/agg-cpu.yaml, HAProxy in front), two phases:

  warm     `--streams` (100) streamed completions of `--max-tokens` tokens (ignore_eos, 20 top logprobs a
           token: ~0.7 KB an event), read as they come: the processes' memory reaches what 100 such streams
           need (Python keeps the heap it grew), so that the stall phase measures what stalled readers add
  stall    the same again, each from a raw socket with a small receive buffer that reads its headers and
           first event, then nothing for `--stall-s` (60), while the resident memory of the frontend
           replica, the decode replica and its engine processes is sampled every second. Then every client
           reads to the end.

Under Ray Serve an ASGI app's `send` never waits for its client: Serve puts each message on an unbounded
queue (ray/serve/_private/replica.py, `call_http_entrypoint`: `MessageQueue.put_nowait`) and writes it
out apart from the app. So a stream whose client stops reading is generated to its end regardless, and
what the client has not read waits in the frontend replica, at most the request's `max_tokens` of events.

The run fails unless the frontend's and the decode replica's memory at every sample of the stall are within
5% of the stall's start (the issue's bound), every stream of both phases ends whole ([DONE], the usage
counting every token), and a new request is answered afterwards. Writes
benchmarks/results/stalled_readers.json.

    .venv/bin/python benchmarks/stalled_readers.py
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import urlparse

import httpx
import psutil

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, report  # noqa: E402

MODEL = "tiny-llama"
RECEIVE_BUFFER = 4096  # bytes: the client's socket, and what its reader holds before it stops reading
MEMORY_KINDS = {":frontend": "frontend", ":decode_pool": "decode_replica", "EngineCore": "engine", "Worker": "engine"}


def resident_memory() -> dict[str, int]:
    """Resident bytes by kind of serving process (MEMORY_KINDS)."""
    out: dict[str, int] = defaultdict(int)
    for p in psutil.process_iter():
        try:
            cmd = " ".join(p.cmdline())
            kind = next((k for marker, k in MEMORY_KINDS.items() if marker in cmd), None)
            if kind is not None:
                out[kind] += p.memory_info().rss
        except psutil.Error:
            continue
    return dict(out)


class StalledStream:
    """One streamed completion over a raw HTTP/1.1 connection whose reader takes at most RECEIVE_BUFFER
    bytes and then nothing until `read_to_end`."""

    def __init__(self, url: str, body: dict) -> None:
        self.url, self.body = urlparse(url), body
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.head = b""

    async def open(self) -> None:
        """Send the request and read until its first event."""
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (self.url.hostname, self.url.port))
        # limit: the reader stops taking bytes from the socket past 2 x limit.
        self.reader, self.writer = await asyncio.open_connection(sock=sock, limit=RECEIVE_BUFFER // 2)
        payload = json.dumps(self.body).encode()
        self.writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
            + payload
        )
        await self.writer.drain()
        while b"data: " not in self.head:
            piece = await self.reader.read(RECEIVE_BUFFER // 4)
            if not piece:
                raise RuntimeError(f"connection closed before the first event: {self.head[:300]!r}")
            self.head += piece

    async def read_to_end(self) -> str:
        """The response's events, de-chunked, once the client reads again."""
        rest = await self.reader.read()
        self.writer.close()
        raw = self.head + rest
        head, _, body = raw.partition(b"\r\n\r\n")
        if b"chunked" in head.lower():
            body = _dechunk(body)
        return body.decode(errors="replace")


def _dechunk(body: bytes) -> bytes:
    out, i = bytearray(), 0
    while i < len(body):
        end = body.find(b"\r\n", i)
        if end < 0:
            break
        size = int(body[i:end].split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += body[end + 2 : end + 2 + size]
        i = end + 2 + size + 2
    return bytes(out)


def outcome(text: str, max_tokens: int) -> str:
    """'done' (the usage event counts every token asked for, then [DONE]) or 'broken'."""
    events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    if events and events[-1] == "[DONE]":
        usage = [u for e in events[:-1] if (u := json.loads(e).get("usage"))]
        return "done" if usage and usage[-1]["completion_tokens"] == max_tokens else "broken"
    return "broken"


def body(max_tokens: int, seed: int) -> dict:
    return {
        "model": MODEL,
        "prompt": f"stalled reader {seed}",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "logprobs": 20,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def warm_phase(url: str, args) -> dict:
    streams = [StalledStream(url, body(args.max_tokens, i)) for i in range(args.streams)]
    before = resident_memory()

    async def read(s: StalledStream) -> str:
        await s.open()
        return await s.read_to_end()

    outcomes = [outcome(t, args.max_tokens) for t in await asyncio.gather(*map(read, streams))]
    after = resident_memory()
    return {
        "memory_before": before,
        "memory_after": after,
        "outcomes": {o: outcomes.count(o) for o in sorted(set(outcomes))},
    }


async def stall_phase(url: str, args) -> dict:
    streams = [StalledStream(url, body(args.max_tokens, i)) for i in range(args.streams)]
    await asyncio.gather(*(s.open() for s in streams))
    samples = []
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < args.stall_s:
        samples.append({"t_s": round(elapsed, 1), **resident_memory()})
        await asyncio.sleep(1.0)
    texts = await asyncio.gather(*(s.read_to_end() for s in streams))
    outcomes = [outcome(t, args.max_tokens) for t in texts]
    first = samples[0]
    growth = {
        kind: max(s.get(kind, 0) for s in samples) / first[kind] - 1
        for kind in ("frontend", "decode_replica", "engine")
    }
    return {
        "streams": args.streams,
        "stall_s": args.stall_s,
        "memory_samples": samples,
        "memory_growth": growth,
        "outcomes": {o: outcomes.count(o) for o in sorted(set(outcomes))},
    }


def problems(doc: dict) -> list[str]:
    wrong = []
    stall = doc["stall"]
    for kind in ("frontend", "decode_replica"):
        if stall["memory_growth"][kind] > 0.05:
            wrong.append(f"{kind} memory grew {stall['memory_growth'][kind]:.1%} during the stall (over 5%)")
    for phase in ("warm", "stall"):
        if set(doc[phase]["outcomes"]) != {"done"}:
            wrong.append(f"{phase} phase streams not whole: {doc[phase]['outcomes']}")
    if not doc["answers_after"]:
        wrong.append("no answer to a new request after the stall")
    return wrong


def markdown(doc: dict) -> str:
    stall, warm = doc["stall"], doc["warm"]
    kinds = ("frontend", "decode_replica", "engine")
    lines = [
        f"{stall['streams']} streams read as they come (warm), then {stall['streams']} alike not read for "
        f"{stall['stall_s']} s. Warm phase: "
        + ", ".join(
            f"{k} {warm['memory_before'][k] / 2**20:.0f} → {warm['memory_after'][k] / 2**20:.0f} MiB" for k in kinds
        )
        + f" ({warm['outcomes']}).",
        "",
        "| process | resident memory at the stall's start | largest during it | growth |",
        "|---|---|---|---|",
    ]
    first = stall["memory_samples"][0]
    for kind in kinds:
        peak = max(s.get(kind, 0) for s in stall["memory_samples"])
        growth = stall["memory_growth"][kind]
        lines.append(f"| {kind} | {first[kind] / 2**20:.0f} MiB | {peak / 2**20:.0f} MiB | {growth:+.1%} |")
    lines += [
        "",
        f"Stall phase outcomes: {stall['outcomes']}. A new request answered afterwards: {doc['answers_after']}.",
    ]
    if doc.get("problems"):
        lines += ["", "Problems: " + "; ".join(doc["problems"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--streams", type=int, default=100)
    p.add_argument("--max-tokens", type=int, default=300)
    p.add_argument("--stall-s", type=float, default=60.0)
    p.add_argument("--out", default=str(launch.RESULTS / "stalled_readers.json"))
    args = p.parse_args()
    launch.tiny_model()
    log = Path(args.out).with_suffix(".log")
    with launch.ours(launch.app_args("agg-cpu.yaml"), log) as url:
        warm = asyncio.run(warm_phase(url, args))
        stall = asyncio.run(stall_phase(url, args))
        answer = httpx.post(
            f"{url}/v1/completions", json={"model": MODEL, "prompt": "after", "max_tokens": 4}, timeout=60
        )
    doc = report.document(
        "stalled_readers",
        2,
        config={"receive_buffer_bytes": RECEIVE_BUFFER, "max_tokens": args.max_tokens, "logprobs": 20},
        warm=warm,
        stall=stall,
        answers_after=answer.status_code == 200 and len(answer.json()["choices"][0]["text"]) > 0,
    )
    doc["problems"] = problems(doc)
    report.write(args.out, doc, markdown)
    if doc["problems"]:
        sys.exit("stalled readers: " + "; ".join(doc["problems"]))


if __name__ == "__main__":
    main()
