"""Dynamo's planner as a peer policy (benchmarks/dynamo_planner.py): the profile it is given, and the
controller that ticks it in the cluster simulator's virtual time. The planner itself runs in its own
environment behind a process boundary; here a scripted stand-in sits on the far side of it."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from benchmarks.dynamo_planner import dynamo_controller, planner_config, profile_fpms
from orchestrator.sim.cluster import ClusterSim, ClusterSpec, ReplicaState
from orchestrator.sim.link import LINKS
from orchestrator.sim.perf_model import Batch, roofline

PERF = roofline("H100", "llama-3.1-8b")


@dataclass(frozen=True)
class Req:
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival_s: float


def arrivals(n: int, rate: float, prompt: int = 1500, seed: int = 0) -> list[Req]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(Req(tuple(rng.randrange(100, 30000) for _ in range(prompt)), 16, t))
    return out


class ScriptedPlanner:
    """The bridge process's interface: a tick every `every_s`, replying with scripted targets."""

    def __init__(self, targets: dict[int, tuple[int | None, int | None]], every_s: float = 10.0) -> None:
        self.targets = targets
        self.every_s = every_s
        self.next_tick_s: float | None = every_s
        self.snapshots: list[dict] = []

    def tick(self, snapshot: dict) -> dict:
        self.snapshots.append(snapshot)
        prefill, decode = self.targets.get(snapshot["tick_ordinal"], (None, None))
        assert self.next_tick_s is not None
        self.next_tick_s += self.every_s
        return {
            "target_prefill": prefill,
            "target_decode": decode,
            "next_tick_s": self.next_tick_s,
            "diagnostics": {"predicted_num_req": 1.0, "engine_rps_prefill": None},
        }


def run(planner: ScriptedPlanner, requests: list[Req], max_replicas: int = 4) -> tuple[ClusterSim, list[dict]]:
    sim = ClusterSim(ClusterSpec(1, 1, num_blocks=40000, report_span_s=10.0), PERF, LINKS["infiniband"])
    log: list[dict] = []
    sim.every(10.0, dynamo_controller(planner, 10.0, 5.0, max_replicas, log)(sim), 30.0)
    sim.run(requests)
    return sim, log


def test_the_profile_sweep_times_each_forward_pass_with_the_performance_model():
    kv_tokens = 100_000
    prefill, decode = profile_fpms(PERF, 4096, 64, kv_tokens)
    assert [f["sum_prefill_tokens"] for f in prefill] == sorted(f["sum_prefill_tokens"] for f in prefill)
    assert max(f["sum_prefill_tokens"] for f in prefill) == 4096
    for f in prefill:
        assert f["num_prefill_requests"] == 1 and f["num_decode_requests"] == 0
        assert f["wall_time"] == PERF.step_time(Batch(prefill=((f["sum_prefill_tokens"], 0),)))
    for f in decode:
        b, kv = f["num_decode_requests"], f["sum_decode_kv_tokens"]
        assert b <= 64 and kv <= kv_tokens and f["num_prefill_requests"] == 0
        assert f["wall_time"] == PERF.step_time(Batch(decode_contexts=(kv // b,) * b))
    assert {f["num_decode_requests"] for f in decode} == {1, 2, 4, 8, 16, 32, 64}


def test_each_tick_reads_the_interval_and_the_pools_and_applies_dynamos_targets_within_the_cap():
    planner = ScriptedPlanner({0: (3, None), 1: (None, 9)})
    requests = arrivals(200, rate=8.0)
    sim, log = run(planner, requests)

    # Traffic as Dynamo's frontend counts it: requests that arrived in the interval, and the shape of those
    # that completed in it; every request counted once.
    first = planner.snapshots[0]
    assert first["tick_ordinal"] == 0
    assert first["traffic"]["duration_s"] == 10.0
    assert first["traffic"]["num_req"] == sum(1 for r in requests if r.arrival_s <= 10.0)
    assert sum(s["traffic"]["num_req"] for s in planner.snapshots) == sum(1 for r in requests if r.arrival_s <= 30.0)
    assert first["traffic"]["avg_isl"] == 1500 and first["traffic"]["avg_osl"] == 16
    assert first["traffic"]["shape_count"] > 0 and first["traffic"]["avg_ttft_ms"] > 0
    assert (first["active_prefill_count"], first["non_draining_prefill_count"]) == (1, 1)
    # Tick 0 asked for 3 prefill replicas: two more start and serve 5 s later, before tick 1...
    second = planner.snapshots[1]
    assert (second["active_prefill_count"], second["non_draining_prefill_count"]) == (3, 3)
    assert len(second["active_prefill_ids"]) == 3
    # ...and tick 1's 9 decode replicas are clamped to the experiment's cap of 4.
    assert sim.count("decode", ReplicaState.STARTING, ReplicaState.READY) == 4
    assert [e["target_prefill"] for e in log] == [3, None, None]
    assert log[0]["predicted_num_req"] == 1.0 and "engine_rps_prefill" not in log[0]


def test_a_tick_off_dynamos_own_schedule_stops_the_run():
    planner = ScriptedPlanner({}, every_s=5.0)  # Dynamo at 5 s, the experiment at 10 s
    planner.next_tick_s = 5.0
    with pytest.raises(RuntimeError, match="asked for a tick at 5.0"):
        run(planner, arrivals(20, rate=2.0))


def test_the_policies_differ_only_in_how_often_dynamo_sizes_the_pools():
    default = planner_config("dynamo", 500.0, 30.0, 10.0, 16)
    fast = planner_config("dynamo-fast", 500.0, 30.0, 10.0, 16)
    assert "throughput_adjustment_interval_seconds" not in default  # Dynamo's own default (180 s)
    assert {k: v for k, v in fast.items() if k != "throughput_adjustment_interval_seconds"} == default
    assert fast["throughput_adjustment_interval_seconds"] == 10
    assert default["max_gpu_budget"] == 32 and default["load_adjustment_interval_seconds"] == 10
    with pytest.raises(ValueError, match="unknown Dynamo policy"):
        planner_config("dynamo-tuned", 500.0, 30.0, 10.0, 16)
