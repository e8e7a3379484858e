"""`python -m benchmarks.autoscale`: time-varying load against the cluster
simulator (virtual time), one run per autoscaling policy, same requests:

  planner       our SLA planner (orchestrator/planner) with its predictor,
                looking the replicas' start-up time ahead, its fast loop
                every 2 s between steps (the controller ticks every 2 s)
  planner-kingman
                the same with the prefill rule before 2026-12-07: the mean
                TTFT under the p99 target / 3 (`prefill_queueing: kingman`,
                `queueing_factor: 3`)
  planner-md1   that rule with the prefill queue sized as M/D/1 (the rule
                before burstiness was measured: `prefill_queueing: md1`)
  planner-uncalibrated
                the same with the profile's decode step as it is, not scaled
                by what the replicas measure (`decode_step_calibration: false`)
  planner-slow  the same without its fast loop: one decision an interval
                (`fast_interval_s: null`, the default before 2026-12-07)
  dynamo, dynamo-fast
                NVIDIA Dynamo 1.6.1's planner, its own code in its own
                environment (benchmarks/dynamo_planner.py): its defaults, and
                the same deciding every interval
  foresight     the same planner (same sizing, corrections, hysteresis) told
                the coming load instead of predicting it: rate, ISL, OSL and
                peak prompt tokens/s of the busier of the next interval and
                the one after the replicas' start-up time. Not an optimum:
                the planner's own sizing with perfect prediction
  ray-default   Ray Serve's own default policy code per pool
                (benchmarks/ray_autoscaler.py: replicas = ongoing requests /
                target_ongoing_requests=2 averaged over 30 s, 30 s up-scale
                delay, 600 s down-scale delay), ticking every second
  ray-tuned     the same with per-pool targets from the profile (decode: the
                batch that holds the ITL target; prefill: 1)
  hindsight     the cheapest replica schedule that keeps 99% of requests
                within the SLO, found knowing the whole trace
                (benchmarks/hindsight.py) from fixed-count runs of every
                split up to one replica more than the planner's variants
                or the best static split used, then
                replayed in the simulator (what is reported)
  static-P+D    fixed pools; every split of the GPU counts just under and
                over the planner's mean is tried and the best by attainment
                per GPU-hour reported (all in results.static.tried)

The planner observes the simulated replicas through the code it runs on under
Serve: each replica keeps a Serve replica's load window, and the interval's
Observation is built from their reports (ClusterSim.observation, i.e.
orchestrator/planner/observation.py).

Per request: SLO met = TTFT <= target and its median ITL <= target. Per run:
attainment, GPU-hours (every replica from being asked for to being gone),
attainment per GPU-hour, and per interval the offered load, replicas per
pool and attainment (of the requests that arrived in it, the misses split
into TTFT and ITL). Writes JSON and PNG plots.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import dynamo_planner, launch, report
from benchmarks.autoscale_baselines import SUMMARY, Baselines, grid_name, parse_split, split_name, static_splits
from benchmarks.hindsight import Counts, cheapest_schedule
from benchmarks.ray_autoscaler import ray_default_controller
from orchestrator.config import PlannerConfig, PoolBounds, RoutingConfig, SimEngineConfig, SlaConfig
from orchestrator.engines.sim_engine import kv_capacity_blocks, perf_model
from orchestrator.planner.capacity import decode_batch_limit
from orchestrator.planner.observer import prompt_dispersion
from orchestrator.planner.planner import Observation, SlaPlanner
from orchestrator.sim.cluster import ClusterSim, ClusterSpec, RequestOutcome
from orchestrator.sim.link import LINKS
from tools import workloads
from tools.workloads import AzureTrace, RequestSpec, TokenPool, replay_offsets

# The planner variants: what each sets differently from `planner` (the shipped config).
VARIANTS = {
    "planner-slow": {"fast_interval_s": None},
    "planner-kingman": {"prefill_queueing": "kingman", "queueing_factor": 3.0},
    "planner-md1": {"prefill_queueing": "md1", "queueing_factor": 3.0},
    "planner-uncalibrated": {"decode_step_calibration": False},
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="azure")
    p.add_argument("--trace-path", default=None, help="azure, mooncake: the trace (default: the shared one)")
    p.add_argument("--minutes", type=float, default=20.0, help="traces: leading minutes; generated loads: length")
    p.add_argument("--rate-scale", type=float, default=8.0, help="traces: times the recorded rate")
    p.add_argument("--rate", type=float, default=20.0, help="generated loads: mean (diurnal: peak) requests/s")
    p.add_argument("--gpu", choices=["H100", "H200", "A100"], default="H100")
    p.add_argument("--sim-model", choices=["llama-3.1-8b", "llama-3.1-70b", "qwen3-32b"], default="llama-3.1-8b")
    p.add_argument("--ttft-p99-ms", type=float, default=500.0)
    p.add_argument("--itl-p50-ms", type=float, default=30.0)
    p.add_argument("--interval-s", type=float, default=30.0)
    p.add_argument("--startup-s", type=float, default=30.0, help="a new replica's model load time")
    p.add_argument("--max-replicas", type=int, default=16, help="per pool")
    shrink = "planner: seconds of asking for fewer before a pool shrinks (rounded to intervals)"
    p.add_argument("--scale-down-s", type=float, default=90.0, help=shrink)
    p.add_argument(
        "--lookahead-s",
        type=float,
        default=None,
        help="planner: predict this far past the next interval (default: --startup-s; 0: next only)",
    )
    p.add_argument(
        "--peak-window-s",
        type=float,
        default=PlannerConfig().peak_window_s,
        help="planner: window of the peak prompt tokens/s it sizes prefill for (0: mean load only)",
    )
    p.add_argument("--no-backlog", action="store_true", help="planner: ignore prompt tokens queued for prefill")
    p.add_argument(
        "--planner-set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="planner: set a PlannerConfig field for every planner run and the first interval's sizing "
        "(VALUE read as JSON where it parses, else as text); repeatable",
    )
    p.add_argument("--predictor", choices=["constant", "moving_average", "kalman", "seasonal"], default="kalman")
    p.add_argument(
        "--trend-damping",
        type=float,
        default=PlannerConfig().trend_damping,
        help="planner, kalman predictor: damping of the trend over the look-ahead (1: undamped)",
    )
    p.add_argument(
        "--policies",
        default="planner,planner-slow,planner-kingman,foresight,ray-default,ray-tuned,static,hindsight",
    )
    p.add_argument(
        "--baselines-from",
        default=None,
        metavar="RESULT.json",
        help="static, hindsight: reuse an earlier run's of the same load where they stand for this run's "
        "(benchmarks/autoscale_baselines.py); the rest run",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    p.add_argument("--out", required=True)


# -- workloads ---------------------------------------------------------------------------------------------------


TOKENS = (100, 32000)


def _replayed(specs: list[RequestSpec], args: argparse.Namespace) -> list[RequestSpec]:
    offsets = replay_offsets(specs, 1.0, args.rate_scale)
    horizon = args.minutes * 60
    return [replace(s, arrival_s=t) for s, t in zip(specs, offsets) if t < horizon]


def azure_requests(args: argparse.Namespace) -> list[RequestSpec]:
    path = args.trace_path or str(launch.TRACES / "azure_conv_2023.csv")
    return _replayed(AzureTrace(path, TokenPool.vocabulary(32000), seed=args.seed).requests(), args)


def mooncake_requests(args: argparse.Namespace) -> list[RequestSpec]:
    """Mooncake's conversation trace at its own lengths (512-token blocks), shared prefixes kept."""
    path = args.trace_path or str(launch.TRACES / "mooncake_conversation.jsonl")
    trace = workloads.MooncakeTrace(path, TokenPool.vocabulary(32000), block_tokens=512, max_isl=32000)
    return _replayed(trace.requests(), args)


def phase_requests(args: argparse.Namespace) -> list[RequestSpec]:
    """A sinusoidal rate (period a third of the run) whose mix turns from
    prefill-heavy (ISL 3000 / OSL 100) to decode-heavy (ISL 300 / OSL 600)
    half-way; unique prompts."""
    return workloads.phase_requests(args.minutes, args.rate, (3000, 100), (300, 600), args.seed, TOKENS)


WORKLOADS: dict[str, Callable[[argparse.Namespace], list[RequestSpec]]] = {
    "azure": azure_requests,
    "phases": phase_requests,
    "mooncake": mooncake_requests,
    "bursty-prefill": lambda a: workloads.bursty_prefill_requests(a.minutes, a.rate, a.seed, TOKENS),
    "decode-heavy": lambda a: workloads.decode_heavy_requests(a.minutes, a.rate, a.seed, TOKENS),
    "diurnal": lambda a: workloads.diurnal_requests(a.minutes, a.rate, a.seed, TOKENS),
}
# The loads the planner's rules and its tuned constant were fitted to; every other one is a test load.
TRAINING = ("azure", "phases")
HINDSIGHT_TARGET = 0.99  # the share of requests within the SLO the hindsight optimum must keep


# -- observation -----------------------------------------------------------------------------------------------------


# PlannerConfig fields the experiment sets from its own flags (peak_window_s also sets the replicas' reports).
OWN_FLAGS = frozenset(
    {"mode", "interval_s", "predictor", "prefill", "decode", "scale_down_intervals", "replica_startup_s"}
    | {"trend_damping", "peak_window_s"}
)
# The planner settings every run records under "planner"; any other key there is a --planner-set override.
RECORDED_SETTINGS = frozenset(
    {"lookahead_s", "scale_down_intervals", "peak_window_s", "backlog", "trend_damping", "correction_after_intervals"}
)


def planner_settings(assignments: Sequence[str]) -> dict[str, Any]:
    """`FIELD=VALUE` pairs as PlannerConfig fields; a field PlannerConfig lacks, or one the experiment sets
    from its own flags, is an error."""
    settings: dict[str, Any] = {}
    for assignment in assignments:
        name, sep, text = assignment.partition("=")
        if not sep or name not in PlannerConfig.model_fields or name in OWN_FLAGS:
            raise SystemExit(
                f"--planner-set {assignment!r}: expected FIELD=VALUE, FIELD a PlannerConfig field other than "
                f"{', '.join(sorted(OWN_FLAGS))} (set by their own flags)"
            )
        try:
            settings[name] = json.loads(text)
        except json.JSONDecodeError:
            settings[name] = text
    PlannerConfig(**settings)  # a bad value fails here, before any run
    return settings


def prompt_buckets(arrivals: Sequence[tuple[float, int]], t0: float, t1: float, window_s: float) -> list[int]:
    """Prompt tokens per `window_s` stretch of [t0, t1) ([]: no whole stretch)."""
    if window_s <= 0 or t1 - t0 < window_s:
        return []
    bins = [0] * max(int((t1 - t0) / window_s), 1)
    for t, tokens in arrivals:
        if t0 <= t < t1:
            bins[min(int((t - t0) / window_s), len(bins) - 1)] += tokens
    return bins


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)]


def forecast(requests: Sequence[RequestSpec], t0: float, t1: float, peak_window_s: float = 0.0) -> Observation:
    window = [r for r in requests if t0 <= r.arrival_s < t1]
    n = len(window)
    mean_isl = statistics.fmean(len(r.prompt_token_ids) for r in window) if n else 0.0
    bins = prompt_buckets([(r.arrival_s, len(r.prompt_token_ids)) for r in window], t0, t1, peak_window_s)
    return Observation(
        interval_s=t1 - t0,
        requests=n,
        mean_isl=mean_isl,
        mean_osl=statistics.fmean(r.max_tokens for r in window) if n else 0.0,
        peak_prompt_tps=max(bins) / peak_window_s if bins else None,
        peak_window_s=peak_window_s or None,
        prompt_dispersion=prompt_dispersion(bins, mean_isl),
        prompt_length_scv=(
            statistics.pvariance([len(r.prompt_token_ids) for r in window]) / mean_isl**2 if n > 1 else None
        ),
    )


# -- policies ---------------------------------------------------------------------------------------------------------


Controller = Callable[[ClusterSim], None]


def planner_controller(
    planner: SlaPlanner,
    interval_s: float,
    startup_s: float,
    log: list[dict],
    requests: Sequence[RequestSpec] | None = None,
    peak_window_s: float = 0.0,
    backlog: bool = True,
) -> Callable[[ClusterSim], Controller]:
    fast_raises: list[dict] = []  # the fast loop's, since the last step

    def react(sim: ClusterSim) -> None:
        decision = planner.react(sim.observation(interval_s))
        if decision is not None:
            sim.resize("prefill", decision.prefill, startup_s)
            sim.resize("decode", decision.decode, startup_s)
            fast_raises.append({"t": sim.now, "prefill": decision.prefill, "decode": decision.decode})

    def make(sim: ClusterSim) -> Controller:
        def control(sim: ClusterSim) -> None:
            if not _on_boundary(sim.now, interval_s):  # a fast tick between steps
                react(sim)
                return
            obs = sim.observation(interval_s)  # what the Serve policy would build from the same replicas
            if not backlog:
                obs = replace(obs, prefill_queued_tokens=0.0)
            if peak_window_s <= 0:
                obs = replace(obs, peak_prompt_tps=None, peak_window_s=None, prompt_dispersion=None)
            ahead = None
            if requests is not None:  # foresight: the busier of the next interval and the one after start-up
                ahead = [
                    forecast(requests, sim.now + d, sim.now + d + interval_s, peak_window_s) for d in (0.0, startup_s)
                ]
            decision = planner.step(obs, ahead)
            sim.resize("prefill", decision.prefill, startup_s)
            sim.resize("decode", decision.decode, startup_s)
            log.append(
                {
                    "t": sim.now,
                    "rate": obs.request_rate,
                    "isl": obs.mean_isl,
                    "osl": obs.mean_osl,
                    "asked_osl": obs.mean_max_tokens,
                    "predicted_osl": decision.predicted_osl,
                    "decode_running": obs.decode_running,
                    "running_decode": decision.running_decode,
                    "ttft_p99_ms": _ms(obs.ttft_p99_s),
                    "itl_p50_ms": _ms(obs.itl_p50_s),
                    "predicted_rate": decision.predicted_rate,
                    "prefill": sim.count("prefill"),
                    "decode": sim.count("decode"),
                    "prefill_ready": obs.prefill_replicas,
                    "decode_ready": obs.decode_replicas,
                    "prefill_correction": decision.prefill_correction,
                    "decode_correction": decision.decode_correction,
                    "peak_ratio": decision.peak_ratio,
                    "burstiness": decision.burstiness,
                    "prefill_queued_tokens": obs.prefill_queued_tokens,
                    "proposed_prefill": decision.proposed_prefill,
                    "proposed_decode": decision.proposed_decode,
                    "fast_raises": list(fast_raises),
                    # per engine priority (SLO classes): [priority, requests/s, TTFT p99 ms, ITL p50 ms]
                    **(
                        {
                            "levels": [
                                [v.priority, v.request_rate, _ms(v.ttft_p99_s), _ms(v.itl_p50_s)] for v in obs.levels
                            ]
                        }
                        if obs.levels
                        else {}
                    ),
                    # per pool a cap left short: its load over what the granted replicas hold (None: no count does)
                    "capped": {
                        c.pool: c.load_over_capacity if math.isfinite(c.load_over_capacity) else None
                        for c in decision.capped
                    },
                }
            )
            fast_raises.clear()

        return control

    return make


def _on_boundary(t: float, interval_s: float) -> bool:
    return abs(t / interval_s - round(t / interval_s)) < 1e-9


def schedule_controller(
    counts: Sequence[Counts], interval_s: float, startup_s: float
) -> Callable[[ClusterSim], Controller]:
    """Follows a replica schedule known in advance (counts[k]: interval k):
    asks for a replica `startup_s` before the interval that needs it, lets
    one go when no interval up to then needs it."""
    ahead = math.ceil(startup_s / interval_s - 1e-9)

    def make(sim: ClusterSim) -> Controller:
        def control(sim: ClusterSim) -> None:
            k = round(sim.now / interval_s)
            window = counts[k : k + ahead + 1] or counts[-1:]
            for i, pool in enumerate(("prefill", "decode")):
                sim.resize(pool, max(c[i] for c in window), startup_s)

        return control

    return make


def hindsight_top(series: dict[str, list[dict]], results: dict[str, Any], max_replicas: int) -> Counts:
    """The hindsight grid's largest counts: one more than the planner, its variants or the best static split used."""
    # Ray's policies are left out: their over-provisioning would only widen the grid.
    used = [(e["prefill"], e["decode"]) for name, log in series.items() if not name.startswith("ray") for e in log]
    best = results.get("static", {}).get("split")
    if best:
        used.append(parse_split(best))
    prefill, decode = (min(max((u[i] for u in used), default=2) + 1, max_replicas) for i in (0, 1))
    return prefill, decode


def hindsight_run(
    args: argparse.Namespace,
    series: dict[str, list[dict]],
    results: dict[str, Any],
    run_static: Callable[[Counts], tuple[dict[str, Any], list]],
    run_schedule: Callable[[Sequence[Counts]], dict[str, Any]],
    horizon_s: float,
) -> dict[str, Any]:
    """The hindsight optimum (benchmarks/hindsight.py) over fixed-count runs
    of every (prefill, decode) up to one more replica than the planner, its
    variants or the best static split used,
    replayed in the simulator: what is reported is the replay."""
    top = hindsight_top(series, results, args.max_replicas)
    grid = [(p, d) for p in range(1, top[0] + 1) for d in range(1, top[1] + 1)]
    intervals = math.ceil(horizon_s / args.interval_s + 1e-9)
    met: dict[Counts, list[int]] = {}
    arrived = [0] * intervals
    for (p, d), (r, _) in zip(grid, _map(run_static, grid, args.jobs)):
        met[(p, d)] = [0] * intervals
        for row in r["per_interval"]:
            k = round(row["t"] / args.interval_s)
            met[(p, d)][k], arrived[k] = row["met"], row["requests"]
    plan = cheapest_schedule(met, arrived, args.interval_s, args.startup_s, target=HINDSIGHT_TARGET)
    replay = run_schedule(plan.counts)
    print(
        f"hindsight: predicted {plan.attainment:.4f} @ {plan.gpu_s / 3600:.3f} GPU-h; "
        f"replayed {replay['attainment']:.4f} @ {replay['gpu_hours']:.3f}",
        flush=True,
    )
    return {
        **replay,
        "predicted": {"attainment": plan.attainment, "gpu_hours": plan.gpu_s / 3600},
        "target": HINDSIGHT_TARGET,
        "grid": grid_name(top),
        "schedule": [list(c) for c in plan.counts],
    }


# -- one run ----------------------------------------------------------------------------------------------------------


def run_policy(
    spec: ClusterSpec,
    engine: SimEngineConfig,
    requests: Sequence[RequestSpec],
    horizon_s: float,
    interval_s: float,
    controller: Callable[[ClusterSim], Controller] | None,
    sla: SlaConfig,
    seed: int,
    tick_s: float | None = None,
) -> dict[str, Any]:
    """`tick_s`: how often the controller runs (default: once an interval)."""
    sim = ClusterSim(spec, perf_model(engine), LINKS[engine.link], seed=seed)
    if controller is not None:
        sim.every(tick_s or interval_s, controller(sim), horizon_s)
    outcomes = sim.run(requests)
    return summarize_run(outcomes, sim.gpu_seconds, sla, interval_s)


def meets(o: RequestOutcome, sla: SlaConfig) -> bool:
    if not o.finished:
        return False
    itl = o.itl_s
    return o.ttft_s * 1000 <= sla.ttft_p99_ms and (not itl or statistics.median(itl) * 1000 <= sla.itl_p50_ms)


def miss_cause(o: RequestOutcome, sla: SlaConfig) -> str | None:
    """None when the request met both SLOs; else "ttft" (its first token came
    late) or "itl" (on time, but its median gap between tokens over target)."""
    if meets(o, sla):
        return None
    if o.ttft_s is None or o.ttft_s * 1000 > sla.ttft_p99_ms:
        return "ttft"
    return "itl"


def per_interval(outcomes: Sequence[RequestOutcome], sla: SlaConfig, interval_s: float) -> list[dict[str, Any]]:
    """Attainment of the requests that arrived in each interval, and why the rest missed."""
    bins: dict[int, dict[str, Any]] = {}
    for o in outcomes:
        b = bins.setdefault(int(o.arrival_s // interval_s), {"requests": 0, "met": 0, "ttft": 0, "itl": 0})
        b["requests"] += 1
        cause = miss_cause(o, sla)
        if cause is None:
            b["met"] += 1
        else:
            b[cause] += 1
    return [{"t": k * interval_s, **v, "attainment": v["met"] / v["requests"]} for k, v in sorted(bins.items())]


def summarize_run(
    outcomes: Sequence[RequestOutcome], gpu_seconds: float, sla: SlaConfig, interval_s: float | None = None
) -> dict[str, Any]:
    ok = [o for o in outcomes if o.finished]
    attained = sum(meets(o, sla) for o in outcomes) / len(outcomes) if outcomes else 0.0
    gpu_hours = gpu_seconds / 3600
    ttft = sorted(o.ttft_s for o in ok)
    itl = sorted(statistics.median(o.itl_s) for o in ok if o.itl_s)
    return {
        "requests": len(outcomes),
        "finished": len(ok),
        "attainment": attained,
        "gpu_hours": gpu_hours,
        "attainment_per_gpu_hour": attained / gpu_hours if gpu_hours else 0.0,
        "ttft_ms": {"p50": _ms(_quantile(ttft, 0.5)), "p99": _ms(_quantile(ttft, 0.99))},
        "itl_ms": {"p50": _ms(_quantile(itl, 0.5)), "p99": _ms(_quantile(itl, 0.99))},
        **({"per_interval": per_interval(outcomes, sla, interval_s)} if interval_s else {}),
    }


def time_at_cap(log: Sequence[dict], max_replicas: int) -> dict[str, float]:
    """Shares of a policy's intervals: with a pool at `max_replicas`; and, where the policy says so (the
    planner), with a pool its load needed more replicas for than a cap allowed."""
    if not log:
        return {}
    at_max = sum(1 for e in log if max(e.get("prefill", 0), e.get("decode", 0)) >= max_replicas) / len(log)
    shares = {"time_at_max_replicas": at_max}
    if any("capped" in e for e in log):
        shares["time_capped"] = sum(1 for e in log if e.get("capped")) / len(log)
    return shares


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def run_experiment(args: argparse.Namespace) -> int:
    requests = WORKLOADS[args.workload](args)
    horizon = max(r.arrival_s for r in requests)
    engine = SimEngineConfig(kind="sim", gpu=args.gpu, model=args.sim_model, link="infiniband")
    perf = perf_model(engine)
    block_size = 16
    blocks = kv_capacity_blocks(engine, perf, block_size)
    sla = SlaConfig(ttft_p99_ms=args.ttft_p99_ms, itl_p50_ms=args.itl_p50_ms)
    bounds = PoolBounds(min_replicas=1, max_replicas=args.max_replicas)

    def spec(prefill: int, decode: int) -> ClusterSpec:
        return ClusterSpec(
            prefill,
            decode,
            blocks,
            block_size,
            routing=RoutingConfig(),
            kv_event_delay_s=0.002,
            report_span_s=args.interval_s,
            peak_window_s=peak_window or PlannerConfig().peak_window_s,
        )

    lookahead = args.startup_s if args.lookahead_s is None else args.lookahead_s
    scale_down = max(1, round(args.scale_down_s / args.interval_s))
    peak_window = args.peak_window_s
    ray_tick_s = 1.0

    overrides = planner_settings(args.planner_set)
    load = [
        {"t": t, "rate": f.request_rate, "isl": f.mean_isl, "osl": f.mean_osl}
        for t in range(0, int(horizon), int(args.interval_s))
        for f in [forecast(requests, t, t + args.interval_s)]
    ]
    the_load = {  # LOAD_FIELDS: what the baselines were measured on
        "workload": args.workload,
        "requests": len(requests),
        "horizon_s": horizon,
        "sla": sla.model_dump(),
        "gpu": args.gpu,
        "model": args.sim_model,
        "interval_s": args.interval_s,
        "startup_s": args.startup_s,
        "load": load,
    }
    baselines = Baselines.read(args.baselines_from) if args.baselines_from else None
    if baselines:
        baselines.check_load(the_load)

    def planner(initial: tuple[int, int] = (1, 1), **variant: Any) -> SlaPlanner:
        config = PlannerConfig(
            **{**overrides, **variant},
            mode="act",
            interval_s=args.interval_s,
            predictor=args.predictor,
            prefill=bounds,
            decode=bounds,
            scale_down_intervals=scale_down,
            replica_startup_s=lookahead,
            trend_damping=args.trend_damping,
        )
        return SlaPlanner(config, sla, perf, blocks * block_size, initial=initial)

    # Every autoscaled run starts from the pools the first minute of load needs
    # (as a deployment sized for its launch would), so that no policy is
    # judged on a cold start none could avoid.
    first = planner().step(
        Observation(interval_s=args.interval_s, requests=0),
        forecast(requests, 0.0, args.interval_s + args.startup_s, peak_window),
    )
    initial = (first.prefill, first.decode)

    policies = args.policies.split(",")
    dynamo_python = dynamo_planner.ensure_venv() if set(policies) & set(dynamo_planner.POLICIES) else None
    kv_tokens = blocks * block_size
    dynamo_fpms = dynamo_planner.profile_fpms(perf, engine.max_num_batched_tokens, engine.max_num_seqs, kv_tokens)

    def dynamo_init(name: str) -> dict[str, Any]:
        config = dynamo_planner.planner_config(
            name, args.ttft_p99_ms, args.itl_p50_ms, args.interval_s, args.max_replicas
        )
        caps = dynamo_planner.capabilities(engine.max_num_batched_tokens, engine.max_num_seqs, kv_tokens, block_size)
        return {"config": config, "capabilities": caps, "prefill_fpms": dynamo_fpms[0], "decode_fpms": dynamo_fpms[1]}

    def run_named(name: str) -> tuple[dict[str, Any], list[dict]]:
        log: list[dict] = []
        tick = None
        peer = contextlib.ExitStack()
        if name in dynamo_planner.POLICIES:
            assert dynamo_python is not None
            process = peer.enter_context(
                dynamo_planner.dynamo_planner(dynamo_python, dynamo_init(name), dynamo_planner.log_path(args.out, name))
            )
            controller = dynamo_planner.dynamo_controller(
                process, args.interval_s, args.startup_s, args.max_replicas, log
            )
        elif name in ("planner", "foresight", *VARIANTS):
            policy = planner(initial, **VARIANTS.get(name, {}))
            tick = policy.config.fast_interval_s  # None: once an interval
            controller = planner_controller(
                policy,
                args.interval_s,
                args.startup_s,
                log,
                requests if name == "foresight" else None,
                peak_window_s=peak_window,
                backlog=not args.no_backlog,
            )
        elif name == "ray-default":
            controller = ray_default_controller({"prefill": 2, "decode": 2}, args.startup_s, args.max_replicas, log)
            tick = ray_tick_s
        elif name == "ray-tuned":
            context = statistics.fmean(len(r.prompt_token_ids) + r.max_tokens / 2 for r in requests)
            batch = decode_batch_limit(perf, context, args.itl_p50_ms / 1000, blocks * block_size, 256)
            controller = ray_default_controller(
                {"prefill": 1, "decode": max(batch, 1)}, args.startup_s, args.max_replicas, log
            )
            tick = ray_tick_s
        else:
            raise SystemExit(f"unknown policy {name!r}")
        with peer:
            result = run_policy(
                spec(*initial), engine, requests, horizon, args.interval_s, controller, sla, args.seed, tick
            )
        result.update(time_at_cap(log, args.max_replicas))
        print(f"{name}: {json.dumps({k: v for k, v in result.items() if k != 'per_interval'})}", flush=True)
        return result, log

    def run_static(split: tuple[int, int]) -> tuple[dict[str, Any], list[dict]]:
        r = run_policy(spec(*split), engine, requests, horizon, args.interval_s, None, sla, args.seed)
        r["split"] = split_name(split)
        print(f"static {r['split']}: attainment {r['attainment']:.4f}, {r['gpu_hours']:.3f} GPU-h", flush=True)
        return r, []

    reused: dict[str, Any] = {}
    if baselines:  # the same code before anything is reused
        reused["checked"] = baselines.check_code(lambda split: run_static(split)[0])

    results: dict[str, Any] = {}
    series: dict[str, list[dict]] = {}
    named = [p for p in policies if p not in ("static", "hindsight")]
    for name, (result, log) in zip(named, _map(run_named, named, args.jobs)):
        results[name], series[name] = result, log

    def run_splits(splits: Sequence[Counts]) -> list[dict[str, Any]]:
        return [r for r, _ in _map(run_static, splits, args.jobs)]

    if "static" in policies:
        # Fixed pools of about the planner's GPU-hours: every split of the GPU
        # counts just under and over its mean, the best per GPU-hour kept.
        reference = results.get("planner") or next(iter(results.values()), None)
        splits = static_splits(reference["gpu_hours"] if reference else None, horizon)
        if baselines:
            results["static"], ran = baselines.static_result(splits, run_splits)
            reused["static_ran"] = ran
        else:
            tried = run_splits(splits)
            best = max(tried, key=lambda r: (r["attainment_per_gpu_hour"], r["attainment"]))
            results["static"] = {**best, "tried": {r["split"]: {k: r[k] for k in SUMMARY} for r in tried}}

    def run_schedule(counts: Sequence[Counts]) -> dict[str, Any]:
        ahead = math.ceil(args.startup_s / args.interval_s - 1e-9)
        start = tuple(max(c[i] for c in counts[: ahead + 1]) for i in (0, 1))
        return run_policy(
            spec(*start),
            engine,
            requests,
            horizon,
            args.interval_s,
            schedule_controller(counts, args.interval_s, args.startup_s),
            sla,
            args.seed,
        )

    if "hindsight" in policies:
        top = hindsight_top(series, results, args.max_replicas)
        if baselines and baselines.covers(top):
            results["hindsight"] = dict(baselines.hindsight)
            reused["hindsight"] = f"reused: its grid holds {grid_name(top)}, this run's"
        else:
            results["hindsight"] = hindsight_run(args, series, results, run_static, run_schedule, horizon)
            reused["hindsight"] = "ran"

    recorded = {
        "lookahead_s": lookahead,
        "scale_down_intervals": scale_down,
        "peak_window_s": peak_window,
        "backlog": not args.no_backlog,
        "trend_damping": args.trend_damping,
        "correction_after_intervals": PlannerConfig().correction_after_intervals,
    }
    assert recorded.keys() == RECORDED_SETTINGS  # what autoscale_table tells apart from the overrides
    doc = {
        "experiment": "autoscale",
        "version": 1,
        "set": "training" if args.workload in TRAINING else "test",
        "initial_replicas": {"prefill": initial[0], "decode": initial[1]},
        **the_load,
        "predictor": args.predictor,
        "planner": {**recorded, **overrides},
        "results": results,
        **({"baselines": {"from": baselines.path, "commit": baselines.commit, **reused}} if baselines else {}),
        **({"dynamo_planner": dynamo_peer_record(dynamo_python, dynamo_init, policies)} if dynamo_python else {}),
        "series": series,
    }
    report.write(args.out, doc, plot=plot_experiment)
    print(
        json.dumps(
            {
                name: {k: r[k] for k in ("attainment", "gpu_hours", "attainment_per_gpu_hour")}
                for name, r in results.items()
            },
            indent=2,
        )
    )
    return 0


def dynamo_peer_record(python: Path, init: Callable[[str], dict[str, Any]], policies: list[str]) -> dict[str, Any]:
    """What Dynamo's planner ran with: package versions, each policy's config, the profile it was given."""
    ran = [p for p in policies if p in dynamo_planner.POLICIES]
    first = init(ran[0])
    return {
        "versions": dynamo_planner.versions(python),
        "config": {p: init(p)["config"] for p in ran},
        "capabilities": first["capabilities"],
        "profile_fpms": {"prefill": len(first["prefill_fpms"]), "decode": len(first["decode_fpms"])},
        "perf_model": "Dynamo's FPM regression models (PrefillRegressionModel, DecodeRegressionModel) in place of "
        "1.6.1's AISimulate core, which cannot be installed (benchmarks/peer_env/dynamo_planner_bridge.py)",
    }


_TASK: Callable[[Any], Any] | None = None


def _call(item: Any) -> Any:
    assert _TASK is not None
    return _TASK(item)


def _map(fn: Callable[[Any], Any], items: Sequence[Any], jobs: int) -> list[Any]:
    """fn over items, in `jobs` forked processes (the simulator is pure
    Python: one core a run), in order."""
    global _TASK
    if jobs <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    import multiprocessing

    _TASK = fn
    try:
        with multiprocessing.get_context("fork").Pool(min(jobs, len(items))) as pool:
            return pool.map(_call, items, chunksize=1)
    finally:
        _TASK = None


def plot_experiment(doc: dict[str, Any], path: Path) -> None:
    fig, axes = report.pyplot().subplots(4, 1, figsize=(12, 14), sharex=False)
    ax_load, ax_rep, ax_att, ax_bar = axes
    load = doc["load"]
    ax_load.plot([p["t"] for p in load], [p["rate"] for p in load], color="black", label="offered req/s")
    ax_mix = ax_load.twinx()
    ax_mix.plot([p["t"] for p in load], [p["isl"] for p in load], color="tab:orange", alpha=0.6, label="ISL")
    ax_mix.plot([p["t"] for p in load], [p["osl"] for p in load], color="tab:green", alpha=0.6, label="OSL")
    ax_load.set_ylabel("req/s")
    ax_mix.set_ylabel("tokens")
    ax_load.set_title(f"offered load ({doc['workload']})")
    ax_load.legend(loc="upper left")
    ax_mix.legend(loc="upper right")
    for name, log in doc["series"].items():
        (line,) = ax_rep.plot([p["t"] for p in log], [p["prefill"] for p in log], "--", label=f"{name} prefill")
        ax_rep.plot(
            [p["t"] for p in log], [p["decode"] for p in log], "-", color=line.get_color(), label=f"{name} decode"
        )
    hindsight = doc["results"].get("hindsight", {}).get("schedule")
    if hindsight:
        t = [k * doc["interval_s"] for k in range(len(hindsight))]
        ax_rep.step(t, [c[0] for c in hindsight], "--", where="post", color="black", label="hindsight prefill")
        ax_rep.step(t, [c[1] for c in hindsight], "-", where="post", color="black", label="hindsight decode")
    ax_rep.set_ylabel("replicas (GPUs)")
    ax_rep.set_xlabel("seconds")
    ax_rep.legend(fontsize=7, ncol=2)
    for name, r in doc["results"].items():
        rows = r.get("per_interval") or []
        ax_att.plot([p["t"] for p in rows], [p["attainment"] * 100 for p in rows], marker=".", label=name)
    ax_att.set_ylabel("within both SLOs, % (by arrival)")
    ax_att.set_xlabel("seconds")
    ax_att.legend(fontsize=7)
    names = list(doc["results"])
    ax_bar.bar(names, [doc["results"][n]["attainment"] * 100 for n in names], color="tab:blue", label="attainment %")
    ax_gpu = ax_bar.twinx()
    ax_gpu.plot(names, [doc["results"][n]["gpu_hours"] for n in names], "o", color="tab:red", label="GPU-hours")
    ax_bar.set_ylabel("requests within both SLOs, %")
    ax_gpu.set_ylabel("GPU-hours")
    ax_bar.set_title("attainment and cost")
    for ax in (ax_load, ax_rep, ax_att, ax_bar):
        ax.grid(alpha=0.3)
    report.save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    return launch.main(__doc__, add_arguments, run_experiment, argv)


if __name__ == "__main__":
    raise SystemExit(main())
