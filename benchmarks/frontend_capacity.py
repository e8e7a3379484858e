"""Capacity of the serving layer itself: streamed tokens/s and CPU per token
and per request, by process, with engines that cost (almost) nothing, for
ours and two peers side by side.

Systems, each with `--replicas` simulated aggregated engines and one frontend:
- `ours-direct`, `ours-serve`: our app (`kind: sim` engines, H100 /
  Llama-3.1-8B roofline: their steps sleep) with `frontend.data_plane`
  direct or serve, behind HAProxy;
- `dynamo`: Dynamo 1.6.1's frontend (KV router) in front of its mocker,
  from a virtual environment of its own (`dynamo_peer.ensure_dynamo_mocker_venv`);
- `ray-serve-llm`: Ray Serve LLM 2.60's OpenAI app (ingress, router,
  `LLMServer`) behind HAProxy, its engine replaced by
  `benchmarks/peer_step_engine.py` (a lower bound of its replica cost).
A load generator of raw asyncio HTTP/1.1 (no JSON parsing of the stream: it
counts SSE events and checks each request's usage) keeps `c` streams open,
ISL 128 / OSL 256, one SSE event per token expected. For every process of the
serving path (HAProxy, frontend, engine replicas, Ray's own) the CPU it used
during the window, from the OS. Each round starts every system afresh, one at
a time; the next round runs them in reverse order.

    .venv/bin/python benchmarks/frontend_capacity.py --concurrency 16,64,256 --seconds 20
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, peers, process_cpu, report  # noqa: E402
from benchmarks.process_cpu import RAY_MARKERS  # noqa: E402
from deployments.ingress import stop_orphaned_haproxy  # noqa: E402


@dataclass(frozen=True)
class Target:
    """One system under load: where its completions endpoint is, the model name it serves, and the markers
    that sort its processes by kind (frontend, replicas, haproxy, ray; `other_app` is left out)."""

    system: str
    port: int
    path: str
    model: str
    markers: process_cpu.Markers


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
        body = json.dumps(
            {
                "model": self.model,
                "prompt": [self.rng.randrange(10, self.vocab) for _ in range(self.isl)],
                "max_tokens": self.osl,
                "temperature": 0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
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


def measure(target: Target, concurrency: int, seconds: float, args) -> dict:
    vocab = 500
    warm = Load("127.0.0.1", target.port, target.path, target.model, args.isl, args.osl, vocab, seed=1)
    asyncio.run(warm.run(min(concurrency, 16), 3))
    load = Load("127.0.0.1", target.port, target.path, target.model, args.isl, args.osl, vocab, seed=concurrency)
    me = os.getpid()
    before = process_cpu.snapshot(target.markers, exclude=me)
    my_before = sum(psutil.Process(me).cpu_times()[:2])
    wall = asyncio.run(load.run(concurrency, seconds))
    after = process_cpu.snapshot(target.markers, exclude=me)
    client_cpu = sum(psutil.Process(me).cpu_times()[:2]) - my_before
    cpu = process_cpu.spent(before, after)
    other_app = cpu.pop("other_app", 0.0)
    tokens, requests = max(load.tokens, 1), max(load.requests, 1)
    return {
        "concurrency": concurrency,
        "seconds": round(wall, 2),
        "requests": load.requests,
        "tokens": load.tokens,
        "outcomes": dict(load.outcomes),
        "events_per_token": round(load.events / tokens, 3),
        "tokens_per_s": round(load.tokens / wall, 1),
        "requests_per_s": round(load.requests / wall, 2),
        "cpu_s": {k: round(v, 2) for k, v in sorted(cpu.items())},
        "client_cpu_s": round(client_cpu, 2),
        "other_app_cpu_s": round(other_app, 2),
        "cpu_us_per_token": {k: round(1e6 * v / tokens, 1) for k, v in sorted(cpu.items())},
        "cpu_us_per_token_total": round(1e6 * sum(cpu.values()) / tokens, 1),
        "cpu_us_per_request": {k: round(1e6 * v / requests, 1) for k, v in sorted(cpu.items())},
        "serving_cores": round(sum(cpu.values()) / wall, 2),
        "tokens_per_s_per_serving_core": round(load.tokens / max(sum(cpu.values()), 1e-9), 1),
    }


@contextlib.contextmanager
def ours(planes: list[str], replicas: int) -> Iterator[list[Target]]:
    """Our aggregated app on `replicas` simulated engines, once per data plane, side by side in one Ray
    instance (each app's replicas count as `other_app` while the other is measured)."""
    port = launch.free_port()
    configs = {
        plane: launch.app_args(
            "disagg-sim.yaml",
            prefill_pool=None,
            decode_pool__replicas=replicas,
            frontend__max_in_flight=1024,
            frontend__max_ongoing_requests=2048,
            frontend__data_plane=plane,
        )
        for plane in planes
    }
    with launch.ours(configs, in_process=True, port=port, quiet=True):
        yield [
            Target(
                f"ours-{plane}",
                port,
                f"/{plane}/v1/completions",
                cfg.model.name,
                (
                    *((f"ServeReplica:{other}:", "other_app") for other in planes if other != plane),
                    (f"ServeReplica:{plane}:frontend", "frontend"),
                    (f"ServeReplica:{plane}:decode_pool", "replicas"),
                    *RAY_MARKERS,
                ),
            )
            for plane, cfg in configs.items()
        ]


@contextlib.contextmanager
def dynamo(model: str, replicas: int, log: Path) -> Iterator[list[Target]]:
    """Dynamo's frontend (KV router) in front of its mocker simulating `replicas` engines."""
    from benchmarks.dynamo_peer import dynamo_mocker

    with dynamo_mocker(model, replicas, block_size=16, log=log) as base:
        yield [
            Target(
                "dynamo",
                int(base.rsplit(":", 1)[1]),
                "/v1/completions",
                model,
                (("dynamo.frontend", "frontend"), ("dynamo.mocker", "replicas")),
            )
        ]


@contextlib.contextmanager
def ray_serve_llm(model: str, replicas: int, log: Path) -> Iterator[list[Target]]:
    """Ray Serve LLM's OpenAI app (ingress, router, LLMServer) on `replicas` step engines."""
    with peers.ray_serve_llm_step_engines(model, replicas, log) as base:
        yield [
            Target(
                "ray-serve-llm",
                int(base.rsplit(":", 1)[1]),
                "/v1/completions",
                model,
                (
                    ("ServeReplica:default:OpenAiIngress", "frontend"),
                    ("ServeReplica:default:LLMServer", "replicas"),
                    *RAY_MARKERS,
                ),
            )
        ]


SYSTEMS = ["ours-direct", "ours-serve", "dynamo", "ray-serve-llm"]


def launchers(systems: list[str], replicas: int, log: Path) -> list:
    """One launcher per process group to start: ours (all its data planes at once), Dynamo, Ray Serve LLM."""
    model = launch.app_args("disagg-sim.yaml").model.name
    planes = [s.removeprefix("ours-") for s in systems if s.startswith("ours-")]
    out = []
    if planes:
        out.append(lambda: ours(planes, replicas))
    if "dynamo" in systems:
        out.append(lambda: dynamo(model, replicas, log))
    if "ray-serve-llm" in systems:
        out.append(lambda: ray_serve_llm(model, replicas, log))
    return out


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[16, 64, 256])
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--isl", type=int, default=128)
    p.add_argument("--osl", type=int, default=256)
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"a subset of {SYSTEMS}")
    p.add_argument("--out", default=str(launch.RESULTS / "frontend_capacity.json"))
    args = p.parse_args()
    systems = args.systems.split(",")
    if unknown := set(systems) - set(SYSTEMS):
        p.error(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")
    launch.tiny_model()
    stop_orphaned_haproxy()
    log = Path(args.out).with_suffix(".log")
    log.unlink(missing_ok=True)
    rows = []
    blocks = launchers(systems, args.replicas, log)
    for rnd in range(args.rounds):
        for start in blocks if rnd % 2 == 0 else blocks[::-1]:  # rounds interleaved, the order reversed
            with start() as targets:
                for c in args.concurrency:
                    for target in targets if rnd % 2 == 0 else targets[::-1]:
                        row = {"system": target.system, "round": rnd, **measure(target, c, args.seconds, args)}
                        print(json.dumps(row), flush=True)
                        rows.append(row)
    log.unlink(missing_ok=True)
    doc = {
        "benchmark": "frontend_capacity",
        "version": 2,
        "machine": report.machine(),
        "setup": {
            "engines": f"{args.replicas} simulated aggregated engines per system: ours `kind: sim` (H100, "
            "Llama-3.1-8B roofline); Dynamo 1.6.1's mocker (its default timing model); Ray Serve "
            "LLM 2.60's LLMServer on benchmarks/peer_step_engine.py (one token per 5 ms step)",
            "frontends": 1,
            "ingress": "HAProxy for ours and Ray Serve LLM; Dynamo's own HTTP frontend",
            "isl": args.isl,
            "osl": args.osl,
            "client": "raw asyncio HTTP/1.1, closed loop, SSE events counted, usage checked",
            "cpu": "user+system seconds per process from the OS over each window, summed by kind",
        },
        "rows": rows,
    }
    report.write_json(args.out, doc)


if __name__ == "__main__":
    main()
