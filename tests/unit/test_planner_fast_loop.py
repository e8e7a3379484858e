"""The planner's fast loop (issue 36, item 2): between interval steps it re-reads what the engines hold now and
raises a short pool at once; it never lowers one, and the steps after it keep the raise through their
stabilisation window. Scripted lifecycles in virtual time, observations in, decisions out; then the same
through Serve's policy and the cluster simulator."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from orchestrator.config import PlannerConfig, PoolBounds, SlaConfig
from orchestrator.planner.planner import Observation, SlaPlanner
from orchestrator.sim.perf_model import ProfileModel
from tests.unit.test_planner_policy import DECODE, PREFILL, app_args, ctx

# prefill 1 ms per 10 tokens (10,000 prompt tokens/s flat out); a decode step 10 ms + 1 ms per sequence, so a
# replica holds 20 streams within the 30 ms ITL target (as tests/unit/test_planner_faults.py)
PROFILE = ProfileModel(
    prefill_points=[(100, 0.01), (10_000, 1.0)],
    decode_points={1: [(100, 0.011), (10_000, 0.011)], 101: [(100, 0.111), (10_000, 0.111)]},
    kv_bytes=1,
)
SLA = SlaConfig(ttft_p99_ms=600, itl_p50_ms=30)
QUIET = dict(interval_s=10, requests=20, mean_isl=1000, mean_osl=200)  # 2 req/s: 1 prefill, 1 decode


def planner(acting: bool = True, **cfg) -> SlaPlanner:
    config = PlannerConfig(
        mode="act" if acting else "advisory",
        predictor="constant",
        prefill=PoolBounds(min_replicas=1, max_replicas=20),
        decode=PoolBounds(min_replicas=1, max_replicas=20),
        decode_utilization=1.0,
        scale_down_intervals=3,
        fast_interval_s=2.0,
        **cfg,
    )
    return SlaPlanner(config, SLA, PROFILE, kv_capacity_tokens=None, acting=acting)


def now(
    prefill: int = 1,
    decode: int = 1,
    queued: float = 0.0,
    running: int = 0,
    waiting: int = 0,
    reports: bool = True,
    recent: float | None = None,
    load: dict = QUIET,
) -> Observation:
    """The pools at a fast tick (or a step): serving replicas (all in force and reporting, or none reporting)."""
    return Observation(
        **load,
        recent_prompt_tps=recent,
        prefill_replicas=prefill,
        prefill_in_force=prefill,
        prefill_reports=prefill if reports else 0,
        decode_replicas=decode,
        decode_in_force=decode,
        decode_reports=decode if reports else 0,
        prefill_queued_tokens=queued,
        decode_running=running,
        decode_waiting=waiting,
    )


def test_a_queue_that_builds_between_steps_raises_prefill_at_once_and_the_steps_keep_it():
    p = planner()
    step = p.step(now())
    assert (step.prefill, step.decode) == (1, 1)
    # 400,000 prompt tokens queued: 4 replicas' worth of an interval, on top of the interval's load.
    fast = p.react(now(queued=400_000))
    assert (fast.prefill, fast.decode) == (math.ceil(step.proposed_prefill + 4.0), 1)
    assert fast.reason.startswith("fast loop: prefill to")
    # Nothing more held now: no second raise, and never a cut.
    assert p.react(now(prefill=fast.prefill)) is None
    # The quiet steps after it keep the raise for their stabilisation window (3 asks), then shrink.
    got = [p.step(now(prefill=fast.prefill)).prefill for _ in range(3)]
    assert got == [fast.prefill, fast.prefill, 1]


def test_a_surge_in_the_last_seconds_is_sized_as_the_step_would_size_that_rate():
    p = planner()
    p.step(now())
    # The same model at the step, for 20 req/s of the same requests.
    busy = planner().step(now(load=dict(QUIET, requests=200)))
    assert (busy.prefill, busy.decode) > (1, 1)
    # 20,000 prompt tokens/s over the newest buckets (20 req/s of 1000 tokens) where the interval saw 2 req/s.
    fast = p.react(now(recent=20_000.0))
    assert (fast.prefill, fast.decode) == (busy.prefill, busy.decode)
    # A quiet last few seconds takes nothing away.
    assert p.react(now(prefill=fast.prefill, decode=fast.decode, recent=100.0)) is None


def test_streams_running_and_waiting_raise_decode_to_the_batches_they_fill():
    p = planner()
    p.step(now())
    fast = p.react(now(running=290, waiting=10))
    assert fast.decode == 15  # 300 streams, 20 a replica within the ITL target
    assert fast.prefill == 1 and fast.running_decode == 15


def test_it_stays_within_the_bounds_and_the_gpu_budget():
    p = planner(max_gpus=10)
    p.step(now())
    fast = p.react(now(running=1000))  # 50 replicas' worth
    assert (fast.prefill, fast.decode) == (1, 9)  # the budget less the prefill pool's one


def test_it_waits_for_a_step_and_does_nothing_advisory_or_on_a_metrics_gap():
    assert planner().react(now(queued=1e6)) is None  # nothing sized yet
    advisory = planner(acting=False)
    advisory.step(now())
    assert advisory.react(now(queued=1e6)) is None
    p = planner()
    p.step(now())
    assert p.react(now(queued=1e6, reports=False)) is None


def test_the_fast_interval_must_be_shorter_than_the_interval():
    with pytest.raises(ValidationError, match="fast_interval_s .* must be shorter than planner.interval_s"):
        PlannerConfig(interval_s=10, fast_interval_s=10)


def test_the_serve_policy_lets_the_fast_loop_raise_between_intervals():
    from deployments.planner_policy import SlaPlannerPolicy

    args = app_args("act", "fast-app")
    args["planner"]["fast_interval_s"] = 2.0
    prefill = SlaPlannerPolicy(app=args, pool="prefill_pool")
    decode = SlaPlannerPolicy(app=args, pool="decode_pool")

    def tick(t: float, prefill_metrics: dict) -> tuple[int, int]:
        return prefill(ctx("fast-app", t, prefill_metrics))[0], decode(ctx("fast-app", t, DECODE))[0]

    tick(0.0, PREFILL)
    stepped = tick(10.0, PREFILL)
    assert tick(11.0, PREFILL) == stepped  # not yet 2 s since the step
    # The prefill replicas report a queue far beyond the interval's load: raised 2 s after the step, not at 20 s.
    queue = {**PREFILL, "queued_prompt_tokens": {"r1": 5_000_000.0}}
    raised = tick(12.0, queue)
    assert raised[0] > stepped[0] and raised[1] == stepped[1]


def test_in_the_simulator_a_surge_between_steps_is_met_at_a_fast_tick():
    import random

    from benchmarks.autoscale import planner_controller
    from orchestrator.sim.cluster import ClusterSim, ClusterSpec
    from orchestrator.sim.link import LINKS
    from orchestrator.sim.perf_model import roofline
    from tools.workloads import RequestSpec

    perf = roofline("H100", "llama-3.1-8b")
    rng = random.Random(0)

    def arrivals(start: float, end: float, rate: float) -> list[RequestSpec]:
        out, t = [], start
        while (t := t + rng.expovariate(rate)) < end:
            out.append(RequestSpec(tuple(rng.randrange(100, 30000) for _ in range(3000)), 16, arrival_s=t))
        return out

    config = PlannerConfig(
        mode="act",
        interval_s=10.0,
        fast_interval_s=2.0,
        prefill=PoolBounds(min_replicas=1, max_replicas=16),
        decode=PoolBounds(min_replicas=1, max_replicas=16),
    )
    p = SlaPlanner(config, SlaConfig(ttft_p99_ms=500, itl_p50_ms=30), perf, kv_capacity_tokens=2_000_000)
    sim = ClusterSim(ClusterSpec(1, 1, num_blocks=200_000, report_span_s=10.0), perf, LINKS["infiniband"])
    log: list[dict] = []
    sim.every(2.0, planner_controller(p, 10.0, 5.0, log)(sim), 20.0)
    sim.run(arrivals(0.0, 10.0, 1.0) + arrivals(11.0, 20.0, 30.0))  # 1 req/s, then 30 req/s from 11 s
    first, second = log
    assert first["prefill"] == 1 and first["fast_raises"] == []
    # The step at 10 s saw the quiet interval; the fast loop raised prefill before the step at 20 s.
    raises = second["fast_raises"]
    assert raises and all(10.0 < r["t"] < 20.0 for r in raises)
    assert raises[0]["prefill"] > 1
