"""`python -m benchmarks.autoscale_table [--policies a,b,...] RESULT.json ...`: the train/test table
of `benchmarks.autoscale` runs, one row per workload (training set first):
each policy's attainment and GPU-hours, the planner's GPU-hours over the
hindsight optimum's, and attainment per GPU-hour against the best static
split and Ray Serve's default policy."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.autoscale import RECORDED_SETTINGS
from benchmarks.report import table

POLICIES = (
    "hindsight",
    "planner",
    "planner-slow",
    "planner-kingman",
    "planner-uncalibrated",
    "planner-md1",
    "planner-wait",  # runs before 2026-12-07: the wait rule (now the default's)
    "planner-fast",  # runs before 2026-12-07: the fast loop (now on by default)
    "foresight",
    "ray-default",
    "ray-tuned",
    "static",
)


def cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "–"
    split = f"{r['split']}: " if "split" in r else ""
    return f"{split}{r['attainment'] * 100:.2f}% / {r['gpu_hours']:.3f}"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a and b else "–"


def settings(doc: dict[str, Any]) -> str:
    """The planner's scale-down window and trend damping in this run, and its `--planner-set` overrides."""
    planner = doc.get("planner", {})
    window = planner.get("scale_down_intervals", 0) * doc.get("interval_s", 0)
    overrides = [f", {k}={v}" for k, v in sorted(planner.items()) if k not in RECORDED_SETTINGS]
    return f"{window:g} s / {planner.get('trend_damping', '–')}{''.join(overrides)}"


def row(doc: dict[str, Any], policies: tuple[str, ...] = POLICIES, with_settings: bool = False) -> list[str]:
    r = doc["results"]
    planner, hindsight = r.get("planner"), r.get("hindsight")
    per = {k: v["attainment_per_gpu_hour"] for k, v in r.items()}
    return [
        f"{doc['workload']} ({doc['set']})",
        *([settings(doc)] if with_settings else []),
        str(doc["requests"]),
        *(cell(r.get(p)) for p in policies),
        ratio(planner and planner["gpu_hours"], hindsight and hindsight["gpu_hours"]),
        ratio(per.get("planner"), per.get("static")),
        ratio(per.get("planner"), per.get("ray-default")),
    ]


def summary(docs: list[dict[str, Any]], policies: tuple[str, ...] = POLICIES) -> str:
    """One row a document; a column for each of `policies` some document ran."""
    docs = sorted(docs, key=lambda d: (d["set"] != "training", d["workload"], settings(d)))
    policies = tuple(p for p in policies if any(p in d["results"] for d in docs))
    with_settings = len({settings(d) for d in docs}) > 1  # a sweep of the planner's settings
    header = [
        "workload (set)",
        *(["scale-down window / trend damping, settings"] if with_settings else []),
        "requests",
        *(f"{p}: attainment / GPU-h" for p in policies),
        "planner GPU-h / hindsight",
        "planner per GPU-h / best static",
        "planner per GPU-h / Ray default",
    ]
    return table(header, [row(d, policies, with_settings) for d in docs])


def main(argv: list[str] | None = None) -> int:
    """Arguments: result documents; `--policies a,b,...` (first) picks the columns."""
    paths = list(sys.argv[1:] if argv is None else argv)
    policies = POLICIES
    if paths[:1] == ["--policies"]:
        policies, paths = tuple(paths[1].split(",")), paths[2:]
    print(summary([json.loads(Path(p).read_text()) for p in paths], policies), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
