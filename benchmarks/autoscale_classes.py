"""`python -m benchmarks.autoscale_classes`: interactive and batch traffic on simulated GPUs, the SLA
planner sizing the pools by SLO class against the same planner holding every request to the stricter
SLO (issue 38, benchmark 3). Virtual time; the planner observes the simulated replicas through the
code it runs on under Serve (each replica's load window, here by priority).

  interactive  the Azure conversation trace, `--rate-scale` x its recorded rate, its first `--minutes`
               (at the default x8 the whole trace: 58 minutes recorded, 7.3 replayed), engine
               priority 0, held to `--ttft-p99-ms` / `--itl-p50-ms`
  batch        a generated Poisson stream over the same span at `--batch-rate` requests/s, engine
               priority 1, held to its own `--batch-ttft-p99-ms` / `--batch-itl-p50-ms`, or best
               effort (`--batch-best-effort`); `--batch-shape` prefill: long prompts (ISL median
               3000 / mean 3500), short outputs (median 150 / mean 200); decode: short prompts
               (250 / 300), long outputs (600 / 800)

Policies, same requests, same cluster, same planner settings, the same starting pools (the one-target
planner's sizing of the first interval and start-up time, told the load):
  one-target           the planner with the interactive class's targets for every request, the
                       engines first come first served (no classes anywhere: today)
  one-target-priority  the same planner, the class priorities on the engines (the engines' half of
                       the classes without the planner's)
  by-class             the planner by class (its levels from the two classes: orchestrator/planner/
                       levels.py), the priorities on the engines
  static, static-routed
                       fixed pools (`--static-split P,D`), the priorities on the engines; static-routed
                       routes by class too: interactive's `max_prefill_queue_tokens` is
                       `--interactive-queue-tokens` (routing by class), batch has none

Per class: the share of its requests within its own targets (TTFT <= target, median ITL <= target),
TTFT p99 and the p99 of the requests' median ITLs; per run: GPU-hours (every replica from being asked
for to being gone) and the planner's decisions per interval.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
from dataclasses import dataclass, replace
from typing import Any

from benchmarks import launch, report
from benchmarks.autoscale import TOKENS, _map, azure_requests, forecast, planner_controller
from orchestrator.config import PlannerConfig, PoolBounds, RoutingConfig, SimEngineConfig, SlaConfig, SloClassConfig
from orchestrator.engines.sim_engine import kv_capacity_blocks, perf_model
from orchestrator.planner.levels import priority_levels
from orchestrator.planner.planner import Observation, SlaPlanner
from orchestrator.sim.cluster import ClusterSim, ClusterSpec, RequestOutcome
from orchestrator.sim.link import LINKS
from tools.workloads import LogNormalLength, poisson_requests

POLICIES = ("one-target", "one-target-priority", "by-class")  # the default; static, static-routed on request
CLASSES = ("interactive", "batch")
PREFIX_TOKENS = 1024  # --interactive-prefixes: each shared prefix's length
SHAPES = {
    "prefill": (LogNormalLength(3000, 3500, 256, 16000), LogNormalLength(150, 200, 8, 1024)),
    "decode": (LogNormalLength(250, 300, 16, 2048), LogNormalLength(600, 800, 32, 4096)),
}


@dataclass(frozen=True)
class ClassedRequest:
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival_s: float
    priority: int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--minutes", type=float, default=20.0, help="the trace's leading minutes, the batch's length")
    p.add_argument("--rate-scale", type=float, default=8.0, help="interactive: times the trace's recorded rate")
    p.add_argument("--ttft-p99-ms", type=float, default=500.0)
    p.add_argument("--itl-p50-ms", type=float, default=30.0)
    p.add_argument("--batch-rate", type=float, default=8.0)
    p.add_argument("--batch-shape", choices=sorted(SHAPES), default="prefill")
    p.add_argument("--batch-ttft-p99-ms", type=float, default=30_000.0)
    p.add_argument("--batch-itl-p50-ms", type=float, default=100.0)
    p.add_argument("--batch-best-effort", action="store_true")
    p.add_argument("--best-effort-share", type=float, default=0.0, help="planner.best_effort_share")
    p.add_argument("--gpu", choices=["H100", "H200", "A100"], default="H100")
    p.add_argument("--sim-model", choices=["llama-3.1-8b", "llama-3.1-70b", "qwen3-32b"], default="llama-3.1-8b")
    p.add_argument("--interval-s", type=float, default=30.0)
    p.add_argument("--startup-s", type=float, default=30.0)
    p.add_argument("--max-replicas", type=int, default=16, help="per pool")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--static-split", default="3,3", help="static, static-routed: prefill,decode replicas")
    p.add_argument("--interactive-queue-tokens", type=int, default=8192, help="static-routed: interactive's budget")
    p.add_argument(
        "--interactive-prefixes",
        type=int,
        default=0,
        help="each interactive prompt starts with one of this many shared 1,024-token prefixes (system prompts), "
        "drawn at random; 0: the trace's prompts as they are (random tokens, nothing shared)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--out", required=True)


def classes(args: argparse.Namespace) -> tuple[SloClassConfig, SloClassConfig]:
    interactive = SloClassConfig(
        name="interactive", priority=0, ttft_p99_ms=args.ttft_p99_ms, itl_p50_ms=args.itl_p50_ms
    )
    if args.batch_best_effort:
        return interactive, SloClassConfig(name="batch", priority=1)
    batch = SloClassConfig(
        name="batch", priority=1, ttft_p99_ms=args.batch_ttft_p99_ms, itl_p50_ms=args.batch_itl_p50_ms
    )
    return interactive, batch


def workload(args: argparse.Namespace) -> list[ClassedRequest]:
    trace = argparse.Namespace(trace_path=None, seed=args.seed, rate_scale=args.rate_scale, minutes=args.minutes)
    rng = random.Random(args.seed + 2)
    prefixes = [tuple(rng.randrange(*TOKENS) for _ in range(PREFIX_TOKENS)) for _ in range(args.interactive_prefixes)]
    interactive = [
        ClassedRequest((rng.choice(prefixes) if prefixes else ()) + r.prompt_token_ids, r.max_tokens, r.arrival_s, 0)
        for r in azure_requests(trace)
    ]
    span_min = max(r.arrival_s for r in interactive) / 60  # the batch runs while the trace does
    isl, osl = SHAPES[args.batch_shape]
    batch = [
        ClassedRequest(r.prompt_token_ids, r.max_tokens, r.arrival_s, 1)
        for r in poisson_requests(span_min, args.batch_rate, args.seed + 1, TOKENS, isl, osl)
    ]
    return sorted(interactive + batch, key=lambda r: r.arrival_s)


def class_summary(outcomes: list[RequestOutcome], cls: SloClassConfig) -> dict[str, Any]:
    ok = [o for o in outcomes if o.finished]
    ttft = sorted(o.ttft_s for o in ok)
    itl = sorted(statistics.median(o.itl_s) for o in ok if o.itl_s)

    def within(o: RequestOutcome) -> bool:
        if cls.ttft_p99_ms is None:
            return o.finished
        return (
            o.finished
            and o.ttft_s * 1000 <= cls.ttft_p99_ms
            and (not o.itl_s or statistics.median(o.itl_s) * 1000 <= cls.itl_p50_ms)
        )

    def pct(values: list[float], q: float) -> float | None:
        return values[min(int(q * len(values)), len(values) - 1)] * 1000 if values else None

    span = max(o.arrival_s for o in outcomes) if outcomes else 0.0
    return {
        "requests": len(outcomes),
        "finished": len(ok),
        "attainment": sum(within(o) for o in outcomes) / len(outcomes) if outcomes else 0.0,
        "ttft_ms": {"p50": pct(ttft, 0.5), "p99": pct(ttft, 0.99)},
        "itl_median_ms": {"p50": pct(itl, 0.5), "p99": pct(itl, 0.99)},
        "output_tokens_per_s": sum(len(o.token_times) for o in ok) / span if span else 0.0,
    }


def run_experiment(args: argparse.Namespace) -> int:
    requests = workload(args)
    horizon = max(r.arrival_s for r in requests)
    interactive, batch = classes(args)
    engine = SimEngineConfig(kind="sim", gpu=args.gpu, model=args.sim_model, link="infiniband")
    perf = perf_model(engine)
    block_size = 16
    blocks = kv_capacity_blocks(engine, perf, block_size)
    strict = SlaConfig(ttft_p99_ms=args.ttft_p99_ms, itl_p50_ms=args.itl_p50_ms)
    bounds = PoolBounds(min_replicas=1, max_replicas=args.max_replicas)
    config = PlannerConfig(
        mode="act",
        interval_s=args.interval_s,
        prefill=bounds,
        decode=bounds,
        scale_down_intervals=max(1, round(90 / args.interval_s)),
        replica_startup_s=args.startup_s,
        best_effort_share=args.best_effort_share,
    )

    def planner(by_class: bool, initial: tuple[int, int] = (1, 1)) -> SlaPlanner:
        levels = priority_levels([interactive, batch]) if by_class else ()
        return SlaPlanner(config, strict, perf, blocks * block_size, initial=initial, levels=levels)

    first = planner(False).step(
        Observation(interval_s=args.interval_s, requests=0),
        forecast(requests, 0.0, args.interval_s + args.startup_s, config.peak_window_s),
    )
    initial = (first.prefill, first.decode)
    classes_of = [r.priority for r in requests]

    split = tuple(int(n) for n in args.static_split.split(","))
    routed = interactive.model_copy(update={"max_prefill_queue_tokens": args.interactive_queue_tokens})

    def run(name: str) -> tuple[dict[str, Any], list[dict]]:
        # one-target: the engines first come first served (every request at priority 0)
        arrivals = [replace(r, priority=0) for r in requests] if name == "one-target" else requests
        static = name.startswith("static")
        spec = ClusterSpec(
            *(split if static else initial),
            blocks,
            block_size,
            routing=RoutingConfig(),
            report_span_s=args.interval_s,
            peak_window_s=config.peak_window_s,
            report_priorities=(0, 1),
            classes=(routed, batch) if name == "static-routed" else (),
        )
        sim = ClusterSim(spec, perf, LINKS[engine.link], seed=args.seed)
        log: list[dict] = []
        if not static:
            policy = planner(name == "by-class", initial)
            controller = planner_controller(
                policy, args.interval_s, args.startup_s, log, peak_window_s=config.peak_window_s
            )
            sim.every(config.fast_interval_s or args.interval_s, controller(sim), horizon)
        outcomes = sim.run(arrivals)
        by = {0: [], 1: []}
        for o in outcomes:
            by[classes_of[int(o.request_id[1:])]].append(o)
        result = {
            "gpu_hours": sim.gpu_seconds / 3600,
            "interactive": class_summary(by[0], interactive),
            "batch": class_summary(by[1], batch),
        }
        print(f"{name}: {json.dumps(result)}", flush=True)
        return result, log

    names = args.policies.split(",")
    results, series = {}, {}
    for name, (result, log) in zip(names, _map(run, names, args.jobs)):
        results[name], series[name] = result, log
    doc = {
        "experiment": "autoscale_classes",
        "version": 1,
        "gpu": args.gpu,
        "model": args.sim_model,
        "minutes": args.minutes,
        "seed": args.seed,
        "interactive": {
            "trace": "azure_conv_2023.csv",
            "shared_prefixes": args.interactive_prefixes,
            "rate_scale": args.rate_scale,
            "requests": classes_of.count(0),
            "class": interactive.model_dump(),
        },
        "batch": {
            "shape": args.batch_shape,
            "rate": args.batch_rate,
            "requests": classes_of.count(1),
            "class": batch.model_dump(),
        },
        "planner": {"interval_s": args.interval_s, "startup_s": args.startup_s, "max_replicas": args.max_replicas}
        | {"best_effort_share": args.best_effort_share},
        "initial_replicas": {"prefill": initial[0], "decode": initial[1]},
        **(
            {"static_split": list(split), "interactive_queue_tokens": args.interactive_queue_tokens}
            if any(n.startswith("static") for n in names)
            else {}
        ),
        "results": results,
        "series": series,
    }
    report.write(args.out, doc)
    brief = {n: {"gpu_hours": r["gpu_hours"], **{c: r[c]["attainment"] for c in CLASSES}} for n, r in results.items()}
    print(json.dumps(brief, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    return launch.main(__doc__, add_arguments, run_experiment, argv)


if __name__ == "__main__":
    raise SystemExit(main())
