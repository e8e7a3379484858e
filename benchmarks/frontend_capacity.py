"""Capacity of the serving layer itself: streamed tokens/s and CPU per token
and per request, by process, with engines that cost (almost) nothing.

Setup: our aggregated app with `--replicas` simulated engines (`kind: sim`,
H100 / Llama-3.1-8B roofline: their steps sleep, they spend little CPU),
one frontend, HAProxy ingress. A load generator of raw asyncio HTTP/1.1 (no
JSON parsing of the stream: it counts SSE events and checks each request's
usage) keeps `c` streams open, ISL 128 / OSL 256, one SSE event per token
expected. For every process of the serving path (HAProxy, frontend, pool
replicas, Ray's own) the CPU it used during the window, from the OS.

    .venv/bin/python benchmarks/frontend_capacity.py --concurrency 16,64,256 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import time
from collections import Counter
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import peers  # noqa: E402
from deployments.ingress import ingress_env, stop_orphaned_haproxy  # noqa: E402
from orchestrator.tiny_model import make_tiny_model  # noqa: E402



def process_kind(p: psutil.Process, app: str) -> str | None:
    """Which part of `app`'s serving path a process is, by its command line;
    the other app's replicas count apart, as `other_app`."""
    try:
        cmd = " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    if "ServeReplica:" in cmd and f"ServeReplica:{app}:" not in cmd:
        return "other_app"
    for marker, kind in (("haproxy", "haproxy"), (":frontend", "frontend"), (":decode_pool", "replicas"),
                         (":prefill_pool", "replicas"), ("raylet", "ray"), ("gcs_server", "ray"), ("ray::", "ray"),
                         ("ray/", "ray")):
        if marker in cmd:
            return kind
    return None


def cpu_by_kind(me: int, app: str) -> dict[int, tuple[str, float]]:
    out = {}
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        kind = process_kind(p, app)
        if kind is not None:
            try:
                t = p.cpu_times()
                out[p.pid] = (kind, t.user + t.system)
            except psutil.NoSuchProcess:
                pass
    return out


class Load:
    """c closed-loop streams over raw HTTP/1.1 keep-alive connections."""

    def __init__(self, host: str, port: int, path: str, model: str, isl: int, osl: int, vocab: int, seed: int):
        self.host, self.port, self.path, self.model = host, port, path, model
        self.isl, self.osl, self.vocab = isl, osl, vocab
        self.rng = random.Random(seed)
        self.outcomes: Counter = Counter()
        self.events = 0
        self.tokens = 0
        self.requests = 0

    def _request(self) -> bytes:
        body = json.dumps({"model": self.model, "prompt": [self.rng.randrange(10, self.vocab) for _ in range(self.isl)],
                           "max_tokens": self.osl, "temperature": 0, "ignore_eos": True, "stream": True,
                           "stream_options": {"include_usage": True}}).encode()
        head = (f"POST {self.path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        return head + body

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(self._request())
        status = (await reader.readline()).split(b" ", 2)[1]
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        if status != b"200":
            self.outcomes[f"http_{status.decode()}"] += 1
            raise ConnectionError  # the body's framing is not ours to parse: reconnect
        events, tail = 0, b""
        while True:  # chunked transfer encoding
            size = int((await reader.readline()).strip(), 16)
            if size == 0:
                await reader.readline()
                break
            data = await reader.readexactly(size + 2)
            events += data.count(b"data: ")
            tail = (tail + data)[-600:]
        usage = tail.rsplit(b'"completion_tokens":', 1)
        tokens = int(usage[1].split(b",", 1)[0]) if len(usage) == 2 else 0
        self.outcomes["ok" if tokens == self.osl else "short"] += 1
        self.events += events - 2  # the usage event and [DONE] carry no token
        self.tokens += tokens
        self.requests += 1

    async def stream(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
                while time.monotonic() < deadline:
                    await self._one(reader, writer)
                writer.close()
            except (ConnectionError, asyncio.IncompleteReadError, ValueError, IndexError):
                self.outcomes["reconnect"] += 1

    async def run(self, concurrency: int, seconds: float) -> float:
        deadline = time.monotonic() + seconds
        start = time.monotonic()
        await asyncio.gather(*(self.stream(deadline) for _ in range(concurrency)))
        return time.monotonic() - start


def measure(port: int, app: str, model: str, concurrency: int, seconds: float, args) -> dict:
    vocab = 500
    warm = Load("127.0.0.1", port, f"/{app}/v1/completions", model, args.isl, args.osl, vocab, seed=1)
    asyncio.run(warm.run(min(concurrency, 16), 3))
    load = Load("127.0.0.1", port, f"/{app}/v1/completions", model, args.isl, args.osl, vocab, seed=concurrency)
    me = os.getpid()
    before = cpu_by_kind(me, app)
    my_before = sum(psutil.Process(me).cpu_times()[:2])
    wall = asyncio.run(load.run(concurrency, seconds))
    after = cpu_by_kind(me, app)
    client_cpu = sum(psutil.Process(me).cpu_times()[:2]) - my_before
    cpu: Counter = Counter()
    for pid, (kind, t) in after.items():
        cpu[kind] += t - before.get(pid, (kind, 0.0))[1]
    other_app = cpu.pop("other_app", 0.0)
    tokens, requests = max(load.tokens, 1), max(load.requests, 1)
    return {
        "concurrency": concurrency, "seconds": round(wall, 2), "requests": load.requests, "tokens": load.tokens,
        "outcomes": dict(load.outcomes), "events_per_token": round(load.events / tokens, 3),
        "tokens_per_s": round(load.tokens / wall, 1), "requests_per_s": round(load.requests / wall, 2),
        "cpu_s": {k: round(v, 2) for k, v in sorted(cpu.items())}, "client_cpu_s": round(client_cpu, 2),
        "other_app_cpu_s": round(other_app, 2),
        "cpu_us_per_token": {k: round(1e6 * v / tokens, 1) for k, v in sorted(cpu.items())},
        "cpu_us_per_token_total": round(1e6 * sum(cpu.values()) / tokens, 1),
        "cpu_us_per_request": {k: round(1e6 * v / requests, 1) for k, v in sorted(cpu.items())},
        "serving_cores": round(sum(cpu.values()) / wall, 2),
        "tokens_per_s_per_serving_core": round(load.tokens / max(sum(cpu.values()), 1e-9), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64, 256])
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--isl", type=int, default=128)
    p.add_argument("--osl", type=int, default=256)
    p.add_argument("--data-planes", default="direct,serve", help="ours with these frontend.data_plane values")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "frontend_capacity.json"))
    args = p.parse_args()
    os.environ.update(ingress_env())  # before Ray starts: its processes inherit it
    make_tiny_model(peers.MODEL_DIR)
    import ray
    from ray import serve

    from deployments.app import build_app

    port = peers.free_port()
    ray.init(address="local", num_cpus=8, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    planes = args.data_planes.split(",")
    configs = {plane: peers.app_args("disagg-sim.yaml", prefill_pool=None, decode_pool__replicas=args.replicas,
                                     frontend__max_in_flight=1024, frontend__max_ongoing_requests=2048,
                                     frontend__data_plane=plane) for plane in planes}
    serve.run_many([serve.RunTarget(build_app(cfg), name=plane, route_prefix=f"/{plane}")
                    for plane, cfg in configs.items()])
    model = configs[planes[0]].model.name
    rows = []
    for rnd in range(args.rounds):
        for c in args.concurrency:
            for plane in (planes if rnd % 2 == 0 else planes[::-1]):
                row = {"data_plane": plane, "round": rnd, **measure(port, plane, model, c, args.seconds, args)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    serve.shutdown()
    ray.shutdown()
    stop_orphaned_haproxy()
    doc = {
        "benchmark": "frontend_capacity", "version": 1,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "setup": {"engines": f"{args.replicas} simulated aggregated replicas (H100, Llama-3.1-8B roofline)",
                  "frontends": 1, "ingress": "HAProxy", "isl": args.isl, "osl": args.osl,
                  "client": "raw asyncio HTTP/1.1, closed loop, SSE events counted, usage checked",
                  "cpu": "user+system seconds per process from the OS over each window, summed by kind"},
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
