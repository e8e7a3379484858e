"""An autoscale run that takes its static and hindsight baselines from an
earlier run of the same load: reused only where they stand for its own,
checked against the simulator as it is now, and recorded as reused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import autoscale

LOAD = ["--workload", "phases", "--minutes", "1", "--rate", "3", "--interval-s", "10", "--jobs", "1"]


def _run(out: Path, *extra: str) -> dict:
    assert autoscale.main([*LOAD, "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def earlier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("earlier") / "phases.json"
    _run(out, "--policies", "planner,static,hindsight", "--planner-set", "queueing_factor=4")
    return out


def test_a_rerun_with_other_planner_settings_reuses_the_baselines_a_full_run_would_measure(earlier, tmp_path):
    then = json.loads(earlier.read_text())
    full = _run(tmp_path / "full.json", "--policies", "planner,static,hindsight", "--planner-set", "queueing_factor=1")
    reusing = _run(
        tmp_path / "reusing.json",
        "--policies",
        "planner,static,hindsight",
        "--planner-set",
        "queueing_factor=1",
        "--baselines-from",
        str(earlier),
    )
    assert reusing["results"]["planner"] == full["results"]["planner"]
    assert reusing["results"]["static"]["tried"] == full["results"]["static"]["tried"]
    assert reusing["results"]["static"]["split"] == full["results"]["static"]["split"]
    # the earlier grid holds this run's, so its optimum is reused: never easier to beat than this run's own
    assert reusing["results"]["hindsight"] == then["results"]["hindsight"]
    assert reusing["results"]["hindsight"]["gpu_hours"] <= full["results"]["hindsight"]["gpu_hours"] + 1e-9
    record = reusing["baselines"]
    assert record["from"] == str(earlier) and record["hindsight"].startswith("reused")  # outside the repository
    assert record["checked"]["split"] == then["results"]["static"]["split"]
    assert set(record["static_ran"]) == set(full["results"]["static"]["tried"]) - set(
        then["results"]["static"]["tried"]
    )


def test_a_different_load_is_refused_before_anything_runs(earlier, tmp_path):
    with pytest.raises(SystemExit, match="a different load.*requests"):
        autoscale.main([*LOAD[:5], "4", *LOAD[6:], "--out", str(tmp_path / "x.json"), "--baselines-from", str(earlier)])


def test_baselines_the_simulator_no_longer_measures_are_refused(earlier, tmp_path):
    doc = json.loads(earlier.read_text())
    doc["results"]["static"]["attainment"] -= 0.01
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(doc))
    with pytest.raises(SystemExit, match="simulator changed since"):
        _run(tmp_path / "x.json", "--policies", "planner,static", "--baselines-from", str(tampered))


def test_a_grid_larger_than_the_earlier_one_runs_hindsight_in_full(earlier, tmp_path):
    doc = json.loads(earlier.read_text())
    doc["results"]["hindsight"]["grid"] = "1..1P x 1..1D"
    narrow = tmp_path / "narrow.json"
    narrow.write_text(json.dumps(doc))
    rerun = _run(
        tmp_path / "x.json",
        *("--policies", "planner,static,hindsight", "--planner-set", "queueing_factor=4"),
        *("--baselines-from", str(narrow)),
    )
    assert rerun["baselines"]["hindsight"] == "ran"
    assert rerun["results"]["hindsight"] == json.loads(earlier.read_text())["results"]["hindsight"]
