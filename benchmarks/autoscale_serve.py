"""`python -m benchmarks.autoscale_serve`: time-varying load against the
real Ray Serve application (configs/disagg-sim.yaml: simulated H100 engines in
real time, the real frontend, scheduler, KV index and autoscaling), one run
per policy, the same requests each time:

  planner      our SLA planner as Serve's autoscaling policy (planner.mode act),
               the shipped planner settings (its fast loop every 2 s)
  planner-uncalibrated
               the same with the profile's decode step as it is, not scaled
               by what the decode replicas measure
               (planner.decode_step_calibration false; the default before
               2026-12-06, and the `planner` row of the runs before it)
  planner-slow the planner without its fast loop: one decision an interval
               (planner.fast_interval_s null; the default before 2026-12-07,
               when runs named the fast loop's `planner-fast`)
  planner-window30
               the planner with a stabilisation window of 3 intervals
               (planner.scale_down_intervals 3; 30 s at the 10 s interval,
               the window of the runs before 2026-12-07)
  ray-default  Ray Serve's own autoscaler on each pool, its defaults:
               target_ongoing_requests 2, 30 s up-scale and 600 s down-scale delay
  static-P+D   fixed pools (`--static P+D`; e.g. the best split the
               virtual-time experiment found for the same workload)

The workload (`--workload`): phases, a prefill-heavy phase then a decode-heavy
one, each a sinusoidal Poisson rate (tools.workloads.phase_requests; the
planner's training load); or bursty-prefill, long prompts and short outputs
arriving in clusters (tools.workloads.bursty_prefill_requests, the
simulator's test load of that name). Per request, SLO met = TTFT within
`ttft_p99_ms` and its median ITL within `itl_p50_ms`, measured by the client.
Replicas are read from Serve's own status every `--poll-s` (starting and
running ones cost; GPU-hours = integral of replicas x GPUs per replica).
Simulated replicas start in about a second (no model load), which favours
every policy that scales up late alike.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import launch, report
from orchestrator.config import AppConfig, PlannerConfig, shipped_config
from tools.bench_stats import SloTerm, meets_slo, parse_slo, percentiles
from tools.client import RequestRecord
from tools.runner import Target, run_schedule
from tools.workloads import RequestSpec, bursty_prefill_requests, phase_requests

APP = "autoscale"
POOLS = ("prefill_pool", "decode_pool")
# The planner policies: the planner settings each sets over the shipped config's.
PLANNER_VARIANTS: dict[str, dict[str, Any]] = {
    "planner": {},
    "planner-uncalibrated": {"decode_step_calibration": False},
    "planner-slow": {"fast_interval_s": None},
    "planner-window30": {"scale_down_intervals": 3},
}
# Ray Serve's defaults for `autoscaling_config` (ray.serve.config.AutoscalingConfig).
SERVE_DEFAULT_AUTOSCALING = {"target_ongoing_requests": 2, "upscale_delay_s": 30.0, "downscale_delay_s": 600.0}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-dir", default=str(launch.MODEL_DIR), help="the tokenizer the frontend loads")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="phases")
    p.add_argument("--minutes", type=float, default=6.0, help="length of the load; phases: half each phase")
    p.add_argument("--rate", type=float, default=4.0, help="mean requests/s")
    p.add_argument("--prefill-phase", default="2000/20", help="phases: ISL/OSL of the first half")
    p.add_argument("--decode-phase", default="300/200", help="phases: ISL/OSL of the second half")
    p.add_argument(
        "--sim-model",
        choices=["llama-3.1-8b", "llama-3.1-70b", "qwen3-32b"],
        default="qwen3-32b",
        help="what each simulated H100 serves (32B: prefill and decode both bind at rates 2 cores send)",
    )
    p.add_argument("--ttft-p99-ms", type=float, default=1000.0)
    p.add_argument("--itl-p50-ms", type=float, default=30.0)
    p.add_argument(
        "--interval-s", type=float, default=PlannerConfig().interval_s, help="the planner's adjustment interval"
    )
    p.add_argument("--max-replicas", type=int, default=4, help="per pool")
    p.add_argument("--policies", default="planner,ray-default,static")
    p.add_argument("--static", default="2+2", help="the static split P+D")
    p.add_argument("--poll-s", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)


# -- workload ----------------------------------------------------------------------------------------------------------


def _lengths(text: str) -> tuple[int, int]:
    isl, osl = text.split("/")
    return int(isl), int(osl)


TOKEN_RANGE = (10, 600)  # the tiny tokenizer's vocabulary


def phases(args: argparse.Namespace) -> tuple[str, list[RequestSpec]]:
    lengths = _lengths(args.prefill_phase), _lengths(args.decode_phase)
    requests = phase_requests(args.minutes, args.rate, *lengths, args.seed, token_range=TOKEN_RANGE)
    return f"phases {args.prefill_phase} then {args.decode_phase}, {args.rate} req/s mean, {args.minutes} min", requests


def bursty_prefill(args: argparse.Namespace) -> tuple[str, list[RequestSpec]]:
    requests = bursty_prefill_requests(args.minutes, args.rate, args.seed, TOKEN_RANGE)
    what = "bursty prefill-heavy (gamma gaps CV 2.5, ISL median 1470 / mean 2000, OSL mean 28)"
    return f"{what}, {args.rate} req/s mean, {args.minutes} min", requests


# Each: what the result calls the load, and its requests.
WORKLOADS: dict[str, Callable[[argparse.Namespace], tuple[str, list[RequestSpec]]]] = {
    "phases": phases,
    "bursty-prefill": bursty_prefill,
}


# -- the application per policy ----------------------------------------------------------------------------------------


def app_config(policy: str, args: argparse.Namespace) -> AppConfig:
    sla = {"sla__ttft_p99_ms": args.ttft_p99_ms, "sla__itl_p50_ms": args.itl_p50_ms}
    base = dict(
        kv_cache__block_size=16,
        network__advertise_host="127.0.0.1",
        model__name=f"sim-{args.sim_model}",
        prefill_pool__engine__model=args.sim_model,
        decode_pool__engine__model=args.sim_model,
        **sla,
    )
    bounds = {"min_replicas": 1, "max_replicas": args.max_replicas}
    config = launch.CONFIGS / "disagg-sim.yaml"
    if policy in PLANNER_VARIANTS:
        return shipped_config(
            config,
            args.model_dir,
            prefill_pool__replicas=1,
            decode_pool__replicas=1,
            planner__mode="act",
            planner__interval_s=args.interval_s,
            planner__prefill=bounds,
            planner__decode=bounds,
            **{f"planner__{name}": value for name, value in PLANNER_VARIANTS[policy].items()},
            **base,
        )
    if policy == "ray-default":
        autoscaling = {**SERVE_DEFAULT_AUTOSCALING, **bounds}
        # Serve's autoscaler counts the requests its handles carry.
        return shipped_config(
            config,
            args.model_dir,
            prefill_pool__replicas=1,
            decode_pool__replicas=1,
            prefill_pool__autoscaling=autoscaling,
            decode_pool__autoscaling=autoscaling,
            frontend__data_plane="serve",
            **base,
        )
    prefill, decode = (int(n) for n in args.static.split("+"))
    return shipped_config(config, args.model_dir, prefill_pool__replicas=prefill, decode_pool__replicas=decode, **base)


async def _poll(samples: list[dict[str, Any]], start: float, period_s: float, stop: asyncio.Event) -> None:
    while not stop.is_set():
        from deployments.serve_status import replica_counts

        counts = await asyncio.to_thread(replica_counts, APP, POOLS)
        samples.append({"t": time.perf_counter() - start, **counts})
        try:
            await asyncio.wait_for(stop.wait(), period_s)
        except TimeoutError:
            pass


async def _replay(base_url: str, model: str, requests: list[RequestSpec], poll_s: float):
    samples: list[dict[str, Any]] = []
    stop = asyncio.Event()
    start = time.perf_counter()
    poller = asyncio.create_task(_poll(samples, start, poll_s, stop))
    records, elapsed = await run_schedule(Target(base_url, model), requests, [r.arrival_s for r in requests])
    stop.set()
    await poller
    return records, samples, elapsed


def run_policy(policy: str, args: argparse.Namespace, requests: list[RequestSpec], port: int) -> dict[str, Any]:
    config = app_config(policy, args)
    # In this process: the poller reads Serve's own status. num_cpus None: Ray counts the CPUs.
    with launch.ours(config, name=APP, in_process=True, port=port, num_cpus=None, timeout_s=300) as url:
        records, samples, _ = asyncio.run(_replay(url, config.model.name, requests, args.poll_s))
    return summarize(policy, records, requests, samples, args)


# -- results -----------------------------------------------------------------------------------------------------------


def request_slo(args: argparse.Namespace) -> list[SloTerm]:
    """Per request: its TTFT and its median ITL within the targets."""
    return parse_slo({"ttft_ms": args.ttft_p99_ms, "itl_p50_ms": args.itl_p50_ms})


def gpu_seconds(samples: list[dict[str, Any]]) -> float:
    """Integral of (prefill + decode replicas) over time, one GPU a replica
    (simulated H100s at TP1), from the polled counts (step-wise)."""
    total = 0.0
    for a, b in zip(samples, samples[1:]):
        total += (b["t"] - a["t"]) * sum(a[p] for p in POOLS)
    return total


def scale_downs(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each time a pool's polled count fell (a replica gone, after its drain)."""
    return [
        {"t_s": b["t"], "pool": p, "from": a[p], "to": b[p]}
        for a, b in zip(samples, samples[1:])
        for p in POOLS
        if b[p] < a[p]
    ]


def around(
    t_s: float, records: list[RequestRecord], requests: list[RequestSpec], window_s: float = 30.0
) -> dict[str, Any]:
    """The requests in flight at any time within `window_s` of `t_s`: how
    many, how many lost (no complete answer), their TTFT p99 and the p99 of
    their gaps between tokens."""
    near = [
        r
        for r, spec in zip(records, requests)
        if spec.arrival_s <= t_s + window_s and spec.arrival_s + (r.e2e_s or math.inf) >= t_s - window_s
    ]
    ok = [r for r in near if r.ok]
    return {
        "requests": len(near),
        "lost": len(near) - len(ok),
        "ttft_p99_ms": percentiles([r.ttft_s for r in ok if r.ttft_s is not None])["p99"],
        "itl_p99_ms": percentiles([g for r in ok for g in r.itl_s])["p99"],
    }


def summarize(
    policy: str,
    records: list[RequestRecord],
    requests: list[RequestSpec],
    samples: list[dict[str, Any]],
    args: argparse.Namespace,
    bin_s: float = 30.0,
) -> dict[str, Any]:
    slo = request_slo(args)
    met = [meets_slo(r, slo) for r in records]
    # per request, the SLO terms it missed (a failed request misses them all)
    missed = [{t.metric for t in slo if not meets_slo(r, [t])} for r in records]
    attainment = sum(met) / len(met) if met else 0.0
    gpu_h = gpu_seconds(samples) / 3600
    intervals = []
    horizon = args.minutes * 60
    for k in range(math.ceil(horizon / bin_s)):
        t0, t1 = k * bin_s, (k + 1) * bin_s
        idx = [i for i, spec in enumerate(requests) if t0 <= spec.arrival_s < t1]
        in_bin = [s for s in samples if t0 <= s["t"] < t1]
        intervals.append(
            {
                "t0_s": t0,
                "offered_rps": len(idx) / bin_s,
                "attainment": sum(met[i] for i in idx) / len(idx) if idx else None,
                "missed": {t.metric: sum(t.metric in missed[i] for i in idx) for t in slo},
                **{p: statistics.fmean(s[p] for s in in_bin) if in_bin else None for p in POOLS},
            }
        )
    ok = [r for r in records if r.ok]
    ttft = percentiles([r.ttft_s for r in ok if r.ttft_s is not None])
    return {
        "policy": policy,
        "requests": len(records),
        "answered": len(ok),
        "attainment": attainment,
        "gpu_hours": gpu_h,
        "attainment_per_gpu_hour": attainment / gpu_h if gpu_h else 0.0,
        "ttft_p50_ms": ttft["p50"],
        "ttft_p99_ms": ttft["p99"],
        "errors": sorted({r.error for r in records if r.error})[:5],
        "itl_p99_ms": percentiles([g for r in ok for g in r.itl_s])["p99"],
        # The minute around each scale-down: requests in flight within 30 s of a replica leaving.
        "scale_downs": [{**d, **around(d["t_s"], records, requests)} for d in scale_downs(samples)],
        "intervals": intervals,
        "samples": samples,
    }


def plot(doc: dict[str, Any], path: Path) -> None:
    runs = doc["runs"]
    fig, axes = report.pyplot().subplots(len(runs) + 1, 1, figsize=(9, 2.6 * (len(runs) + 1)), sharex=True)
    first = runs[0]["intervals"]
    axes[0].plot([i["t0_s"] for i in first], [i["offered_rps"] for i in first], drawstyle="steps-post")
    axes[0].set_ylabel("offered req/s")
    axes[0].set_title(f"{doc['workload']} on the Ray Serve app (simulated H100s), real time")
    for ax, run in zip(axes[1:], runs):
        t = [s["t"] for s in run["samples"]]
        for pool in POOLS:
            ax.plot(t, [s[pool] for s in run["samples"]], drawstyle="steps-post", label=pool)
        ax.set_ylabel("replicas")
        ax.set_title(f"{run['policy']}: {run['attainment']:.1%} within SLO, {run['gpu_hours']:.3f} GPU-h", fontsize=9)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("seconds")
    report.save_figure(fig, path)


def run_experiment(args: argparse.Namespace) -> int:
    workload, requests = WORKLOADS[args.workload](args)
    port = launch.free_port()
    runs = []
    for policy in args.policies.split(","):
        run = run_policy(policy, args, requests, port)
        runs.append(run)
        print(
            f"{policy}: {run['attainment']:.1%} within SLO at {run['gpu_hours']:.3f} GPU-h "
            f"({run['answered']}/{run['requests']} answered)"
        )
    doc = {
        "schema": "orchestrator-autoscale-serve/1",
        "created_at": time.time(),
        "workload": workload,
        "sla": {"ttft_p99_ms": args.ttft_p99_ms, "itl_p50_ms": args.itl_p50_ms},
        "args": {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool))},
        "runs": runs,
    }
    report.write_json(args.out, doc, indent=1)
    plot(doc, Path(args.out).with_suffix(".png"))
    return 0


def main(argv: list[str] | None = None) -> int:
    return launch.main(__doc__, add_arguments, run_experiment, argv)


if __name__ == "__main__":
    raise SystemExit(main())
