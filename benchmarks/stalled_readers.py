"""Clients that stop reading (issue 35): what they cost the serving processes' memory and the engine.

On the aggregated CPU app (configs/agg-cpu.yaml, HAProxy in front), for each of `--modes`, its own app
(`park`: the shipped `frontend.stalled_readers`; `no-park`: `park: false`), two loads, each twice:

  short    `--streams` (100) streamed completions of `--max-tokens` (300) tokens: the issue's run
  long     `--long-streams` (4) of `--long-n` (8) choices of `--long-max-tokens` (2,000) tokens each: more
           than the sockets between the frontend and a client hold (~11 MB of events a request; the kernel
           here lets a socket buffer 4 MB sent and 32 MB received)

every one greedy (ignore_eos, 20 top logprobs a token: ~0.7 KB an event). First `read`: the streams read as
they come (the kernel's socket buffer, 1 MiB reads). Then `stall`: the same requests again, each from a raw
socket with a 4 KiB receive buffer that reads its headers and first event, then nothing for `--stall-s` (60)
s, then reads to the end. The resident memory of the frontend replica, the decode replica and its engine
processes is sampled every second in both.

The frontend's writes to a client wait for it (Serve's direct ingress hands the app uvicorn's `send`, which
waits while the connection's buffer is past its mark), once the sockets and HAProxy's buffers are full. A
parked stream's engine request is aborted once a chunk arrives `park_after_s` after its reader last took
one, and is continued when the client reads again; without parking it is generated to its end and what the
sockets do not hold waits in the frontend.

The growth of a load's stall is its largest sample over the largest sample of the same load read as it came.
Each run records the engine streams parked and continued (`orchestrator_parked_streams_total`) and whether
each stalled stream's text equals the same request's read as it came. The run fails unless, with parking, the
frontend's and the decode replica's memory stay within 5% (the issue's bound) on both loads, streams of the
stalled long load were parked and continued, and no stream read as it came was; and, in every mode, every
stream ends whole ([DONE], the usage counting every token) and a new request is answered afterwards. Writes
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
FAST_READ = 1 << 20  # bytes a reader that reads as events come takes at a time
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
    bytes and then nothing until `read_to_end`; `stalls` False: a reader with the kernel's own socket buffer,
    taking what it gets (FAST_READ bytes at a time) from the first event to the end."""

    def __init__(self, url: str, body: dict, stalls: bool = True) -> None:
        self.url, self.body, self.stalls = urlparse(url), body, stalls
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.head = b""

    async def open(self) -> None:
        """Send the request and read until its first event."""
        sock = socket.socket()
        if self.stalls:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (self.url.hostname, self.url.port))
        # limit: the reader stops taking bytes from the socket past 2 x limit.
        limit = RECEIVE_BUFFER // 2 if self.stalls else FAST_READ
        self.reader, self.writer = await asyncio.open_connection(sock=sock, limit=limit)
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


def outcome(text: str, tokens: int) -> str:
    """'done' (the usage event counts every token asked for, then [DONE]) or 'broken'."""
    events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    if events and events[-1] == "[DONE]":
        usage = [u for e in events[:-1] if (u := json.loads(e).get("usage"))]
        return "done" if usage and usage[-1]["completion_tokens"] == tokens else "broken"
    return "broken"


def answer_texts(text: str) -> dict[int, str]:
    """Each choice's text, its events' pieces joined."""
    events = [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]
    texts: dict[int, str] = defaultdict(str)
    for e in events:
        if e != "[DONE]":
            for c in json.loads(e).get("choices", []):
                texts[c["index"]] += c["text"]
    return dict(texts)


def body(max_tokens: int, n: int, seed: int) -> dict:
    return {
        "model": MODEL,
        "prompt": f"stalled reader {seed}",
        "max_tokens": max_tokens,
        "n": n,
        "ignore_eos": True,
        "logprobs": 20,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


PARKED = {"orchestrator_parked_streams_total": ()}


def parked(url: str) -> float:
    """Streams parked and continued (counted when continued: their client read again)."""
    return launch.counters(url, PARKED).get("orchestrator_parked_streams_total", 0.0)


async def sampled(work, samples: list[dict]):
    """`work`'s result, the serving processes' memory sampled every second meanwhile."""
    task = asyncio.ensure_future(work)
    started = time.monotonic()
    while not task.done():
        samples.append({"t_s": round(time.monotonic() - started, 1), **resident_memory()})
        await asyncio.wait({task}, timeout=1.0)
    return task.result()


async def read_phase(url: str, n: int, max_tokens: int, choices: int) -> tuple[dict, list[dict[int, str]]]:
    async def read(s: StalledStream) -> str:
        await s.open()
        return await s.read_to_end()

    samples: list[dict] = []
    before = parked(url)
    streams = [StalledStream(url, body(max_tokens, choices, i), stalls=False) for i in range(n)]
    texts = await sampled(asyncio.gather(*map(read, streams)), samples)
    outcomes = [outcome(t, max_tokens * choices) for t in texts]
    phase = {
        "memory_samples": samples,
        "parked_streams": parked(url) - before,
        "outcomes": {o: outcomes.count(o) for o in sorted(set(outcomes))},
    }
    return phase, [answer_texts(t) for t in texts]


async def stall_phase(
    url: str, n: int, max_tokens: int, choices: int, stall_s: float, read_texts: list[dict[int, str]]
) -> dict:
    streams = [StalledStream(url, body(max_tokens, choices, i)) for i in range(n)]
    before = parked(url)
    samples: list[dict] = []

    async def stall() -> list[str]:
        await asyncio.gather(*(s.open() for s in streams))
        await asyncio.sleep(stall_s)
        return await asyncio.gather(*(s.read_to_end() for s in streams))

    texts = await sampled(stall(), samples)
    outcomes = [outcome(t, max_tokens * choices) for t in texts]
    return {
        "memory_samples": samples,
        "parked_streams": parked(url) - before,
        "same_text_as_read": sum(answer_texts(t) == r for t, r in zip(texts, read_texts)),
        "outcomes": {o: outcomes.count(o) for o in sorted(set(outcomes))},
    }


KINDS = ("frontend", "decode_replica", "engine")


def peak(samples: list[dict], kind: str) -> int:
    return max(s.get(kind, 0) for s in samples)


def growth(load: dict) -> dict[str, float]:
    """Each process kind's largest sample in the stall over its largest reading the same load as it came."""
    return {k: peak(load["stall"]["memory_samples"], k) / peak(load["read"]["memory_samples"], k) - 1 for k in KINDS}


async def run_load(url: str, n: int, max_tokens: int, choices: int, stall_s: float) -> dict:
    read, texts = await read_phase(url, n, max_tokens, choices)
    stall = await stall_phase(url, n, max_tokens, choices, stall_s, texts)
    load = {"streams": n, "choices": choices, "max_tokens": max_tokens, "stall_s": stall_s}
    load |= {"read": read, "stall": stall}
    load["memory_growth"] = growth(load)
    return load


def problems(mode: str, run: dict) -> list[str]:
    wrong = []
    for name, load in run["loads"].items():
        read, stall = load["read"], load["stall"]
        if mode == "park":
            for kind in ("frontend", "decode_replica"):
                if load["memory_growth"][kind] > 0.05:
                    wrong.append(f"{name}: {kind} memory {load['memory_growth'][kind]:+.1%} (over 5%)")
            if read["parked_streams"]:
                wrong.append(f"{name}: {read['parked_streams']:.0f} streams read as they came were parked")
            if name == "long" and not stall["parked_streams"]:
                wrong.append(f"{name}: no stalled engine stream parked")
        elif stall["parked_streams"] or read["parked_streams"]:
            wrong.append(f"{name}: streams parked with parking off")
        for phase in ("read", "stall"):
            if set(load[phase]["outcomes"]) != {"done"}:
                wrong.append(f"{name}: {phase} streams not whole: {load[phase]['outcomes']}")
    if not run["answers_after"]:
        wrong.append("no answer to a new request after the stalls")
    return [f"{mode}: {w}" for w in wrong]


def markdown(doc: dict) -> str:
    lines = [
        "| mode | load | process | largest reading as they came | largest stalled | growth |",
        "|---|---|---|---|---|---|",
    ]
    for mode, run in doc["modes"].items():
        for name, load in run["loads"].items():
            for kind in KINDS:
                read = peak(load["read"]["memory_samples"], kind) / 2**20
                stall = peak(load["stall"]["memory_samples"], kind) / 2**20
                growth_ = load["memory_growth"][kind]
                lines.append(f"| {mode} | {name} | {kind} | {read:.0f} MiB | {stall:.0f} MiB | {growth_:+.1%} |")
    lines.append("")
    for mode, run in doc["modes"].items():
        for name, load in run["loads"].items():
            stall = load["stall"]
            lines.append(
                f"- {mode}, {name} ({load['streams']} streams of {load['choices']} x {load['max_tokens']} tokens, "
                "unread "
                f"{load['stall_s']:.0f} s): engine streams parked and continued "
                f"{stall['parked_streams']:.0f} (read as they came: {load['read']['parked_streams']:.0f}); outcomes "
                f"{stall['outcomes']}; text equal to the same "
                f"request read as it came: {stall['same_text_as_read']} of {load['streams']}"
            )
        lines.append(f"- {mode}: a new request answered afterwards: {run['answers_after']}")
    if doc.get("problems"):
        lines += ["", "Problems: " + "; ".join(doc["problems"])]
    return "\n".join(lines) + "\n"


MODES = {"park": True, "no-park": False}


def run_mode(park: bool, args, log: Path) -> dict:
    app = launch.app_args("agg-cpu.yaml", frontend__stalled_readers__park=park)
    sizes = {
        "short": (args.streams, args.max_tokens, 1),
        "long": (args.long_streams, args.long_max_tokens, args.long_n),
    }
    with launch.ours(app, log) as url:
        loads = {
            name: asyncio.run(run_load(url, n, tokens, choices, args.stall_s))
            for name, (n, tokens, choices) in sizes.items()
        }
        answer = httpx.post(
            f"{url}/v1/completions", json={"model": MODEL, "prompt": "after", "max_tokens": 4}, timeout=60
        )
    return {"loads": loads, "answers_after": answer.status_code == 200 and len(answer.json()["choices"][0]["text"]) > 0}


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--modes", default="park,no-park")
    p.add_argument("--streams", type=int, default=100)
    p.add_argument("--max-tokens", type=int, default=300)
    p.add_argument("--long-streams", type=int, default=4)
    p.add_argument("--long-max-tokens", type=int, default=2000)
    p.add_argument("--long-n", type=int, default=8, help="long: choices a request (n): events of 8 streams a socket")
    p.add_argument("--stall-s", type=float, default=60.0)
    p.add_argument("--out", default=str(launch.RESULTS / "stalled_readers.json"))
    args = p.parse_args()
    launch.tiny_model()
    modes = {}
    for mode in args.modes.split(","):
        modes[mode] = run_mode(MODES[mode], args, Path(args.out).with_suffix(f".{mode}.log"))
        print(mode, {n: load["memory_growth"] for n, load in modes[mode]["loads"].items()}, flush=True)
    doc = report.document(
        "stalled_readers", 3, config={"receive_buffer_bytes": RECEIVE_BUFFER, "logprobs": 20}, modes=modes
    )
    doc["problems"] = [w for mode, run in modes.items() for w in problems(mode, run)]
    report.write(args.out, doc, markdown)
    if doc["problems"]:
        sys.exit("stalled readers: " + "; ".join(doc["problems"]))


if __name__ == "__main__":
    main()
