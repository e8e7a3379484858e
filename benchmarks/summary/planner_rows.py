"""The SLA planner: the train/test table against a hindsight optimum (cluster simulator), and the planner on the Ray
Serve application in real time."""

from __future__ import annotations

from benchmarks.summary.row import RESULTS, Row, Target, load, ratio

# one document a load: `python -m benchmarks.autoscale`, the planner at the shipped defaults
TRAIN_TEST = "simulator/autoscale_shipped"
# BENCHMARKS "### Train/test with a hindsight optimum": the planner's targets against the other policies
# issue 36: attainment >= min(99%, the hindsight optimum's less half a point)
ATTAINMENT_CEILING = 0.99
ATTAINMENT_POINTS_BELOW_HINDSIGHT = 0.5
GPU_HOURS_OVER_HINDSIGHT = 1.15  # at most 1.15× its GPU-hours
PER_GPU_HOUR_OVER_STATIC = 1.0  # attainment per GPU-hour at least the best static split's
PER_GPU_HOUR_OVER_RAY_DEFAULT = 3.0  # and at least 3× Ray Serve's default policy's
WORKLOADS = {
    "azure": "Azure conversation trace",
    "phases": "sinusoidal phases",
    "bursty-prefill": "bursty prefill-heavy",
    "decode-heavy": "decode-heavy",
    "diurnal": "diurnal ramp",
    "mooncake": "Mooncake conversation trace",
}
# the planner beside NVIDIA Dynamo 1.6.1's planner (benchmarks/dynamo_planner.py), one document a load
DYNAMO = "simulator/autoscale_dynamo"
DYNAMO_POLICIES = {"dynamo": "its defaults", "dynamo-fast": "deciding every interval"}
SERVE_RUN = "autoscale_serve/phases.json"  # planner, Ray Serve's autoscaler and a static split, one machine
# the planner on a quiet machine, decode step calibration on (now the default) and off, one after the other
SERVE_QUIET = "autoscale_serve/phases_arriving.json"
# a 10 s interval and 90 s window beside the 30 s window the runs above had, one after the other
SERVE_DEFAULTS = "autoscale_serve/phases_defaults.json"
# the fast loop at that interval and window, and the planner without it, one after the other
SERVE_FAST = "autoscale_serve/phases_defaults_fast.json"
# the shipped defaults since 2026-12-07 (the wait rule at factor 4, the fast loop) and the static split, one
# after the other
SERVE_SHIPPED = "autoscale_serve/phases_shipped.json"
# the same on the bursty prefill-heavy test load
SERVE_TEST = "autoscale_serve/bursty_prefill_shipped.json"
SERVE_TEST_FIRST = "autoscale_serve/bursty_prefill_shipped_first.json"  # the same, run before (no miss causes)
SERVE_ATTAINMENT = 0.95  # issue 36: the real app holds >= 95% of requests within the SLO


def _pct(x: float, decimals: int = 2) -> str:
    return f"{100 * x:.{decimals}f}%"


def _train_test_sources() -> list[str]:
    """The train/test table's documents: training set first, then test, each by workload (as autoscale_table)."""
    paths = [str(p.relative_to(RESULTS)) for p in (RESULTS / TRAIN_TEST).glob("*.json")]
    table = [s for s in paths if "hindsight" in load(s)["results"]]
    return sorted(table, key=lambda s: (load(s)["set"] != "training", load(s)["workload"]))


def _sla(sla: dict) -> str:
    return f"TTFT p99 ≤ {sla['ttft_p99_ms']:.0f} ms, ITL p50 ≤ {sla['itl_p50_ms']:.0f} ms"


def _at(r: dict, decimals: int = 2) -> str:
    """A policy's attainment and GPU-hours."""
    return f"{_pct(r['attainment'], decimals)} at {r['gpu_hours']:.3f}"


def _per_gpu_hour(planner: dict, other: dict) -> float:
    """The planner's attainment per GPU-hour over another policy's."""
    return planner["attainment_per_gpu_hour"] / other["attainment_per_gpu_hour"]


def _train_test_row(source: str) -> Row:
    doc = load(source)
    r = doc["results"]
    planner, hindsight, static = r["planner"], r["hindsight"], r["static"]
    ray_default, ray_tuned = r["ray-default"], r["ray-tuned"]
    under_target = hindsight["attainment"] < hindsight["target"]
    result = (
        f"planner {_pct(planner['attainment'])} within SLO at {planner['gpu_hours']:.3f} GPU-h; hindsight optimum "
        f"{_at(hindsight)}"
        + (f" (under its {100 * hindsight['target']:.0f}% target)" if under_target else "")
        + f": planner {ratio(planner['gpu_hours'], hindsight['gpu_hours'])} its GPU-hours. Per GPU-hour the "
        f"planner is ×{_per_gpu_hour(planner, static):.2f} the best static split ({static['split']}: {_at(static)}), "
        f"×{_per_gpu_hour(planner, ray_default):.2f} Ray Serve's default policy ({_at(ray_default)}), "
        f"×{_per_gpu_hour(planner, ray_tuned):.2f} Ray's policy tuned ({_at(ray_tuned)})"
    )
    floor = min(ATTAINMENT_CEILING, hindsight["attainment"] - ATTAINMENT_POINTS_BELOW_HINDSIGHT / 100)
    targets = (
        Target(
            f"attainment ≥ min({_pct(ATTAINMENT_CEILING, 0)}, the hindsight optimum's − "
            f"{ATTAINMENT_POINTS_BELOW_HINDSIGHT:g} point) = {_pct(floor)}",
            planner["attainment"] >= floor - 1e-12,
        ),
        Target(
            f"GPU-hours ≤ ×{GPU_HOURS_OVER_HINDSIGHT:.2f} the hindsight optimum's",
            planner["gpu_hours"] / hindsight["gpu_hours"] <= GPU_HOURS_OVER_HINDSIGHT,
        ),
        Target(
            f"per GPU-hour ≥ ×{PER_GPU_HOUR_OVER_STATIC:g} the best static split",
            _per_gpu_hour(planner, static) >= PER_GPU_HOUR_OVER_STATIC,
        ),
        Target(
            f"per GPU-hour ≥ ×{PER_GPU_HOUR_OVER_RAY_DEFAULT:g} Ray's default",
            _per_gpu_hour(planner, ray_default) >= PER_GPU_HOUR_OVER_RAY_DEFAULT,
        ),
    )
    what = (
        f"SLA planner, {WORKLOADS.get(doc['workload'], doc['workload'])} ({doc['set']} set; {doc['requests']:,} "
        f"requests, simulated {doc['gpu']}s, {doc['model']}, {_sla(doc['sla'])}, {doc['interval_s']:.0f} s interval)"
    )
    return Row(what, result, (source,), targets)


def _split(run: dict) -> str:
    """An autoscale_serve run's static split, as P+D."""
    return "P+".join(run["args"]["static"].split("+")) + "D"


def _serve_row() -> Row:
    doc, quiet, defaults, fast = load(SERVE_RUN), load(SERVE_QUIET), load(SERVE_DEFAULTS), load(SERVE_FAST)
    shipped_run, test_run = load(SERVE_SHIPPED), load(SERVE_TEST)
    now = {r["policy"]: r for r in shipped_run["runs"]}
    test = {r["policy"]: r for r in test_run["runs"]}
    first = {r["policy"]: r for r in load(SERVE_TEST_FIRST)["runs"]}
    runs = {r["policy"]: r for r in doc["runs"]}
    planner, ray_default, static = runs["planner"], runs["ray-default"], runs["static"]
    # In this run `planner` had decode step calibration off (the default then), `planner-calibrated` on.
    reruns = {r["policy"]: r for r in quiet["runs"]}
    calibrated, uncalibrated = reruns["planner-calibrated"], reruns["planner"]
    static_split = _split(doc)
    shipped = {r["policy"]: r for r in defaults["runs"]}
    with_fast = {r["policy"]: r for r in fast["runs"]}
    runs_since = (*quiet["runs"], *defaults["runs"], *fast["runs"], *now.values(), *test.values(), *first.values())
    unanswered = sum(r["requests"] - r["answered"] for r in (*doc["runs"], *runs_since))
    scale_downs = [s for r in runs_since for s in r["scale_downs"]]
    result = (
        f"{doc['workload']}, {doc['args']['sim_model']}-class engines, {_sla(doc['sla'])}, shared machine: planner "
        f"{_at(planner, 1)} GPU-h, Ray Serve's autoscaler (defaults) {_at(ray_default, 1)}, static {static_split} "
        f"{_at(static, 1)}; per GPU-h the planner is ×{_per_gpu_hour(planner, static):.2f} static at "
        f"{100 * (static['attainment'] - planner['attainment']):.1f} points less attainment, "
        f"×{_per_gpu_hour(planner, ray_default):.2f} Ray's. On a quiet machine, a 30 s stabilisation window: the "
        f"decode step calibrated from what the replicas measure (the default since 2026-12-06) "
        f"{_at(calibrated, 1)} GPU-h, without the calibration {_at(uncalibrated, 1)}. A 10 s interval and 90 s "
        f"window {_at(shipped['planner'], 1)} GPU-h, the 30 s window in the same session "
        f"{_at(shipped['planner-window30'], 1)}; with the fast loop (`fast_interval_s: 2`) "
        f"{_at(with_fast['planner-fast'], 1)} GPU-h, without it in the same session {_at(with_fast['planner'], 1)}. "
        f"The shipped defaults (since 2026-12-07: also the wait rule at factor 4 and the fast loop) "
        f"{_at(now['planner'], 1)} GPU-h, static {_split(shipped_run)} in the same session {_at(now['static'], 1)}: "
        f"per GPU-h ×{_per_gpu_hour(now['planner'], now['static']):.2f} static. On the test load "
        f"{test_run['workload']}, {_sla(test_run['sla'])}: planner {_at(test['planner'], 1)} GPU-h, static "
        f"{_split(test_run)} {_at(test['static'], 1)}, per GPU-h "
        f"×{_per_gpu_hour(test['planner'], test['static']):.2f} (a first run: planner {_at(first['planner'], 1)}, "
        f"static {_at(first['static'], 1)}); "
        f"{sum(s['lost'] for s in scale_downs)} lost at these runs' {len(scale_downs)} scale-downs. Requests "
        f"unanswered: {unanswered}"
    )
    sources = (SERVE_RUN, SERVE_QUIET, SERVE_DEFAULTS, SERVE_FAST, SERVE_SHIPPED, SERVE_TEST, SERVE_TEST_FIRST)
    targets = (
        Target(
            f"≥ {_pct(SERVE_ATTAINMENT, 0)} within SLO, the shipped defaults",
            now["planner"]["attainment"] >= SERVE_ATTAINMENT,
        ),
        Target(
            "per GPU-hour ≥ the static split's, the shipped defaults",
            _per_gpu_hour(now["planner"], now["static"]) >= 1.0,
        ),
        Target(
            f"≥ {_pct(SERVE_ATTAINMENT, 0)} within SLO on the test load",
            test["planner"]["attainment"] >= SERVE_ATTAINMENT,
        ),
        Target(
            "per GPU-hour ≥ the static split's on the test load", _per_gpu_hour(test["planner"], test["static"]) >= 1.0
        ),
    )
    return Row("SLA planner on the Ray Serve app, real time (simulated engines)", result, sources, targets)


def _dynamo_row() -> Row:
    sources = sorted(
        (str(p.relative_to(RESULTS)) for p in (RESULTS / DYNAMO).glob("*.json")),
        key=lambda s: (load(s)["set"] != "training", load(s)["workload"]),
    )
    cells, ahead, behind_per_gpu_hour = [], True, []
    for source in sources:
        doc = load(source)
        r = doc["results"]
        planner = r["planner"]
        peers = [r[p] for p in DYNAMO_POLICIES]
        ahead &= all(planner["attainment"] >= d["attainment"] for d in peers)
        if any(_per_gpu_hour(planner, d) < 1 for d in peers):
            behind_per_gpu_hour.append(doc["workload"])
        cells.append(
            f"{doc['workload']} ({doc['set']}) planner {_at(planner)}, Dynamo "
            + " / ".join(f"{_at(d)}" for d in peers)
            + " (per GPU-h ×"
            + " / ×".join(f"{_per_gpu_hour(planner, d):.2f}" for d in peers)
            + ")"
        )
    result = (
        "attainment at GPU-h, Dynamo "
        + " / ".join(DYNAMO_POLICIES.values())
        + "; its 1.6.1 perf model (AISimulate) replaced by its FPM regression models: "
        + "; ".join(cells)
    )
    targets = (
        Target("attainment ≥ Dynamo's planner's on every load", ahead),
        Target(
            "attainment per GPU-hour ≥ Dynamo's on every load"
            + (f" (behind on {', '.join(behind_per_gpu_hour)})" if behind_per_gpu_hour else ""),
            not behind_per_gpu_hour,
        ),
    )
    what = (
        "SLA planner beside NVIDIA Dynamo 1.6.1's planner (cluster simulator, the train/test loads; our planner "
        "at the shipped defaults: the wait rule at factor 4, the fast loop every 2 s)"
    )
    return Row(what, result, tuple(sources), targets)


def rows() -> list[Row]:
    return [*(_train_test_row(s) for s in _train_test_sources()), _dynamo_row(), _serve_row()]
