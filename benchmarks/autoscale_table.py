"""`python -m benchmarks.autoscale_table RESULT.json ...`: the train/test table
of `benchmarks.autoscale` runs, one row per workload (training set first):
each policy's attainment and GPU-hours, the planner's GPU-hours over the
hindsight optimum's, and attainment per GPU-hour against the best static
split and Ray Serve's default policy."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.report import table

POLICIES = ("hindsight", "planner", "planner-md1", "planner-wait", "foresight", "ray-default", "ray-tuned", "static")


def cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "–"
    split = f"{r['split']}: " if "split" in r else ""
    return f"{split}{r['attainment'] * 100:.2f}% / {r['gpu_hours']:.3f}"


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}×" if a and b else "–"


def row(doc: dict[str, Any]) -> list[str]:
    r = doc["results"]
    planner, hindsight = r.get("planner"), r.get("hindsight")
    per = {k: v["attainment_per_gpu_hour"] for k, v in r.items()}
    return [
        f"{doc['workload']} ({doc['set']})",
        str(doc["requests"]),
        *(cell(r.get(p)) for p in POLICIES),
        ratio(planner and planner["gpu_hours"], hindsight and hindsight["gpu_hours"]),
        ratio(per.get("planner"), per.get("static")),
        ratio(per.get("planner"), per.get("ray-default")),
    ]


def summary(docs: list[dict[str, Any]]) -> str:
    docs = sorted(docs, key=lambda d: (d["set"] != "training", d["workload"]))
    header = [
        "workload (set)",
        "requests",
        *(f"{p}: attainment / GPU-h" for p in POLICIES),
        "planner GPU-h / hindsight",
        "planner per GPU-h / best static",
        "planner per GPU-h / Ray default",
    ]
    return table(header, [row(d) for d in docs])


def main(argv: list[str] | None = None) -> int:
    paths = argv if argv is not None else sys.argv[1:]
    print(summary([json.loads(Path(p).read_text()) for p in paths]), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
