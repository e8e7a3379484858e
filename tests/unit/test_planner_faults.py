"""The planner when its inputs are not what it asked for, and when a cap leaves a pool short (issue 36, items 4
and 5): scripted lifecycles in virtual time, observations in, decisions out; then the same through Serve's
policy and the cluster simulator's observation."""

from __future__ import annotations

import logging
import math

import pytest

from orchestrator.config import PlannerConfig, PoolBounds, SlaConfig
from orchestrator.planner.caps import CapShortfall
from orchestrator.planner.faults import ManualChange, PendingReplicas
from orchestrator.planner.planner import Observation, SlaPlanner
from orchestrator.sim.cluster import ClusterSim, ClusterSpec
from orchestrator.sim.link import LINKS
from orchestrator.sim.perf_model import ProfileModel
from tests.unit.test_planner_policy import DECODE, PREFILL, app_args, raw_ctx, series

# prefill 1 ms per 10 tokens; a decode step 10 ms + 1 ms per sequence (as tests/unit/test_planner.py)
PROFILE = ProfileModel(
    prefill_points=[(100, 0.01), (10_000, 1.0)],
    decode_points={1: [(100, 0.011), (10_000, 0.011)], 101: [(100, 0.111), (10_000, 0.111)]},
    kv_bytes=1,
)
SLA = SlaConfig(ttft_p99_ms=600, itl_p50_ms=30)
# 20 req/s of 1000-token prompts and 200-token answers needs 3 prefill and 6 decode replicas; 2 req/s, 1 and 1.
BUSY = dict(interval_s=10, requests=200, mean_isl=1000, mean_osl=200)
QUIET = dict(interval_s=10, requests=20, mean_isl=1000, mean_osl=200)


def planner(acting: bool = True, max_replicas: int = 20, **cfg) -> SlaPlanner:
    config = PlannerConfig(
        mode="act" if acting else "advisory",
        predictor="constant",
        prefill=PoolBounds(min_replicas=1, max_replicas=max_replicas),
        decode=PoolBounds(min_replicas=1, max_replicas=max_replicas),
        decode_utilization=1.0,
        scale_down_intervals=3,
        **{"prefill_queueing": "kingman", "queueing_factor": 3.0} | cfg,  # the rule of the hand arithmetic below
    )
    return SlaPlanner(config, SLA, PROFILE, kv_capacity_tokens=None, acting=acting)


def seen(load: dict, prefill: tuple[int, int], decode: tuple[int, int], reports: bool = True) -> Observation:
    """An interval's end: (serving, in force) per pool; every serving replica reported, or none did."""
    return Observation(
        **load,
        prefill_replicas=prefill[0],
        prefill_in_force=prefill[1],
        prefill_reports=prefill[0] if reports else 0,
        decode_replicas=decode[0],
        decode_in_force=decode[1],
        decode_reports=decode[0] if reports else 0,
    )


def test_a_metrics_gap_holds_both_pools_and_learns_nothing():
    p = planner()
    d = p.step(seen(BUSY, (1, 1), (1, 1)))
    assert (d.prefill, d.decode) == (3, 6)
    # Five intervals with no report from any replica: a rate of 0 read from them would take both pools to 1.
    for _ in range(5):
        d = p.step(seen({"interval_s": 10, "requests": 0}, (3, 3), (6, 6), reports=False))
        assert (d.prefill, d.decode) == (3, 6)
        assert d.faults.gap == ("decode", "prefill") and d.reason.startswith("metrics gap")
    # The predictions did not see the gap: the rate is still the last one observed.
    assert d.predicted_rate == 20
    # Reports resume with a quiet load: the pools shrink through a whole window, the gap counting for none of it.
    got = [p.step(seen(QUIET, (3, 3), (6, 6))).decode for _ in range(3)]
    assert got == [6, 6, 1]


def test_a_gap_before_the_first_report_holds_the_initial_pools():
    p = planner()
    d = p.step(seen({"interval_s": 10, "requests": 0}, (0, 1), (0, 1), reports=False))  # both still starting
    assert (d.prefill, d.decode) == (1, 1) and d.faults.gap


def test_replicas_that_never_come_up_are_reported_and_block_nothing():
    p = planner(pending_timeout_s=15)
    d = p.step(seen(BUSY, (1, 1), (1, 1)))  # asks 3 prefill, 6 decode
    # Two of the three prefill replicas never come up (no GPU for them); the load falls. Each interval ends with
    # the last decision in force, as Serve applies it.
    decisions = []
    for _ in range(4):
        d = p.step(seen(QUIET, (min(d.prefill, 1), d.prefill), (d.decode, d.decode)))
        decisions.append(d)
    assert [d.faults.pending for d in decisions] == [
        (),
        (PendingReplicas("prefill", 2, 20.0),),
        (PendingReplicas("prefill", 2, 30.0),),
        (),  # the smaller ask cancelled them
    ]
    assert "prefill: 2 replica(s) not up after 20 s" in decisions[1].reason
    # Nothing waited on them: both pools shrank through their windows as they would have.
    assert [(d.prefill, d.decode) for d in decisions] == [(3, 6), (3, 6), (1, 1), (1, 1)]


def test_a_count_changed_outside_the_planner_is_where_it_resizes_from():
    p = planner()
    p.step(seen(BUSY, (1, 1), (1, 1)))  # 3 prefill, 6 decode
    # Someone scales decode to 10 by hand: reported, held through a fresh stabilisation window, then shrunk.
    d = p.step(seen(BUSY, (3, 3), (10, 10)))
    assert d.faults.manual == (ManualChange("decode", 6, 10),) and d.decode == 10
    assert "decode resized outside the planner, 6 -> 10" in d.reason
    assert [p.step(seen(BUSY, (3, 3), (10, 10))).decode for _ in range(2)] == [10, 6]
    # ... and to 2 while the load needs 6: back to 6 at once.
    d = p.step(seen(BUSY, (3, 3), (2, 2)))
    assert d.faults.manual == (ManualChange("decode", 6, 2),) and d.decode == 6


def test_an_advisory_planner_sees_no_manual_change():
    p = planner(acting=False)
    p.step(seen(BUSY, (1, 1), (1, 1)))
    assert p.step(seen(BUSY, (1, 1), (1, 1))).faults.manual == ()  # its 3 + 6 were never applied


def test_a_cap_names_the_pool_and_how_short_it_is():
    d = planner(max_replicas=4).step(seen(BUSY, (1, 1), (1, 1)))
    assert d.decode == 4 and d.capped == (CapShortfall("decode", pytest.approx(6.0), 4, "max_replicas"),)
    assert d.capped[0].load_over_capacity == pytest.approx(1.5)
    assert "decode: needs 6.0 replicas, max_replicas grants 4: its load is x1.50" in d.reason
    # A GPU budget of 7 served to decode first leaves prefill 1 of the 3 it needs.
    d = planner(max_gpus=7, budget_priority="decode").step(seen(BUSY, (1, 1), (1, 1)))
    assert (d.prefill, d.decode) == (1, 6)
    assert d.capped == (CapShortfall("prefill", pytest.approx(3.0), 1, "max_gpus"),)
    # 3000-token prompts take longer alone than the TTFT budget: no count holds it, whatever is granted.
    d = planner().step(seen({**BUSY, "mean_isl": 3000}, (1, 1), (1, 1)))
    assert [(c.pool, c.limit, math.isinf(c.load_over_capacity)) for c in d.capped] == [("prefill", "unreachable", True)]
    assert planner().step(seen(BUSY, (1, 1), (1, 1))).capped == ()


# -- through Serve's policy ------------------------------------------------------------------------------------------


def test_the_serve_policy_holds_on_stale_reports_and_says_so():
    from deployments.planner_policy import SlaPlannerPolicy, report_max_age_s
    from deployments.registries import coordinator

    args = app_args("act", "stale-app")
    prefill = SlaPlannerPolicy(app=args, pool="prefill_pool")
    decode = SlaPlannerPolicy(app=args, pool="decode_pool")

    in_force = {"prefill_pool": 1, "decode_pool": 1}  # what Serve applied of the last counts returned

    def tick(now: float, reported_at: float) -> tuple[int, int]:
        for policy, metrics in ((prefill, PREFILL), (decode, DECODE)):
            raw = {name: {"r1": series((reported_at, v["r1"]))} for name, v in metrics.items()}
            in_force[policy.pool] = policy(raw_ctx("stale-app", now, metrics, raw, in_force[policy.pool]))[0]
        return in_force["prefill_pool"], in_force["decode_pool"]

    tick(0.0, 0.0)
    counts = tick(10.0, 10.0)
    assert counts[0] > 1  # the load needs more prefill
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    log = logging.getLogger("ray.serve")  # Ray's logger does not propagate to the root's capture
    log.addHandler(handler)
    try:
        # The replicas' newest reports are from t = 10; later than report_max_age_s after that they are stale.
        assert tick(20.0, 10.0) == counts
        assert tick(10.0 + report_max_age_s(10.0) + 10.0, 10.0) == counts  # held
    finally:
        log.removeHandler(handler)
    # The interval ends at the prefill pool's tick, which finds its own reports stale (decode's were read, fresh,
    # at its last tick).
    assert coordinator("stale-app").decision.faults.gap == ("prefill",)
    assert warnings == ["SLA planner: metrics gap (prefill sent no report): holding"]


# -- the cluster simulator's observation -------------------------------------------------------------------------


def test_the_simulator_reports_what_is_in_force_and_who_reported():
    perf = ProfileModel(prefill_points=[(100, 0.01), (10_000, 1.0)], decode_points={1: [(100, 0.01)]}, kv_bytes=1)
    sim = ClusterSim(ClusterSpec(1, 2, num_blocks=1000, report_span_s=10.0), perf, LINKS["nvlink"])
    sim.resize("prefill", 3, startup_s=60.0)
    obs = sim.observation(10.0)
    assert (obs.prefill_replicas, obs.prefill_in_force, obs.prefill_reports) == (1, 3, 1)
    assert (obs.decode_replicas, obs.decode_in_force, obs.decode_reports) == (2, 2, 2)
