"""The SLA planner core: observations in, replica counts out, hand-checked
against the capacity formulas; predictors on synthetic series."""

from __future__ import annotations

import math

import pytest

from orchestrator.config import PlannerConfig, PoolBounds, SlaConfig
from orchestrator.planner.capacity import decode_batch_limit, decode_capacity, prefill_capacity, prefill_service_s
from orchestrator.planner.planner import Observation, SlaPlanner
from orchestrator.planner.predictors import (
    ConstantPredictor,
    KalmanTrendPredictor,
    MovingAveragePredictor,
    SeasonalPredictor,
)
from orchestrator.sim.perf_model import ProfileModel

# A hand-made profile: prefill 1 ms per 10 tokens; a decode step 10 ms + 1 ms per sequence.
PROFILE = ProfileModel(
    prefill_points=[(100, 0.01), (10_000, 1.0)],
    decode_points={1: [(100, 0.011), (10_000, 0.011)], 101: [(100, 0.111), (10_000, 0.111)]},
    kv_bytes=1,
)
SLA = SlaConfig(ttft_p99_ms=600, itl_p50_ms=30)


def planner(**cfg) -> SlaPlanner:
    cfg = {"decode_utilization": 1.0} | cfg  # whole batches, for round numbers
    config = PlannerConfig(
        mode="advisory",
        predictor="constant",
        prefill=PoolBounds(min_replicas=1, max_replicas=20),
        decode=PoolBounds(min_replicas=1, max_replicas=20),
        **cfg,
    )
    return SlaPlanner(config, SLA, PROFILE, kv_capacity_tokens=None, max_num_seqs=256)


def test_an_interval_in_which_no_request_finished_keeps_the_outputs_seen_before():
    # Long outputs on a busy decode pool: some intervals see arrivals but no request finish. That is
    # no evidence of short outputs: the pool stays sized for the 200 tokens seen.
    p = planner()
    p.step(Observation(interval_s=10, requests=200, mean_isl=1000, mean_osl=200))
    d = p.step(Observation(interval_s=10, requests=200, mean_isl=1000, mean_osl=None))
    assert d.predicted_osl == 200 and d.decode == 6


def test_prompts_no_idle_replica_prefills_within_the_target_get_the_whole_pool():
    # 7000 tokens take 700 ms of service against the 600 ms p99 target: no count meets it, so the pool gets
    # its maximum, interval after interval (the first interval's observation included).
    p = planner()
    for _ in range(3):
        d = p.step(Observation(interval_s=10, requests=20, mean_isl=7000, mean_osl=10, prefill_replicas=1))
        assert d.prefill == 20 and math.isinf(d.proposed_prefill)
    # kingman holds the mean under the target / queueing_factor: 3000 tokens' 300 ms miss its 200 ms.
    kingman = planner(prefill_queueing="kingman", queueing_factor=3.0)
    d = kingman.step(Observation(interval_s=10, requests=20, mean_isl=3000, mean_osl=10, prefill_replicas=1))
    assert d.prefill == 20 and math.isinf(d.proposed_prefill)


def test_capacities_follow_the_formulas():
    assert prefill_service_s(PROFILE, 1000) == pytest.approx(0.1)
    # Target mean TTFT 600/3 = 200 ms, service 100 ms: rho_max = 2(0.2-0.1)/(0.4-0.1) = 2/3.
    assert prefill_capacity(PROFILE, 1000, 0.6, 3.0) == pytest.approx(2 / 3 * 1000 / 0.1)
    assert prefill_capacity(PROFILE, 3000, 0.6, 3.0) == 0.0  # 300 ms of service misses a 200 ms mean
    # 10 ms + 1 ms x b <= 30 ms -> b = 20, 20 sequences / 30 ms.
    assert decode_batch_limit(PROFILE, 500, 0.030, None, 256) == 20
    assert decode_capacity(PROFILE, 500, 0.030, None, 256) == pytest.approx(20 / 0.030)
    assert decode_batch_limit(PROFILE, 500, 0.030, kv_capacity_tokens=5000, max_num_seqs=256) == 10


def test_replicas_are_sized_from_the_load_and_the_profile():
    p = planner()
    # Prefill (wait, factor 4): service s = 100 ms; s + 4 x the M/D/1 mean wait rho s / 2(1 - rho) <= 600 ms
    # -> rho_max = 5/7, 7143 tokens/s a replica; 20 req/s x 1000 tokens = 20k prompt tokens/s -> 2.8 -> 3.
    # Decode: 20 x 200 = 4000 output tokens/s at context 1100 over 666.7/replica -> 6.
    d = p.step(Observation(interval_s=10, requests=200, mean_isl=1000, mean_osl=200))
    assert (d.prefill, d.decode) == (3, 6)
    assert d.proposed_prefill == pytest.approx(2.8) and d.proposed_decode == pytest.approx(6.0)


def test_decode_is_sized_to_a_share_of_its_batch():
    d = planner(decode_utilization=0.75).step(Observation(interval_s=10, requests=200, mean_isl=1000, mean_osl=200))
    assert d.decode == 8  # 4000 / (666.7 x 0.75)


def test_a_ttft_miss_with_queued_decode_engines_is_the_decode_pools():
    p = planner()
    load = dict(interval_s=10, requests=200, mean_isl=1000, mean_osl=200)
    serving = dict(prefill_replicas=3, decode_replicas=6)  # what the model sizes this load for (3 + 6)
    p.step(Observation(**load, **serving))
    miss = Observation(**load, ttft_p99_s=1.2, prefill_waiting=0, decode_waiting=30, **serving)
    assert p.step(miss).decode_correction == 1.0  # once: could be noise
    d = p.step(miss)  # twice in a row with the pools sized: the model's
    assert d.prefill_correction == 1.0 and d.decode_correction == pytest.approx(math.sqrt(2))


def test_cached_prefixes_cost_no_prefill():
    d = planner().step(Observation(interval_s=10, requests=200, mean_isl=1000, mean_osl=200, prefix_hit_rate=0.5))
    # 500 uncached tokens: service 50 ms, rho_max = 2(0.15)/(0.35) = 0.857 -> 8571 tokens/s; 10k/8571 -> 2.
    assert d.prefill == 2


def test_scale_up_is_immediate_and_scale_down_waits():
    p = planner(scale_down_intervals=3)
    busy = Observation(interval_s=10, requests=200, mean_isl=1000, mean_osl=200)
    quiet = Observation(interval_s=10, requests=20, mean_isl=1000, mean_osl=200)
    assert p.step(busy).decode == 6
    assert [p.step(quiet).decode for _ in range(3)] == [6, 6, 1]


def test_scale_down_goes_to_the_busiest_ask_of_the_window():
    # Decode asks at OSL 200: 6 (20 req/s), then 3 (10 req/s), then 1, 1, 1 (2 req/s: 0.6 of a replica).
    p = planner(scale_down_intervals=3)
    asks = [200, 100, 20, 20, 20]
    got = [p.step(Observation(interval_s=10, requests=n, mean_isl=1000, mean_osl=200)).decode for n in asks]
    # 6 stays while it is in the window of the last 3 asks; then the most of (3, 1, 1), then of (1, 1, 1).
    assert got == [6, 6, 6, 3, 1]


def test_a_gpu_budget_serves_the_priority_pool_first():
    d = planner(max_gpus=7, budget_priority="decode").step(
        Observation(interval_s=10, requests=200, mean_isl=1000, mean_osl=200)
    )
    assert (d.prefill, d.decode) == (1, 6) and "budget" in d.reason
    d = planner(max_gpus=7, budget_priority="prefill").step(
        Observation(interval_s=10, requests=200, mean_isl=1000, mean_osl=200)
    )
    assert (d.prefill, d.decode) == (3, 4)


def test_a_missed_target_raises_the_correction_and_the_count():
    p = planner()
    load = dict(interval_s=10, requests=200, mean_isl=1000, mean_osl=200)
    assert p.step(Observation(**load, prefill_replicas=3, decode_replicas=6)).decode == 6
    slow = Observation(**load, itl_p50_s=0.060, prefill_replicas=3, decode_replicas=6)  # twice the ITL target
    assert p.step(slow).decode_correction == 1.0
    d = p.step(slow)  # the second interval in a row, with 6 serving throughout
    assert d.decode_correction == pytest.approx(math.sqrt(2)) and d.decode == 9


def test_aggregated_serving_sizes_one_pool_for_both_phases():
    config = PlannerConfig(
        mode="advisory", predictor="constant", decode=PoolBounds(max_replicas=20), decode_utilization=1.0
    )
    p = SlaPlanner(config, SLA, PROFILE, kv_capacity_tokens=None, disaggregated=False)
    d = p.step(Observation(interval_s=10, requests=200, mean_isl=1000, mean_osl=200))
    assert (d.prefill, d.decode) == (0, 9)


def test_no_traffic_means_the_minimum():
    assert planner(scale_down_intervals=1).step(Observation(interval_s=10, requests=0)).decode == 1


def test_predictors_on_synthetic_series():
    const, ma, kalman = ConstantPredictor(), MovingAveragePredictor(3), KalmanTrendPredictor()
    assert const.predict() is None and ma.predict() is None and kalman.predict() is None
    for v in [10, 20, 30, 40, 50, 60]:
        for p in (const, ma, kalman):
            p.observe(v)
    assert const.predict() == 60 and ma.predict() == 50
    assert abs(kalman.predict() - 70) < 3  # follows the ramp
    seasonal = SeasonalPredictor(period=4, window=1)
    for v in [1, 5, 1, 5, 1, 5, 1, 5]:
        seasonal.observe(v)
    assert seasonal.predict() == pytest.approx(1.0)  # the value one period before the next


def test_a_replica_load_window_reports_the_last_span_only():
    from orchestrator.planner.observer import MISSING, ReplicaLoadWindow

    now = [0.0]
    window = ReplicaLoadWindow(span_s=10, clock=lambda: now[0])
    assert window.snapshot()["first_token_p99_s"] == MISSING and window.snapshot()["arrival_rate"] == 0
    window.arrived(1000)
    window.token_gap(0.5)
    now[0] = 20.0  # the first request's window has passed
    for prompt, out, first in ((100, 10, 0.2), (300, 30, 0.4)):
        window.arrived(prompt)
        window.token_gap(0.02)
        window.finished(out, cached_tokens=50, first_token_s=first)
    snap = window.snapshot(waiting=3)
    assert snap["arrival_rate"] == 0.2 and snap["mean_isl"] == 200 and snap["mean_osl"] == 20
    assert snap["cached_tokens"] == 100 and snap["itl_p50_s"] == 0.02 and snap["waiting"] == 3
    assert snap["first_token_p99_s"] == pytest.approx(0.398)
