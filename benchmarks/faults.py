"""Faults under load on the real CPU application, for RELIABILITY.md.

The disaggregated app (configs/disagg-cpu.yaml with 1 prefill + 2 decode
replicas) serves a steady closed-loop load; a few seconds in, one fault is
injected while streams are in flight:

  none                    the baseline
  decode-replica-killed   the busiest decode replica's actor killed (ray.kill)
  engine-core-crashed     the EngineCore process inside a decode replica SIGKILLed
  prefill-replica-killed  the prefill replica's actor killed

then, on the shipped config as it ships (1 prefill + 1 decode replica):

  only-decode-replica-killed  the one decode replica's actor killed: no
                              replica to migrate to until Serve replaces it

and, on the first app with 2 frontend replicas behind HAProxy (`--ingress-scenarios`):

  frontend-replica-killed  one frontend replica's actor killed: its own streams in flight end with an
                           error; every request started after the kill must be answered
  haproxy-restarted        HAProxy's process SIGKILLed (Ray's HAProxy manager starts it again): what is
                           lost is measured, not required to be 0

Each request is counted as answered (200 with every token asked for),
rejected (429), hung (no byte for `--hang-s`: the bound) or lost (anything
else: an error, a cut stream, a short answer) — lost and hung must be 0.
Per scenario the frontend's own counters show what the fault did to the
streams in flight: migrations, prefill fallbacks, route decisions, KV
handoffs (differences of /metrics around the scenario), and how many
requests were in flight when it was injected. Serve replaces the dead
replica before the next scenario starts. Writes benchmarks/results/faults.json.

    .venv/bin/python benchmarks/faults.py
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import sys
import time
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
SHIPPED_SCENARIOS = ["only-decode-replica-killed"]
INGRESS_SCENARIOS = ["frontend-replica-killed", "haproxy-restarted"]
APP = "orchestrator"
# Frontend counters read around each scenario: name -> the labels its samples are told apart by.
COUNTERS = {
    "orchestrator_decode_migrations_total": (),
    "orchestrator_prefill_fallbacks_total": ("reason",),
    "orchestrator_route_decisions_total": ("kind", "reason"),
    "orchestrator_kv_handoffs_total": (),
    "orchestrator_requests_total": ("outcome",),
}


def pools(url: str) -> dict:
    return httpx.get(f"{url}/pools", timeout=10).json()["pools"]


def wait_replicas(url: str, decode: int, prefill: int, gone: str | None = None, timeout_s: float = 600) -> None:
    """Until the pools are whole again and the replica hit (`gone`, whose engine may be dead while its
    actor still lists it) has left them."""

    def replaced() -> bool:
        p = pools(url)
        listed = {r["replica_id"] for replicas in p.values() for r in replicas}
        whole = len(p.get("decode_pool", [])) >= decode and len(p.get("prefill_pool", [])) >= prefill
        return whole and gone not in listed

    launch.wait_until(replaced, "replicas replaced", timeout_s)


def busiest(url: str, pool: str) -> dict:
    replicas = pools(url)[pool]
    return max(replicas, key=lambda r: (r["stats"] or {}).get("num_running", 0))


def inject(url: str, scenario: str) -> tuple[str, str | None]:
    """Inject the fault; returns what was hit and the replica it was in."""
    import ray

    if scenario == "none":
        return "-", None
    if scenario == "frontend-replica-killed":
        from ray.util import list_named_actors

        prefix = f"SERVE_REPLICA::{APP}#frontend#"
        frontends = sorted(a["name"] for a in list_named_actors(all_namespaces=True) if a["name"].startswith(prefix))
        ray.kill(ray.get_actor(frontends[0], namespace="serve"), no_restart=True)
        return f"frontend replica {frontends[0]}", None
    if scenario == "haproxy-restarted":
        killed = [p for p in psutil.process_iter(["name"]) if p.info["name"] == "haproxy"]
        for proc in killed:
            proc.kill()
        return f"haproxy pids {[p.pid for p in killed]}", None
    pool = "prefill_pool" if scenario.startswith("prefill") else "decode_pool"
    victim = busiest(url, pool)
    if scenario == "engine-core-crashed":
        replica_process = psutil.Process(victim["info"]["pid"])
        core = next(p for p in replica_process.children() if "EngineCore" in p.name())
        core.kill()
        return f"EngineCore pid {core.pid} of {victim['replica_id']}", victim["replica_id"]
    actor = ray.get_actor(f"SERVE_REPLICA::{APP}#{pool}#{victim['replica_id']}", namespace="serve")
    ray.kill(actor, no_restart=True)
    return f"{pool} replica {victim['replica_id']}", victim["replica_id"]


async def scenario_run(url: str, scenario: str, specs, concurrency: int, inject_after_s: float, hang_s: float):
    target = Target(url, "tiny-llama")
    load = asyncio.create_task(run_concurrency(target, specs, concurrency, timeout_s=hang_s))
    await asyncio.sleep(inject_after_s)
    injected_at = time.perf_counter()
    hit, replica = await asyncio.to_thread(inject, url, scenario)
    records, duration = await load
    in_flight = sum(1 for r in records if r.start_s <= injected_at <= r.start_s + (r.e2e_s or duration))
    return records, duration, hit, replica, in_flight, injected_at


def answering_again(url: str, injected_at: float, timeout_s: float = 180) -> float | None:
    """Seconds from the fault to the first /health answered 200 through the ingress once the load has ended (an
    upper bound on the recovery); None if not within `timeout_s` (the run then stops)."""

    def healthy() -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        if healthy():
            return time.perf_counter() - injected_at
        time.sleep(0.5)
    return None


def after_injection(records, specs, injected_at: float) -> dict:
    """Requests started after the fault, and those of them not answered in full (ingress scenarios: these must
    be 0 after a frontend is killed; the killed frontend's own streams in flight may end with an error)."""
    osl = specs[0].max_tokens
    after = [r for r in records if r.start_s > injected_at]
    failed = [r for r in after if not (r.ok and r.output_tokens == osl)]
    return {"started_after": len(after), "failed_after": len(failed)}


def tally(records, specs) -> dict:
    osl = specs[0].max_tokens  # fixed output length, EOS ignored
    outcome = Counter()
    errors = Counter()
    for r in records:
        if r.ok and r.output_tokens == osl:
            outcome["answered"] += 1
        elif r.error == "http_429":
            outcome["rejected"] += 1
        elif r.error and "timeout" in r.error.lower():
            outcome["hung"] += 1
            errors[r.error] += 1
        else:
            outcome["lost"] += 1
            errors[r.error or f"short answer ({r.output_tokens} tokens)"] += 1
    ok = [r for r in records if r.ok]
    return {
        "sent": len(records),
        "answered": outcome["answered"],
        "rejected": outcome["rejected"],
        "hung": outcome["hung"],
        "lost": outcome["lost"],
        "errors": dict(errors),
        "ttft_ms": percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
        "e2e_ms": percentiles([r.e2e_s for r in ok if r.e2e_s is not None]),
        "e2e_max_ms": max((r.e2e_s * 1000 for r in ok if r.e2e_s is not None), default=None),
    }


def run_scenarios(url: str, scenarios: list[str], workload, args, decode: int, prefill: int, first: int) -> dict:
    """Each scenario on fresh requests (from index `first` of the workload), after the pools are whole again."""
    results = {}
    hit_replica = None
    for i, scenario in enumerate(scenarios):
        wait_replicas(url, decode=decode, prefill=prefill, gone=hit_replica)
        start = first + i * args.requests
        specs = workload.requests(start + args.requests)[start:]
        print(f"== {scenario}", flush=True)
        before = launch.counters(url, COUNTERS)
        records, duration, hit, hit_replica, in_flight, injected_at = asyncio.run(
            scenario_run(url, scenario, specs, args.concurrency, args.inject_after_s, args.hang_s)
        )
        recovered_s = answering_again(url, injected_at) if scenario in INGRESS_SCENARIOS else 0.0
        results[scenario] = {
            "injected": hit,
            "in_flight_at_injection": in_flight,
            "duration_s": duration,
            **tally(records, specs),
            **after_injection(records, specs, injected_at),
            "answering_again_after_s": recovered_s,
            # Not for the ingress scenarios: their app has 2 frontends, and each read of /metrics is one of them.
            "frontend_counters": (
                launch.increments(before, launch.counters(url, COUNTERS)) if scenario not in INGRESS_SCENARIOS else None
            ),
        }
        print(json.dumps(results[scenario]), flush=True)
        if recovered_s is None:
            break  # the ingress never came back: nothing more can run on this app
    if all(r.get("answering_again_after_s", 0.0) is not None for r in results.values()):
        wait_replicas(url, decode=decode, prefill=prefill, gone=hit_replica)  # the next app starts on a whole pool
    return results


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--shipped-scenarios", default=",".join(SHIPPED_SCENARIOS))
    p.add_argument("--ingress-scenarios", default=",".join(INGRESS_SCENARIOS))
    p.add_argument("--requests", type=int, default=36)
    p.add_argument("--concurrency", type=int, default=6)
    p.add_argument("--inject-after-s", type=float, default=6.0)
    p.add_argument("--hang-s", type=float, default=300.0, help="a request silent this long counts as hung")
    p.add_argument("--out", default=str(launch.RESULTS / "faults.json"))
    args = p.parse_args()
    pool = TokenPool.vocabulary(len(launch.tiny_model()))
    # Prompts past the local-prefill threshold, so every request takes the disaggregated path.
    workload = SyntheticWorkload(LengthDist(700), LengthDist(160), pool, seed=21)
    two_decode = launch.app_args(
        "disagg-cpu.yaml", decode_pool__replicas=2, frontend__prefill_timeout_s=10, network__kv_handshake_timeout_s=3
    )
    shipped = launch.app_args("disagg-cpu.yaml")
    two_frontends = two_decode.model_copy(update={"frontend": two_decode.frontend.model_copy(update={"replicas": 2})})
    log = Path(args.out).with_suffix(".log")
    results, shipped_results, ingress_results = {}, {}, {}
    # Each app's scenarios take fresh requests from their own block of the workload (after the warm-up's 6).
    blocks = (0, len(SCENARIOS), len(SCENARIOS) + len(SHIPPED_SCENARIOS))
    for (cfg, scenarios, decode, into), block in zip(
        (
            (two_decode, args.scenarios, 2, results),
            (shipped, args.shipped_scenarios, shipped.decode_pool.replicas, shipped_results),
            (two_frontends, args.ingress_scenarios, 2, ingress_results),
        ),
        blocks,
    ):
        if not scenarios:
            continue
        with launch.ours(cfg, log) as url:
            import ray

            ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
            asyncio.run(run_concurrency(Target(url, "tiny-llama"), workload.requests(6), 3))  # warm-up
            first = 6 + block * args.requests
            into.update(run_scenarios(url, scenarios.split(","), workload, args, decode, 1, first))
            ray.shutdown()
    doc = {
        "benchmark": "faults",
        "version": 2,
        "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
        "hardware": hardware(),
        "apps": {
            "scenarios": "configs/disagg-cpu.yaml, 1 prefill + 2 decode replicas",
            "shipped_scenarios": f"configs/disagg-cpu.yaml as shipped, 1 prefill + "
            f"{shipped.decode_pool.replicas} decode",
            "ingress_scenarios": "configs/disagg-cpu.yaml, 1 prefill + 2 decode replicas, 2 frontend replicas, HAProxy",
        },
        "load": {
            "concurrency": args.concurrency,
            "requests": args.requests,
            "isl": 700,
            "osl": 160,
            "inject_after_s": args.inject_after_s,
            "hang_s": args.hang_s,
        },
        "scenarios": results,
        "shipped_scenarios": shipped_results,
        "ingress_scenarios": ingress_results,
    }
    report.write_json(args.out, doc)  # before any check fails the run
    bad = {k: v for k, v in {**results, **shipped_results}.items() if v["lost"] or v["hung"]}
    if ingress_results.get("frontend-replica-killed", {}).get("failed_after"):
        bad["frontend-replica-killed"] = ingress_results["frontend-replica-killed"]
    if bad:
        raise SystemExit(f"requests lost or hung in {sorted(bad)}")


if __name__ == "__main__":
    main()
