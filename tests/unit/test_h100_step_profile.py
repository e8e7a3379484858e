"""The GPU step profiler (benchmarks/gpu/h100_step_profile.py, issue 40) on CPU with a tiny shape: it runs as
the one command the GPU machine gets, writes a profile the simulator loads, and the roofline comparison reads
it. No timing claim: the numbers are a CPU's."""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import roofline_vs_measured
from benchmarks.gpu import h100_step_profile as profiler
from orchestrator.sim.perf_model import Batch, ProfileModel

SCRIPT = Path(profiler.__file__)
TINY = ["--isl", "16,48", "--batch", "1,2", "--context", "32,64", "--chunk-tokens", "32", "--copy-blocks", "1,4"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("h100_step_profile")
    cmd = [sys.executable, str(SCRIPT), "--device", "cpu", "--shapes", "tiny", "--out", str(out), *TINY,
           "--warmup", "1", "--repeats", "2", "--time-limit-s", "120"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def test_every_point_is_measured_in_its_part(run):
    raw = json.loads((run / "raw.json").read_text())
    assert {part: o["status"] for part, o in raw["parts"].items()} == {"tiny": "ok", "copies": "ok"}
    points = [p for p in raw["points"] if p["kind"] != "environment"]
    assert not [p for p in points if "seconds" not in p], "a point failed or was skipped"
    assert all(p["seconds"] > 0 for p in points)
    by_kind = {
        k: [p for p in points if p["kind"] == k] for k in ("layer_prefill", "layer_decode", "lm_head", "kv_copy")
    }
    # ISL 48 with 32-token chunks runs as (32 new, 0 cached) then (16 new, 32 cached), as vLLM chunks it.
    assert {(p["tokens"], p["context"]) for p in by_kind["layer_prefill"]} == {(16, 0), (32, 0), (16, 32)}
    assert {(p["batch"], p["context"], p["layout"]) for p in by_kind["layer_decode"]} == {
        (b, c, layout) for b in (1, 2) for c in (32, 64) for layout in ("contiguous", "paged")
    }
    assert {p["sequences"] for p in by_kind["lm_head"]} == {1, 2}
    assert {(p["direction"], p["blocks"]) for p in by_kind["kv_copy"]} == {
        (d, n) for d in ("d2d", "d2h", "h2d") for n in (1, 4)
    }
    assert not any(p["graph"] for p in points), "CUDA graphs on a CPU"


def test_the_profile_is_the_whole_model_and_the_simulator_loads_it(run):
    raw = json.loads((run / "raw.json").read_text())["points"]
    layer = {(p["tokens"], p["context"]): p["seconds"] for p in raw if p["kind"] == "layer_prefill"}
    decode = {(p["batch"], p["context"]): p["seconds"] for p in raw if p.get("layout") == "contiguous"}
    lm_head = {p["sequences"]: p["seconds"] for p in raw if p["kind"] == "lm_head"}
    doc = json.loads((run / "profile-tiny.json").read_text())
    layers = profiler.SHAPES["tiny"].layers

    assert doc["schema"] == "orchestrator-profile/1"
    assert [(p["tokens"], p["chunks"]) for p in doc["prefill"]] == [(16, 1), (48, 2)]
    assert doc["prefill"][1]["seconds"] == pytest.approx(layers * (layer[32, 0] + layer[16, 32]) + lm_head[1])
    assert [(p["batch"], p["context"]) for p in doc["decode"]] == [(1, 32), (1, 64), (2, 32), (2, 64)]
    assert doc["decode"][3]["step_seconds"] == pytest.approx(layers * decode[2, 64] + lm_head[2])
    assert doc["kv_bytes_per_token"] == 2 * layers * 2 * 16 * 2

    model = ProfileModel.load(run / "profile-tiny.json")
    assert model.step_time(Batch(decode_contexts=(64, 64))) > 0
    assert model.step_time(Batch(prefill=((48, 0),))) == pytest.approx(doc["prefill"][1]["seconds"])


def test_the_roofline_comparison_reads_the_profile(run, tmp_path):
    doc = roofline_vs_measured.main([str(run / "profile-tiny.json"), "--out", str(tmp_path / "cmp.json")])
    assert [(r["kind"], r.get("tokens"), r.get("batch")) for r in doc["rows"]][:2] == [
        ("prefill", 16, None),
        ("prefill", 48, None),
    ]
    assert len(doc["rows"]) == 6
    for r in doc["rows"]:
        assert r["error_device"] == pytest.approx(r["roofline_device_s"] / r["measured_s"])
        assert r["roofline_step_s"] > r["roofline_device_s"]  # the step adds the roofline's host overhead
    assert not any(r["matters"] for r in doc["rows"])  # tiny grids hold none of the points that matter
    assert doc["summary"]["verdict"] == "none: no point that matters was measured"
    assert (tmp_path / "cmp.md").read_text().count("| tiny |") == 6


def test_a_roofline_error_at_a_point_that_matters_asks_for_a_refit():
    profile = {
        "meta": {"sim_model": "llama-3.1-8b", "tensor_parallel_size": 1, "chunk_tokens": 8192,
                 "shape": {"name": "llama-3.1-8b"}},
        "prefill": [],
        "decode": [{"batch": 32, "context": 2048, "step_seconds": 1.0}],  # far slower than any roofline
    }  # fmt: skip
    rows = roofline_vs_measured.compare(profile, "H100")
    assert rows[0]["matters"] and rows[0]["error_device"] < 0.1
    assert roofline_vs_measured.summary(rows)["verdict"].startswith("refit: ")
    # The same point measured at 1.1x the roofline's device term is within the tolerance.
    profile["decode"][0]["step_seconds"] = rows[0]["roofline_device_s"] * 1.1
    rows = roofline_vs_measured.compare(profile, "H100")
    assert roofline_vs_measured.summary(rows)["verdict"] == "within 15% at all 1 points that matter"


def test_a_cut_run_keeps_what_it_measured(tmp_path):
    """A point past the deadline is recorded as skipped, a failing point as its error, and a line cut by a kill
    is dropped; the profile is built from what remains."""
    torch = pytest.importorskip("torch")
    out = tmp_path / "raw.jsonl"
    args = argparse.Namespace(deadline=time.time() + 60, warmup=0, repeats=1, no_graphs=True)
    bench = profiler.Bench(torch, torch.device("cpu"), args, out)
    bench.point({"shape": "tiny", "kind": "lm_head", "sequences": 1}, lambda: ((lambda: None), False))
    bench.point({"kind": "broken"}, lambda: (_ for _ in ()).throw(RuntimeError("no kernel")))
    args.deadline = time.time() - 1
    bench.point({"shape": "tiny", "kind": "lm_head", "sequences": 2}, lambda: ((lambda: None), False))
    with out.open("a") as f:
        f.write('{"shape": "tiny", "kind": "layer_dec')
    points = profiler.read_points(out)
    assert [("seconds" in p, p.get("error"), p.get("skipped")) for p in points] == [
        (True, None, None),
        (False, "RuntimeError: no kernel", None),
        (False, None, "time limit"),
    ]
    grid = argparse.Namespace(isl="16", chunk_tokens=32)
    assert profiler.build_profile(profiler.SHAPES["tiny"], points, grid) is None  # no layer point: no profile
