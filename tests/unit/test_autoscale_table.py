"""The train/test table of autoscale runs: training rows first, the planner's
ratios against the hindsight optimum, the best static split and Ray's default."""

from __future__ import annotations

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
    lines = summary([_doc("bursty", "test", 0.6), _doc("azure", "training", 0.5)]).splitlines()
    assert lines[2].startswith("| azure (training) |") and lines[3].startswith("| bursty (test) |")
    cells = [c.strip() for c in lines[3].strip("|").split("|")]
    assert cells[-3:] == ["1.20×", "1.67×", "3.33×"]
    assert "2P+1D: 99.00% / 1.000" in cells and "–" in cells  # a policy not run
