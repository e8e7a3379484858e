"""Overload soak: the disaggregated CPU app (HAProxy ingress, as the main
job) offered 2x and then 5x the request rate of its measured knee, each for
a bounded time, loopback only, streamed requests, memory sampled.

Pass criteria per phase (printed and written to benchmarks/results/soak.json):
  * every request is answered (200, every token) or turned away with 429 +
    Retry-After; nothing else (lost = any other outcome): lost must be 0;
  * rejections come back fast: p99 of a 429's latency <= 100 ms;
  * nothing queues before admission: the client's in-flight count never
    exceeds 2x the frontend's admission limit;
  * the answered requests' TTFT p99 is no worse than at the knee;
  * memory is flat: within 5% from 30 s on (once the KV pages are touched).

The knee comes from a short concurrency sweep with the harness (or --knee-rps),
run with an admission limit above every level of the sweep. The overload
phases then run on a fresh app whose admission limit is the knee's
concurrency (or --max-in-flight): admitting more than the engines serve at
their knee only moves the queue from the door into the engines, where it
costs every admitted request its TTFT. That app first serves
KV_WARMUP_REQUESTS requests at the limit, so that its engines' KV pages are
touched before memory is watched.

    .venv/bin/python benchmarks/soak.py --minutes 5 --factors 2,5
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import psutil

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, report  # noqa: E402
from tools.bench import hardware, sweep  # noqa: E402
from tools.bench_stats import parse_slo  # noqa: E402
from tools.runner import Target, run_concurrency  # noqa: E402
from tools.workloads import LengthDist, SyntheticWorkload, TokenPool  # noqa: E402

# The admission limit while the knee is measured: above every level of the sweep.
SWEEP_ADMISSION_LIMIT = 256
# Requests run on the overload phases' fresh app before they start: more than the sweep's (6 levels x 48),
# which left the first app's memory flat afterwards.
KV_WARMUP_REQUESTS = 400

KINDS = (
    "gcs_server",
    "raylet",
    "dashboard",
    "ServeController",
    "ProxyActor",
    "frontend",
    "prefill_pool",
    "decode_pool",
    "VLLM::EngineCore",
    "VLLM::Worker",
    "serve run",
)


def _kind(cmd: str, name: str) -> str | None:
    if not any(k in cmd or k in name for k in ("ray::", "raylet", "gcs_server", "VLLM::", "serve run", "dashboard")):
        return None
    return next((k for k in KINDS if k in cmd or k in name), "other ray")


def app_memory_mib() -> tuple[float, dict[str, float]]:
    """Resident memory of every Ray, Serve and engine process on the machine:
    the total and by kind of process."""
    by_kind: Counter = Counter()
    for p in psutil.process_iter(["name", "cmdline", "memory_info"]):
        kind = _kind(" ".join(p.info["cmdline"] or []), p.info["name"] or "")
        if kind is not None and p.info["memory_info"]:
            by_kind[kind] += p.info["memory_info"].rss / 2**20
    return sum(by_kind.values()), dict(by_kind)


async def offered_load(url: str, model: str, specs, rate: float, seconds: float, samples: list) -> dict:
    """Open-loop Poisson-free arrivals at `rate` for `seconds`, each a streamed
    request: answered (200, every token), rejected (429 with Retry-After) or
    lost (anything else). Records each answer's TTFT, each rejection's
    latency and, every second, the client's in-flight count and the app's memory."""
    outcomes: Counter = Counter()
    ttft: list[float] = []
    rejected_s: list[float] = []
    in_flight = {"now": 0, "max": 0}
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:

        async def one(spec):
            start = time.perf_counter()
            in_flight["now"] += 1
            in_flight["max"] = max(in_flight["max"], in_flight["now"])
            try:
                body = {
                    "model": model,
                    "prompt": list(spec.prompt_token_ids),
                    "max_tokens": spec.max_tokens,
                    "temperature": 0,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
                    if r.status_code == 429:
                        await r.aread()
                        rejected_s.append(time.perf_counter() - start)
                        outcomes["rejected_429" if "retry-after" in r.headers else "lost_429_without_retry_after"] += 1
                        return
                    if r.status_code != 200:
                        await r.aread()
                        outcomes[f"lost_http_{r.status_code}"] += 1
                        return
                    first, tail = None, ""
                    async for text in r.aiter_text():
                        if first is None and '"text":"' in text:
                            first = time.perf_counter() - start
                        tail = (tail + text)[-2000:]
                done = f'"completion_tokens":{spec.max_tokens},' in tail and "[DONE]" in tail
                outcomes["answered" if done else "lost_incomplete"] += 1
                if done and first is not None:
                    ttft.append(first)
            except httpx.HTTPError as e:
                outcomes[f"lost_{type(e).__name__}"] += 1
            finally:
                in_flight["now"] -= 1

        start = time.monotonic()
        tasks, i = [], 0
        next_sample = start
        while time.monotonic() - start < seconds:
            tasks.append(asyncio.create_task(one(specs[i % len(specs)])))
            i += 1
            if time.monotonic() >= next_sample:
                total, by_kind = app_memory_mib()
                samples.append((round(time.monotonic() - start, 1), round(total, 1), in_flight["now"], by_kind))
                next_sample += 1
            await asyncio.sleep(1.0 / rate)
        await asyncio.gather(*tasks)
    outcomes["sent"] = i
    return {"outcomes": outcomes, "ttft_s": ttft, "rejected_s": rejected_s, "in_flight_max": in_flight["max"]}


def _p(values: list[float], q: float) -> float | None:
    return round(1000 * float(np.percentile(values, q)), 1) if values else None


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--minutes", type=float, default=5, help="per overload factor")
    p.add_argument(
        "--factors",
        type=lambda v: [float(x) for x in v.split(",")],
        default=[2.0, 5.0],
        help="offered rates, as multiples of the knee's",
    )
    p.add_argument("--knee-rps", type=float, help="skip the sweep and take this as the knee's request rate")
    p.add_argument(
        "--max-in-flight",
        type=int,
        help="the frontend's admission limit in the overload phases (default: the knee's concurrency)",
    )
    p.add_argument("--out", default=str(launch.RESULTS / "soak.json"))
    args = p.parse_args()
    pool = TokenPool.vocabulary(len(launch.tiny_model()))
    workload = SyntheticWorkload(LengthDist(512, 128, min=64, max=1024), LengthDist(32), pool, seed=5)
    specs = workload.requests(4000)
    log = Path(args.out).with_suffix(".log")
    levels = [1, 4, 8, 16, 32, 48]
    with launch.ours(launch.app_args("disagg-cpu.yaml", frontend__max_in_flight=SWEEP_ADMISSION_LIMIT), log) as url:
        points = asyncio.run(
            sweep(
                Target(url, "tiny-llama"),
                lambda n, off: specs[off : off + n],
                levels,
                lambda c: 48,
                parse_slo([]),
                max(levels),
            )
        )
    best = max(points, key=lambda pt: pt.result.request_throughput)
    knee_rps = args.knee_rps or best.result.request_throughput
    knee_ttft_p99 = best.result.ttft_ms["p99"]
    limit = args.max_in_flight or best.concurrency
    phases = []
    with launch.ours(launch.app_args("disagg-cpu.yaml", frontend__max_in_flight=limit), log) as url:
        # The fresh engines' KV pages are touched before memory is watched, as the sweep touched the first's.
        asyncio.run(run_concurrency(Target(url, "tiny-llama"), specs[:KV_WARMUP_REQUESTS], limit))
        for factor in args.factors:
            rate = factor * knee_rps
            print(
                f"knee {knee_rps:.2f} req/s at concurrency {best.concurrency}; admission limit {limit}; "
                f"offering {rate:.2f} req/s ({factor}x) for {args.minutes} min",
                flush=True,
            )
            samples: list = []
            run = asyncio.run(offered_load(url, "tiny-llama", specs, rate, args.minutes * 60, samples))
            phases.append(_phase(factor, rate, run, samples, limit, knee_ttft_p99))
            print(json.dumps({k: v for k, v in phases[-1].items() if k != "samples"}), flush=True)
    doc = {
        "benchmark": "soak",
        "version": 2,
        "hardware": hardware(),
        "config": "configs/disagg-cpu.yaml",
        "ingress": "HAProxy (RAY_SERVE_ENABLE_HA_PROXY=1)",
        "max_in_flight": limit,
        "knee_concurrency": best.concurrency,
        "knee_rps": knee_rps,
        "knee_ttft_p99_ms": knee_ttft_p99,
        "minutes_per_phase": args.minutes,
        "phases": phases,
    }
    doc["pass"] = all(ph["pass"] for ph in phases)
    report.write_json(args.out, doc)
    print(
        json.dumps(
            {"pass": doc["pass"], "phases": [{k: v for k, v in ph.items() if k != "samples"} for ph in phases]},
            indent=2,
        )
    )


def _phase(factor: float, rate: float, run: dict, samples: list, limit: int, knee_ttft_p99_ms: float) -> dict:
    """One overload phase against its targets: 0 lost, 429s within 100 ms at
    p99, client in-flight at most 2x the admission limit, answered TTFT p99 no
    worse than at the knee, memory within 5% once the KV pages are touched
    (measured from 30 s on)."""
    warm = [x for x in samples if x[0] >= 30] or samples
    memory = [x[1] for x in warm]
    first, last = warm[0][3], warm[-1][3]
    lost = sum(v for k, v in run["outcomes"].items() if k.startswith("lost"))
    phase = {
        "factor": factor,
        "offered_rps": round(rate, 2),
        "outcomes": dict(run["outcomes"]),
        "lost": lost,
        "rejection_ms": {"p50": _p(run["rejected_s"], 50), "p99": _p(run["rejected_s"], 99)},
        "answered_ttft_ms": {"p50": _p(run["ttft_s"], 50), "p99": _p(run["ttft_s"], 99)},
        "in_flight_client_max": run["in_flight_max"],
        "memory_mib": {
            "after_warmup": memory[0],
            "end": memory[-1],
            "max": max(memory),
            "growth": round(memory[-1] / memory[0] - 1, 4),
        },
        "memory_by_process_mib": {
            k: {"after_warmup": round(first.get(k, 0.0), 1), "end": round(last.get(k, 0.0), 1)}
            for k in sorted(set(first) | set(last))
        },
        "samples": [{"t_s": t, "memory_mib": m, "in_flight_client": q} for t, m, q, _ in samples],
    }
    rejection_p99 = phase["rejection_ms"]["p99"]
    ttft_p99 = phase["answered_ttft_ms"]["p99"]
    phase["checks"] = {
        "lost_0": lost == 0,
        "rejection_p99_le_100ms": rejection_p99 is None or rejection_p99 <= 100,
        "in_flight_le_2x_limit": run["in_flight_max"] <= 2 * limit,
        "answered_ttft_p99_le_knee": ttft_p99 is not None and ttft_p99 <= knee_ttft_p99_ms,
        "memory_within_5pct": abs(phase["memory_mib"]["growth"]) <= 0.05,
    }
    phase["pass"] = all(phase["checks"].values())
    return phase


if __name__ == "__main__":
    main()
