"""The simulators: the simulated engine against the real one and Dynamo's mocker, the roofline against published
figures, the cluster simulator's scale, and simulated disaggregation of a 70B model on one node."""

from __future__ import annotations

import re

from benchmarks.summary.row import RESULTS, Row, Target, geomean, load, span

VALIDATION_RUNS = "sim_validation"  # run-NN.json: the committed runs since the engines poll their queues
ERROR_TARGET = 0.15  # BENCHMARKS "Simulated engine vs the real engine": ≤15% at every point
# Summary fields of a validation run, p50 over every load (ITL: the gaps between streamed tokens)
P50_ERRORS = {
    "TTFT": "ttft_ms_p50",
    "ITL": "itl_ms_p50",
    "TPOT": "tpot_ms_p50",
    "e2e": "e2e_ms_p50",
    "throughput": "throughput",
}
MOCKER_FIGURES = ("TTFT", "TPOT", "e2e", "throughput")  # the mocker has no ITL
SCALE_RUNS = ("simulator/mooncake_16_kv_aware.json", "simulator/replicas_256.json")
# an aggregated run and the disaggregated runs of the same GPUs and load, in the order the row reads them
DISAGG_LONG = (
    (
        "simulator/llama70b_h200_tp2_long_agg4.json",
        ("simulator/llama70b_h200_tp2_long_disagg3p1d.json", "simulator/llama70b_h200_tp2_long_disagg2p2d.json"),
    ),
    ("simulator/llama70b_long_agg.json", ("simulator/llama70b_long_disagg.json",)),
)
DISAGG_SHORT = ("simulator/llama70b_short_agg.json", ("simulator/llama70b_short_disagg.json",))
ROOFLINE_KINDS = {
    "ttft_batch1": "batch-1 TTFT",
    "ttft_burst": "burst TTFT",
    "tpot_burst": "burst TPOT",
    "static_batch": "static batch",
    "saturated": "saturated",
}


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def _signed_pct(x: float) -> str:
    return f"{100 * x:+.0f}%".replace("-", "−")


def _runs_over(by_run: dict[str, float], limit: float) -> str:
    """The runs whose figure is over `limit` ("run 09", "runs 01, 02"), each with its figure where that rounds to
    the limit itself."""
    over = [f"{n} ({100 * v:.1f}%)" if f"{v:.2f}" == f"{limit:.2f}" else n for n, v in by_run.items() if v > limit]
    return f"{'run' if len(over) == 1 else 'runs'} {', '.join(over)}"


def _validation_runs() -> dict[str, str]:
    """Run number → its document under benchmarks/results/, in run order."""
    paths = sorted((RESULTS / VALIDATION_RUNS).glob("run-*.json"))
    return {p.stem.removeprefix("run-"): str(p.relative_to(RESULTS)) for p in paths if re.fullmatch(r"run-\d+", p.stem)}


def _loads(doc: dict) -> list[dict]:
    """A validation run's loads: the concurrency sweep, the Poisson run and the trace replay."""
    return [*doc["sweep"], doc["rate_run"], *([doc["trace_run"]] if doc.get("trace_run") else [])]


def _largest_error(summary: dict) -> float:
    """A run's largest |error| at any load, over the p50 figures and throughput."""
    return max(summary[f"max_abs_error_{field}"] for field in P50_ERRORS.values())


def _self_spread(doc: dict) -> float | None:
    """How far apart the real engine's own rounds came out at p50, the largest over loads and figures."""
    spreads = [v for e in _loads(doc) for v in (e.get("repeatability") or {}).values() if v is not None]
    return max(spreads) if spreads else None


def _sim_vs_real() -> Row:
    runs = _validation_runs()
    docs = {n: load(s) for n, s in runs.items()}
    medians = {
        name: {n: d["summary"][f"median_abs_error_{field}"] for n, d in docs.items()}
        for name, field in P50_ERRORS.items()
    }
    over = [
        f"{name} {_runs_over(by_run, ERROR_TARGET)}"
        for name, by_run in medians.items()
        if any(v > ERROR_TARGET for v in by_run.values())
    ]
    last_no, last = list(docs.items())[-1]
    s = last["summary"]
    last_figures = ", ".join(
        f"{name} {_pct(s[f'max_abs_error_{f}'])}/{_pct(s[f'median_abs_error_{f}'])}" for name, f in P50_ERRORS.items()
    )
    matched = [n for n, d in docs.items() if d["knee"]["real"] == d["knee"]["sim"]]
    largest = [_largest_error(d["summary"]) for d in docs.values()]
    spread = {n: v for n, v in ((n, _self_spread(d)) for n, d in docs.items()) if v is not None}
    result = (
        f"{len(docs)} committed runs since the engines poll (runs {', '.join(docs)}). Median |error| at p50 over "
        f"the loads, range over runs: "
        + ", ".join(f"{name} {span((100 * v for v in m.values()), '{:.0f}')}%" for name, m in medians.items())
        + f"; above {_pct(ERROR_TARGET)}: {'; '.join(over) or 'none'}. Last run ({last_no}) max/median: "
        f"{last_figures}; knee real c={last['knee']['real']}, simulated c={last['knee']['sim']}. Knee matched in "
        f"{len(matched)} of {len(docs)} (runs {', '.join(matched)}). Largest error of a run "
        f"{span((100 * v for v in largest), '{:.0f}')}%. The real engine against itself (runs "
        f"{', '.join(spread)}, {'/'.join(sorted({str(docs[n]['rounds']) for n in spread}))} rounds minutes apart): "
        "p50s up to " + ", ".join(f"{_pct(v)} (run {n})" for n, v in spread.items()) + " apart"
    )
    met = max(largest) <= ERROR_TARGET
    return Row(
        "simulator vs real engine (from its profile)",
        result,
        tuple(runs.values()),
        (Target(f"≤{_pct(ERROR_TARGET)} at every point (p50 and throughput, every load, every run)", met),),
    )


def _same_errors(run_summary: dict, mocker_side: dict) -> bool:
    """Whether a validation run's errors are those mocker_validation gives for our simulator: the run whose real
    side the mocker was compared with."""
    return all(
        run_summary[f"{stat}_abs_error_{field}"] == mocker_side[field][f"{stat}_abs_error"]
        for field in P50_ERRORS.values()
        for stat in ("max", "median")
    )


def _mocker() -> Row:
    source = "mocker_validation.json"
    doc = load(source)
    runs = _validation_runs()
    ours = doc["summary"]["ours"]
    (run_no,) = [n for n, s in runs.items() if _same_errors(load(s)["summary"], ours)]
    mocker = doc["summary"]["mocker"]

    def errors(e: dict) -> str:
        return f"{_pct(e['max_abs_error'])}/{_pct(e['median_abs_error'])}"

    figures = {name: P50_ERRORS[name] for name in MOCKER_FIGURES}
    closer_ours = [n for n, f in figures.items() if ours[f]["median_abs_error"] < mocker[f]["median_abs_error"]]
    closer_mocker = [n for n, f in figures.items() if mocker[f]["median_abs_error"] < ours[f]["median_abs_error"]]
    result = (
        f"the committed run, on validation run {run_no}'s real side (the last validation run is {list(runs)[-1]}): "
        f"|error| at p50 over the loads, max/median, ours vs Dynamo {doc['dynamo']}'s mocker: "
        + ", ".join(f"{n} {errors(ours[f])} vs {errors(mocker[f])}" for n, f in figures.items())
        + f"; ITL ours {errors(ours['itl_ms_p50'])} (the mocker streams no tokens to time). Closer at the median: "
        f"ours on {', '.join(closer_ours) or 'nothing'}; the mocker on {', '.join(closer_mocker) or 'nothing'}"
    )
    return Row(
        "simulator vs Dynamo's mocker (same profile, same requests)",
        result,
        (source, runs[run_no]),
    )


def _roofline() -> Row:
    source = "roofline_vs_published.json"
    rows = load(source)["rows"]
    inside = [r for r in rows if not r["outlier"]]
    outliers = [r for r in rows if r["outlier"]]
    served_tpot = [r["ratio"] for r in inside if r["kind"] == "tpot_burst" and r["engine"].startswith("vLLM")]
    by_kind = {name: geomean(r["ratio"] for r in inside if r["kind"] == k) for k, name in ROOFLINE_KINDS.items()}
    outlier_setups: dict[str, list[float]] = {}
    for r in outliers:
        setup = f"{r['engine']} {r['gpu']}×{r['tp']} {r['model']} {ROOFLINE_KINDS[r['kind']]}"
        outlier_setups.setdefault(setup, []).append(r["ratio"])

    def names(key: str) -> str:
        return ", ".join(sorted({r[key].split(" ")[0] for r in rows}))

    result = (
        f"{len(rows)} published figures (engines {names('engine')}; GPUs {names('gpu')}), predicted / published: "
        f"over all {len(rows)} {span((r['ratio'] for r in rows), '{:.2f}')}×, geometric mean "
        f"{geomean(r['ratio'] for r in rows):.2f}; the {len(inside)} not marked as outliers "
        f"{span((r['ratio'] for r in inside), '{:.2f}')}×, geometric mean {geomean(r['ratio'] for r in inside):.2f} "
        f"(by kind " + ", ".join(f"{k} {v:.2f}" for k, v in by_kind.items()) + "). Served vLLM TPOT within "
        f"{span((100 * abs(x - 1) for x in served_tpot), '{:.0f}')}%. Outliers: "
        + "; ".join(f"{s} " + ", ".join(f"×{x:.2f}" for x in xs) for s, xs in outlier_setups.items())
    )
    return Row("roofline vs published figures", result, (source,))


def _label(doc: dict) -> re.Match[str]:
    """A simulator run's layout from its label: prefill and decode replicas, GPU."""
    m = re.search(r"(\d+)P\+(\d+)D (\w+)", doc["system"]["label"])
    assert m, doc["system"]["label"]
    return m


def _gpus(doc: dict) -> int:
    m = re.search(r"(\d+) simulated", doc["system"]["notes"])
    assert m, doc["system"]["notes"]
    return int(m.group(1))


def _cluster_scale() -> Row:
    trace, rate = (load(s) for s in SCALE_RUNS)
    t, r = trace["knee"], rate["knee"]
    tp, td, gpu = _label(trace).groups()
    rp, rd, _ = _label(rate).groups()
    result = (
        f"{trace['load']['requests']:,} requests of the Mooncake trace ({t['duration_s'] / 60:.0f} min, full-size "
        f"prompts) on {int(tp) + int(td)} simulated {gpu}s ({trace['system']['model']}, KV-aware): "
        f"{trace['load']['simulator_cpu_s']:.0f} s of CPU, TTFT p50/p99 {t['ttft_ms']['p50']:.0f} ms / "
        f"{t['ttft_ms']['p99'] / 1e3:.1f} s. {int(rp) + int(rd)} replicas ({rp} prefill + {rd} decode) at "
        f"{rate['load']['rate']:.0f} req/s, {rate['load']['requests']:,} requests: "
        f"{rate['load']['simulator_cpu_s']:.0f} s of CPU; served {r['request_throughput']:.0f} req/s, TTFT p50/p99 "
        f"{r['ttft_ms']['p50']:.0f}/{r['ttft_ms']['p99']:.0f} ms, prefix hits {_pct(r['prefix_hit_rate'])}"
    )
    return Row("cluster simulator scale", result, SCALE_RUNS)


def _goodput_per_gpu(doc: dict) -> float:
    return doc["knee"]["goodput_requests"] / _gpus(doc)


def _layout(doc: dict) -> str:
    p, d, _ = _label(doc).groups()
    return f"{d} aggregated" if p == "0" else f"{p}P+{d}D"


def _hardware(doc: dict) -> str:
    p, d, gpu = _label(doc).groups()
    return f"{gpu} TP{_gpus(doc) // (int(p) + int(d))}"


def _against_aggregated(agg: dict, disaggs: list[dict]) -> str:
    """Goodput per GPU of each disaggregated layout against the aggregated one on the same GPUs."""
    a = _goodput_per_gpu(agg)
    split = ", ".join(
        f"{_layout(d)} {_goodput_per_gpu(d):.3f} ({_signed_pct(_goodput_per_gpu(d) / a - 1)})" for d in disaggs
    )
    return f"{_hardware(agg)}: {split} vs {_layout(agg)} {a:.3f}"


def _disaggregation() -> Row:
    long = [(load(a), [load(d) for d in ds]) for a, ds in DISAGG_LONG]
    short_agg, short_disaggs = load(DISAGG_SHORT[0]), [load(d) for d in DISAGG_SHORT[1]]
    best_agg, (best, *_) = long[0]
    slo, isl, osl = best["slo"], best["dataset"]["isl"]["mean"], best["dataset"]["osl"]["mean"]
    result = (
        f"goodput per GPU at the knee, req/s (TTFT p99 ≤ {slo['ttft_p99_ms'] / 1e3:g} s, ITL p50 ≤ "
        f"{slo['itl_p50_ms']:g} ms). ISL {isl} / OSL {osl}: "
        + "; ".join(_against_aggregated(a, ds) for a, ds in long)
        + f"; ITL p99 at the knee {_layout(best)} {best['knee']['itl_ms']['p99']:.0f} ms vs {_layout(best_agg)} "
        f"{best_agg['knee']['itl_ms']['p99']:.0f}. Short unique prompts (ISL {short_agg['dataset']['isl']['mean']}), "
        f"{_against_aggregated(short_agg, short_disaggs)}"
    )
    sources = tuple(dict.fromkeys(s for a, ds in (*DISAGG_LONG, DISAGG_SHORT) for s in (a, *ds)))
    return Row(f"simulated disaggregation, {best['system']['model']} on {_gpus(best)} GPUs", result, sources)


def rows() -> list[Row]:
    return [_sim_vs_real(), _mocker(), _roofline(), _cluster_scale(), _disaggregation()]
