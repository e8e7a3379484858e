"""The SLA planner's look-ahead, burst headroom, backlog and lag-aware
corrections (raised only on misses the model can be blamed for, in a row),
hand-checked on the same profile as test_planner.py: prefill 1 ms per 10
tokens (a 1000-token prompt: 100 ms, 10,000 tokens/s flat out; M/D/1
capacity at a 600 ms p99 target / 3: 6,667 tokens/s); a decode step 10 ms +
1 ms per sequence (20 sequences within 30 ms: 666.7 tokens/s)."""

from __future__ import annotations

import math

import pytest

from orchestrator.config import PlannerConfig, PoolBounds, SlaConfig
from orchestrator.planner.planner import Observation, SlaPlanner
from orchestrator.planner.predictors import KalmanTrendPredictor, SeasonalPredictor
from orchestrator.sim.perf_model import ProfileModel

PROFILE = ProfileModel(
    prefill_points=[(100, 0.01), (10_000, 1.0)],
    decode_points={1: [(100, 0.011), (10_000, 0.011)], 101: [(100, 0.111), (10_000, 0.111)]},
    kv_bytes=1,
)
SLA = SlaConfig(ttft_p99_ms=600, itl_p50_ms=30)
LOAD = dict(interval_s=10, requests=200, mean_isl=1000, mean_osl=200)  # 20k prompt tokens/s: 3 prefill, 6 decode


def planner(predictor: str = "constant", **config_fields) -> SlaPlanner:
    config = PlannerConfig(
        mode="advisory",
        predictor=predictor,
        decode_utilization=1.0,
        prefill=PoolBounds(min_replicas=1, max_replicas=20),
        decode=PoolBounds(min_replicas=1, max_replicas=20),
        **{"prefill_queueing": "kingman", "queueing_factor": 3.0} | config_fields,  # the rule of the arithmetic below
    )
    return SlaPlanner(config, SLA, PROFILE, kv_capacity_tokens=None, max_num_seqs=256)


def test_predictors_look_several_intervals_ahead():
    kalman = KalmanTrendPredictor()
    for v in [10, 20, 30, 40, 50, 60]:
        kalman.observe(v)
    assert abs(kalman.predict(1) - 70) < 3 and abs(kalman.predict(3) - 90) < 5  # along the ramp
    assert kalman.predict(3) - kalman.predict(1) == pytest.approx(2 * (kalman.predict(2) - kalman.predict(1)))
    seasonal = SeasonalPredictor(period=4, window=1)
    for v in [1, 5, 1, 5, 1, 5, 1, 5]:
        seasonal.observe(v)
    assert seasonal.predict(1) == pytest.approx(1.0) and seasonal.predict(2) == pytest.approx(5.0)


def test_a_damped_trend_adds_less_each_step_ahead():
    straight, damped = KalmanTrendPredictor(), KalmanTrendPredictor(damping=0.5)
    for v in [10, 20, 30, 40, 50, 60]:
        straight.observe(v)
        damped.observe(v)
    level = straight.predict(1) - (straight.predict(2) - straight.predict(1))  # the same filtered level and slope
    slope = straight.predict(2) - straight.predict(1)
    # phi = 0.5: 1 step adds 0.5 x slope, 3 steps 0.5 + 0.25 + 0.125 = 0.875 x slope.
    assert damped.predict(1) == pytest.approx(level + 0.5 * slope)
    assert damped.predict(3) == pytest.approx(level + 0.875 * slope)
    with pytest.raises(ValueError):
        KalmanTrendPredictor(damping=0)


def test_the_planner_sizes_for_the_interval_after_start_up():
    # 10 s intervals, 20 s start-up: the rate 3 intervals ahead, when it is the larger.
    ahead, now = planner("kalman", replica_startup_s=20), planner("kalman")
    reference = KalmanTrendPredictor(damping=ahead.config.trend_damping)
    for rate in (10, 20, 30, 40, 50, 60):
        obs = Observation(interval_s=10, requests=rate * 10, mean_isl=1000, mean_osl=200)
        reference.observe(obs.request_rate)
        d_ahead, d_now = ahead.step(obs), now.step(obs)
    assert d_ahead.predicted_rate == pytest.approx(reference.predict(3))
    assert d_now.predicted_rate == pytest.approx(reference.predict(1))
    assert d_now.predicted_rate < d_ahead.predicted_rate and d_now.prefill < d_ahead.prefill


def test_bursts_size_prefill_for_the_peak():
    # Mean 20k prompt tokens/s: 3 replicas at M/D/1 utilisation. A 2x peak over 3 s windows: 40k tokens/s over
    # 10k/replica flat out x (1 + 0.6 s / 3 s) = 12k -> 3.33 -> 4.
    p = planner()
    d = p.step(Observation(**LOAD, peak_prompt_tps=40_000, peak_window_s=3))
    assert d.peak_ratio == pytest.approx(2.0)
    assert d.proposed_prefill == pytest.approx(40_000 / 12_000) and d.prefill == 4
    assert d.decode == 6  # decode is not sized by the prompt peak
    # A 1.5x peak: 30k / 12k = 2.5 replicas, under the 3 the mean needs.
    d = planner().step(Observation(**LOAD, peak_prompt_tps=30_000, peak_window_s=3))
    assert d.proposed_prefill == pytest.approx(3.0) and d.prefill == 3


def test_burst_headroom_is_remembered_for_a_few_intervals():
    p = planner(peak_memory_intervals=2)
    p.step(Observation(**LOAD, peak_prompt_tps=40_000, peak_window_s=3))
    flat = Observation(**LOAD, peak_prompt_tps=20_000, peak_window_s=3)  # peak = mean
    assert [p.step(flat).peak_ratio for _ in range(2)] == [pytest.approx(2.0), 1.0]
    assert planner().step(Observation(**LOAD)).peak_ratio == 1.0  # no peak measured: the mean only


def test_queued_prompt_tokens_are_drained_within_an_interval():
    # 50k tokens queued over 10 s at 10k tokens/s a replica: half a replica on top of 3.
    d = planner().step(Observation(**LOAD, prefill_queued_tokens=50_000))
    assert d.proposed_prefill == pytest.approx(3.5) and d.prefill == 4


SERVING = dict(prefill_replicas=3, decode_replicas=6)  # what the model sizes LOAD for
MISS = Observation(**LOAD, ttft_p99_s=1.2, **SERVING)  # twice the 600 ms target


def test_a_miss_while_short_of_replicas_is_lag_not_a_wrong_model():
    late = planner()
    late.step(Observation(**LOAD, **SERVING))
    for _ in range(3):
        d = late.step(Observation(**LOAD, ttft_p99_s=1.2, prefill_replicas=2, decode_replicas=6))  # 2 of 3 needed
    assert d.prefill_correction == 1.0 and d.prefill == 3
    sized = planner()
    sized.step(Observation(**LOAD, **SERVING))
    assert sized.step(MISS).prefill_correction == 1.0  # one interval: could be noise, or a burst
    d = sized.step(MISS)
    assert d.prefill_correction == pytest.approx(math.sqrt(2)) and d.prefill == 5  # 3 x 1.414 = 4.24
    # Well under the target, it drifts back to the profile, and no further.
    d = sized.step(Observation(**LOAD, ttft_p99_s=0.2, prefill_replicas=5, decode_replicas=6))
    assert d.prefill_correction == pytest.approx(math.sqrt(2) * 0.95)
    for _ in range(10):
        d = sized.step(Observation(**LOAD, ttft_p99_s=0.2, prefill_replicas=5, decode_replicas=6))
    assert d.prefill_correction == 1.0 and d.decode_correction == 1.0


def test_a_replica_counts_only_once_it_served_the_whole_interval():
    p = planner(correction_after_intervals=1)
    p.step(Observation(**LOAD, prefill_replicas=2, decode_replicas=6))
    # The third prefill replica came up during the interval: 2 served its start, short of the 3 needed.
    assert p.step(MISS).prefill_correction == 1.0
    assert p.step(MISS).prefill_correction == pytest.approx(math.sqrt(2))  # 3 throughout


def test_an_inherited_queue_that_alone_breaks_the_target_is_lag():
    # 3 replicas clear 10k tokens/s each. Queueing factor 3: the pool is sized for a mean TTFT of 200 ms, so a
    # queue that takes more than 600 - 200 = 400 ms to drain alone breaks the 600 ms target for the requests
    # that arrive to it, while the pool drains it (MISS: nothing queued at its end).
    for queued, blamed in ((15_000, False), (9_000, True)):  # 0.5 s and 0.3 s of work for 3 replicas
        p = planner(correction_after_intervals=1)
        p.step(Observation(**LOAD, prefill_queued_tokens=queued, **SERVING))
        expected = math.sqrt(2) if blamed else 1.0
        assert p.step(MISS).prefill_correction == pytest.approx(expected), queued
    # A queue that grew under a sized pool is no lag: the pool computes less than the model says.
    p = planner(correction_after_intervals=1)
    p.step(Observation(**LOAD, prefill_queued_tokens=15_000, **SERVING))
    d = p.step(Observation(**LOAD, ttft_p99_s=1.2, prefill_queued_tokens=20_000, **SERVING))
    assert d.prefill_correction == pytest.approx(math.sqrt(2))


def test_a_correction_rises_only_on_misses_in_a_row():
    p = planner()  # correction_after_intervals = 2
    p.step(Observation(**LOAD, **SERVING))
    fine = Observation(**LOAD, ttft_p99_s=0.4, **SERVING)
    for step in (MISS, fine, MISS, fine, MISS):  # bursts, one interval each
        assert p.step(step).prefill_correction == 1.0
    assert p.step(MISS).prefill_correction == pytest.approx(math.sqrt(2))


def test_an_oracle_forecast_is_taken_like_a_prediction():
    # The larger of each: rate 20/s (first), ISL 1500 and OSL 300 (second). Prefill: 1500 tokens take 150 ms,
    # rho_max = 2(0.2 - 0.15)/(0.4 - 0.15) = 0.4 -> 4000 tokens/s a replica; 30k / 4000 = 7.5 -> 8.
    # Decode: 20 x 300 = 6000 / 666.7 = 9.
    forecast = [
        Observation(interval_s=10, requests=200, mean_isl=1000, mean_osl=100),
        Observation(interval_s=10, requests=100, mean_isl=1500, mean_osl=300),
    ]
    d = planner().step(Observation(interval_s=10, requests=0), forecast)
    assert (d.predicted_rate, d.predicted_isl, d.predicted_osl) == (20, 1500, 300)
    assert (d.prefill, d.decode) == (8, 9)
