"""The train/test table of autoscale runs: training rows first, the planner's
ratios against the hindsight optimum, the best static split and Ray's default."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from benchmarks.autoscale_table import summary


def _doc(workload: str, set_: str, planner_gpu_h: float) -> dict:
    def result(attainment: float, gpu_h: float, **extra) -> dict:
        return {"attainment": attainment, "gpu_hours": gpu_h, "attainment_per_gpu_hour": attainment / gpu_h, **extra}

    return {
        "workload": workload,
        "set": set_,
        "requests": 100,
        "results": {
            "planner": result(0.99, planner_gpu_h),
            "hindsight": result(0.99, 0.5),
            "ray-default": result(0.99, 2.0),
            "static": result(0.99, 1.0, split="2P+1D"),
        },
    }


def test_training_rows_come_first_with_the_planners_ratios():
    azure = _doc("azure", "training", 0.5)
    azure["results"]["foresight"] = azure["results"]["planner"]
    lines = summary([_doc("bursty", "test", 0.6), azure]).splitlines()
    assert lines[2].startswith("| azure (training) |") and lines[3].startswith("| bursty (test) |")
    cells = [c.strip() for c in lines[3].strip("|").split("|")]
    assert cells[-3:] == ["1.20×", "1.67×", "3.33×"]
    assert "2P+1D: 99.00% / 1.000" in cells and "–" in cells  # foresight: run on azure only
    assert "ray-tuned" not in lines[0]  # no document ran it: no column


def test_a_sweep_of_the_planners_settings_gets_a_column_naming_each_runs():
    def swept(window_intervals: int, damping: float) -> dict:
        doc = _doc("azure", "training", 0.5)
        doc.update(interval_s=10.0, planner={"scale_down_intervals": window_intervals, "trend_damping": damping})
        return doc

    lines = summary([swept(9, 0.8), swept(3, 1.0)]).splitlines()
    assert "scale-down window / trend damping, settings" in lines[0]
    assert lines[2].startswith("| azure (training) | 30 s / 1.0 |")
    assert lines[3].startswith("| azure (training) | 90 s / 0.8 |")
    assert "window" not in summary([swept(9, 0.8)]).splitlines()[0]  # one setting: no column
    waiting = swept(9, 0.8)
    waiting["planner"]["prefill_queueing"] = "wait"  # a --planner-set override
    assert "| 90 s / 0.8, prefill_queueing=wait |" in summary([swept(9, 0.8), waiting])


def test_planner_settings_for_a_sweep_are_config_fields_validated_before_any_run():
    from benchmarks.autoscale import planner_settings

    assert planner_settings(["prefill_queueing=wait", "queueing_factor=2.5"]) == {
        "prefill_queueing": "wait",
        "queueing_factor": 2.5,
    }
    for bad in (
        "no_such_field=1",
        "trend_damping=1",
        "peak_window_s=4",
        "queueing_factor",
    ):  # unknown; own flag; no value
        with pytest.raises(SystemExit, match="FIELD=VALUE"):
            planner_settings([bad])
    with pytest.raises(ValidationError):
        planner_settings(["queueing_factor=-1"])
