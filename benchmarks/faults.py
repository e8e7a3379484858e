"""Faults under load on the real CPU application, for RELIABILITY.md.

The disaggregated app (configs/disagg-cpu.yaml with 1 prefill + 2 decode
replicas) serves a steady closed-loop load; a few seconds in, one fault is
injected while streams are in flight:

  none                    the baseline
  decode-replica-killed   the busiest decode replica's actor killed (ray.kill)
  engine-core-crashed     the EngineCore process inside a decode replica SIGKILLed
  prefill-replica-killed  the prefill replica's actor killed

Each request is counted as answered (200 with every token asked for),
rejected (429) or lost (anything else: an error, a cut stream, a short
answer) — lost must be 0. Serve replaces the dead replica before the next
scenario starts. Writes benchmarks/results/faults.json.

    .venv/bin/python benchmarks/faults.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections import Counter
from pathlib import Path

import httpx
import psutil

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, report  # noqa: E402
from tools.bench import hardware  # noqa: E402
from tools.bench_stats import percentiles  # noqa: E402
from tools.runner import Target, run_concurrency  # noqa: E402
from tools.workloads import LengthDist, SyntheticWorkload, TokenPool  # noqa: E402

SCENARIOS = ["none", "decode-replica-killed", "engine-core-crashed", "prefill-replica-killed"]
APP = "orchestrator"


def pools(url: str) -> dict:
    return httpx.get(f"{url}/pools", timeout=10).json()["pools"]


def wait_replicas(url: str, decode: int, prefill: int, timeout_s: float = 600) -> None:
    def replaced() -> bool:
        p = pools(url)
        return len(p.get("decode_pool", [])) >= decode and len(p.get("prefill_pool", [])) >= prefill

    launch.wait_until(replaced, "replicas replaced", timeout_s)


def busiest(url: str, pool: str) -> dict:
    replicas = pools(url)[pool]
    return max(replicas, key=lambda r: (r["stats"] or {}).get("num_running", 0))


def inject(url: str, scenario: str) -> str:
    """Inject the fault; returns what was hit."""
    import ray

    if scenario == "none":
        return "-"
    pool = "prefill_pool" if scenario.startswith("prefill") else "decode_pool"
    victim = busiest(url, pool)
    if scenario == "engine-core-crashed":
        replica_process = psutil.Process(victim["info"]["pid"])
        core = next(p for p in replica_process.children() if "EngineCore" in p.name())
        core.kill()
        return f"EngineCore pid {core.pid} of {victim['replica_id']}"
    actor = ray.get_actor(f"SERVE_REPLICA::{APP}#{pool}#{victim['replica_id']}", namespace="serve")
    ray.kill(actor, no_restart=True)
    return f"{pool} replica {victim['replica_id']}"


async def scenario_run(url: str, scenario: str, specs, concurrency: int, inject_after_s: float):
    target = Target(url, "tiny-llama")
    load = asyncio.create_task(run_concurrency(target, specs, concurrency))
    await asyncio.sleep(inject_after_s)
    hit = await asyncio.to_thread(inject, url, scenario)
    records, duration = await load
    return records, duration, hit


def tally(records, specs) -> dict:
    osl = specs[0].max_tokens  # fixed output length, EOS ignored
    outcome = Counter()
    errors = Counter()
    for r in records:
        if r.ok and r.output_tokens == osl:
            outcome["answered"] += 1
        elif r.error == "http_429":
            outcome["rejected"] += 1
        else:
            outcome["lost"] += 1
            errors[r.error or f"short answer ({r.output_tokens} tokens)"] += 1
    ok = [r for r in records if r.ok]
    return {
        "sent": len(records),
        "answered": outcome["answered"],
        "rejected": outcome["rejected"],
        "lost": outcome["lost"],
        "errors": dict(errors),
        "ttft_ms": percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
        "e2e_ms": percentiles([r.e2e_s for r in ok if r.e2e_s is not None]),
    }


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--requests", type=int, default=36)
    p.add_argument("--concurrency", type=int, default=6)
    p.add_argument("--inject-after-s", type=float, default=6.0)
    p.add_argument("--out", default=str(launch.RESULTS / "faults.json"))
    args = p.parse_args()
    pool = TokenPool.vocabulary(len(launch.tiny_model()))
    # Prompts past the local-prefill threshold, so every request takes the disaggregated path.
    workload = SyntheticWorkload(LengthDist(700), LengthDist(160), pool, seed=21)
    cfg = launch.app_args(
        "disagg-cpu.yaml", decode_pool__replicas=2, frontend__prefill_timeout_s=10, network__kv_handshake_timeout_s=3
    )
    log = Path(args.out).with_suffix(".log")
    results = {}
    with launch.ours(cfg, log) as url:
        import ray

        ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
        asyncio.run(run_concurrency(Target(url, "tiny-llama"), workload.requests(6), 3))  # warm-up
        for i, scenario in enumerate(args.scenarios.split(",")):
            wait_replicas(url, decode=2, prefill=1)
            specs = workload.requests(6 + (i + 1) * args.requests)[6 + i * args.requests :]
            print(f"== {scenario}", flush=True)
            records, duration, hit = asyncio.run(
                scenario_run(url, scenario, specs, args.concurrency, args.inject_after_s)
            )
            results[scenario] = {"injected": hit, "duration_s": duration, **tally(records, specs)}
            print(json.dumps(results[scenario]), flush=True)
        ray.shutdown()
    doc = {
        "benchmark": "faults",
        "version": 1,
        "hardware": hardware(),
        "app": "configs/disagg-cpu.yaml, 1 prefill + 2 decode replicas",
        "load": {
            "concurrency": args.concurrency,
            "requests": args.requests,
            "isl": 700,
            "osl": 160,
            "inject_after_s": args.inject_after_s,
        },
        "scenarios": results,
    }
    report.write_json(args.out, doc)


if __name__ == "__main__":
    main()
