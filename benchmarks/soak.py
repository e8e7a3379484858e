"""Overload soak: the disaggregated CPU app offered twice the request rate of
its measured knee for a bounded time, loopback only, memory sampled.

Pass criteria (printed and written to benchmarks/results/soak.json):
  * every request is answered (200) or turned away with 429 + Retry-After;
    nothing else (lost = any other outcome) — lost must be 0;
  * memory is flat: the total resident memory of the app's processes at the
    end is within 10% of its level after warm-up (no growth with the queue).

The knee comes from a short concurrency sweep with the harness (or --knee-rps).

    .venv/bin/python benchmarks/soak.py --minutes 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import peers  # noqa: E402
from harness.bench import hardware, sweep  # noqa: E402
from harness.metrics import parse_slo  # noqa: E402
from harness.runner import Target  # noqa: E402
from harness.workloads import LengthDist, SyntheticWorkload, TokenPool  # noqa: E402
from orchestrator.prompts import load_tokenizer  # noqa: E402
from orchestrator.tiny_model import make_tiny_model  # noqa: E402


KINDS = ("gcs_server", "raylet", "dashboard", "ServeController", "ProxyActor", "frontend", "prefill_pool",
         "decode_pool", "VLLM::EngineCore", "VLLM::Worker", "serve run")


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


async def offered_load(url: str, model: str, specs, rate: float, seconds: float, samples: list) -> Counter:
    outcomes: Counter = Counter()
    limits = httpx.Limits(max_connections=2048, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        async def one(spec):
            try:
                r = await client.post(f"{url}/v1/completions", json={
                    "model": model, "prompt": list(spec.prompt_token_ids), "max_tokens": spec.max_tokens,
                    "temperature": 0, "ignore_eos": True})
                if r.status_code == 429 and "retry-after" in r.headers:
                    outcomes["rejected_429"] += 1
                elif r.status_code == 200 and r.json()["usage"]["completion_tokens"] == spec.max_tokens:
                    outcomes["answered"] += 1
                else:
                    outcomes[f"lost_http_{r.status_code}"] += 1
            except httpx.HTTPError as e:
                outcomes[f"lost_{type(e).__name__}"] += 1

        start = time.monotonic()
        tasks, i = [], 0
        next_sample = start
        while time.monotonic() - start < seconds:
            tasks.append(asyncio.create_task(one(specs[i % len(specs)])))
            i += 1
            if time.monotonic() >= next_sample:
                total, by_kind = app_memory_mib()
                samples.append((round(time.monotonic() - start, 1), round(total, 1),
                                sum(not t.done() for t in tasks), by_kind))
                next_sample += 5
            await asyncio.sleep(1.0 / rate)
        await asyncio.gather(*tasks)
    outcomes["sent"] = i
    return outcomes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--knee-rps", type=float, help="skip the sweep and take this as the knee's request rate")
    p.add_argument("--max-in-flight", type=int, default=64, help="the frontend's admission limit for the run")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "soak.json"))
    args = p.parse_args()
    make_tiny_model(peers.MODEL_DIR)
    pool = TokenPool.vocabulary(len(load_tokenizer(str(peers.MODEL_DIR))))
    workload = SyntheticWorkload(LengthDist(512, 128, min=64, max=1024), LengthDist(32), pool, seed=5)
    specs = workload.requests(2000)
    config = peers.app_args("disagg-cpu.yaml", frontend__max_in_flight=args.max_in_flight)
    log = Path(args.out).with_suffix(".log")
    with peers.ours(config, log) as url:
        target = Target(url, "tiny-llama")
        knee_rps = args.knee_rps
        if knee_rps is None:
            points = asyncio.run(sweep(target, lambda n, off: specs[off:off + n], [1, 4, 8, 16, 32], lambda c: 48,
                                       parse_slo([]), 32))
            knee_rps = max(pt.result.request_throughput for pt in points)
        rate = 2 * knee_rps
        print(f"knee {knee_rps:.2f} req/s; offering {rate:.2f} req/s for {args.minutes} min", flush=True)
        samples: list = []
        outcomes = asyncio.run(offered_load(url, "tiny-llama", specs, rate, args.minutes * 60, samples))
    warm_samples = [x for x in samples if x[0] >= 30] or samples
    warm = [x[1] for x in warm_samples]
    first, last = warm_samples[0][3], warm_samples[-1][3]
    by_kind = {k: {"after_warmup": round(first.get(k, 0.0), 1), "end": round(last.get(k, 0.0), 1)}
               for k in sorted(set(first) | set(last))}
    lost = sum(v for k, v in outcomes.items() if k.startswith("lost"))
    doc = {"benchmark": "soak", "version": 1, "hardware": hardware(), "config": "configs/disagg-cpu.yaml",
           "max_in_flight": args.max_in_flight, "knee_rps": knee_rps, "offered_rps": rate, "minutes": args.minutes,
           "outcomes": dict(outcomes), "lost": lost,
           "memory_mib": {"after_warmup": warm[0], "end": warm[-1], "max": max(warm), "growth": warm[-1] / warm[0] - 1},
           "memory_by_process_mib": by_kind,
           "samples": [{"t_s": t, "memory_mib": m, "in_flight_client": q} for t, m, q, _ in samples]}
    doc["pass"] = lost == 0 and doc["memory_mib"]["growth"] <= 0.10
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: doc[k] for k in ("outcomes", "lost", "memory_mib", "memory_by_process_mib", "pass")}, indent=2))


if __name__ == "__main__":
    main()
