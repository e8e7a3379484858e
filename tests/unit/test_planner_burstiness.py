"""Prefill sized for the burstiness of the arrivals it sees (issue 19): the
replicas measure the prompt tokens arriving per peak bucket, the pool's
index of dispersion is Kingman's ca^2 + cs^2; less the prompt lengths' own
cs^2 it is the arrivals' ca^2, and the utilisation cap of a prefill replica
falls with it; 1 (Poisson) is the M/D/1 rule it replaces."""

from __future__ import annotations

import random

import pytest

from orchestrator.config import PlannerConfig, PoolBounds, SlaConfig
from orchestrator.planner.capacity import prefill_capacity
from orchestrator.planner.observation import observe_pools
from orchestrator.planner.observer import ReplicaLoadWindow, prompt_dispersion
from orchestrator.planner.planner import Observation, SlaPlanner
from orchestrator.sim.perf_model import ProfileModel

# Prefill 1 ms per 10 tokens (1000 tokens: 100 ms); decode 10 ms + 1 ms per sequence.
PROFILE = ProfileModel(
    prefill_points=[(100, 0.01), (10_000, 1.0)],
    decode_points={1: [(100, 0.011), (10_000, 0.011)], 101: [(100, 0.111), (10_000, 0.111)]},
    kv_bytes=1,
)
SLA = SlaConfig(ttft_p99_ms=600, itl_p50_ms=30)


def planner(queueing: str = "kingman") -> SlaPlanner:
    config = PlannerConfig(
        mode="advisory",
        predictor="constant",
        prefill=PoolBounds(min_replicas=1, max_replicas=50),
        decode=PoolBounds(min_replicas=1, max_replicas=50),
        prefill_queueing=queueing,
        queueing_factor=3.0,  # the factor the hand arithmetic below was done with
    )
    return SlaPlanner(config, SLA, PROFILE, kv_capacity_tokens=None)


def test_the_utilisation_cap_falls_with_burstiness_and_is_m_d_1_at_one():
    # Mean TTFT target 200 ms, service 100 ms: rho_max = 2 x 0.1 / (2 x 0.1 + b x 0.1).
    assert prefill_capacity(PROFILE, 1000, 0.6, 3.0) == pytest.approx(2 / 3 * 10_000)
    assert prefill_capacity(PROFILE, 1000, 0.6, 3.0, burstiness=1.0) == pytest.approx(2 / 3 * 10_000)
    assert prefill_capacity(PROFILE, 1000, 0.6, 3.0, burstiness=8.0) == pytest.approx(0.2 * 10_000)


def test_dispersion_is_one_plus_cs2_for_poisson_arrivals_and_more_for_bursts():
    rng = random.Random(7)

    def buckets(bursty: bool) -> list[float]:
        out = []
        for _ in range(4000):  # prompt tokens per 1 s bucket, 20 req/s of 1000 +- 500 tokens
            n = (rng.choice((0, 0, 0, 80)) if bursty else 0) or _poisson(rng, 20)
            out.append(sum(rng.uniform(500, 1500) for _ in range(n)))
        return out

    cs2 = (1000**2 / 12) / 1000**2  # uniform(500, 1500)
    assert prompt_dispersion(buckets(False), 1000) == pytest.approx(1 + cs2, rel=0.1)
    assert prompt_dispersion(buckets(True), 1000) > 10
    assert prompt_dispersion([5000.0, 5000.0], 1000) is None  # too few buckets to say


def test_the_pool_observation_carries_the_dispersion_of_its_replicas_summed_buckets():
    now = [0.0]
    windows = [ReplicaLoadWindow(span_s=10, clock=lambda: now[0], peak_window_s=2) for _ in range(2)]
    # Every prompt 1000 tokens; all of a bucket's arrivals at one replica or the other, 10 in one bucket of five.
    for t, count in ((0.5, 10), (2.5, 0), (4.5, 0), (6.5, 0), (8.5, 0)):
        now[0] = t
        for i in range(count):
            windows[i % 2].arrived(1000)
    now[0] = 10.0
    obs = observe_pools(10, [], [w.report() for w in windows], 1, 2)
    # Pooled buckets 10k, 0, 0, 0, 0 tokens: mean 2000, var 2e7 -> 2e7 / (2000 x 1000) = 10.
    assert obs.prompt_dispersion == pytest.approx(10.0)


def test_bursty_arrivals_get_more_prefill_replicas_than_poisson_ones_of_the_same_mean():
    def sized(dispersion: float | None, queueing: str = "kingman") -> int:
        p = planner(queueing)
        obs = Observation(interval_s=10, requests=200, mean_isl=1000, mean_osl=10, prompt_dispersion=dispersion)
        return p.step(obs).prefill

    assert sized(None) == sized(1.0) == sized(0.4) == 3  # M/D/1: 20k tokens/s over 6667 a replica
    assert sized(8.0) == 10  # 20k over 2000
    assert sized(8.0, queueing="md1") == 3
    d = planner().step(Observation(interval_s=10, requests=200, mean_isl=1000, mean_osl=10, prompt_dispersion=8.0))
    assert d.burstiness == 8.0


def test_the_burstiness_is_the_mean_of_the_remembered_intervals():
    p = planner()
    for dispersion in (2.0, 4.0, 9.0, 3.0):  # peak_memory_intervals = 3 by default
        d = p.step(Observation(interval_s=10, requests=200, mean_isl=1000, mean_osl=10, prompt_dispersion=dispersion))
    assert d.burstiness == pytest.approx((4.0 + 9.0 + 3.0) / 3)


def _poisson(rng: random.Random, mean: float) -> int:
    n, t = 0, rng.expovariate(mean)
    while t < 1.0:
        n, t = n + 1, t + rng.expovariate(mean)
    return n


def test_the_prompt_lengths_own_spread_is_taken_out_leaving_the_arrivals_burstiness():
    now = [0.0]
    window = ReplicaLoadWindow(span_s=10, clock=lambda: now[0], peak_window_s=2)
    for t in (0.5, 2.5, 4.5, 6.5, 8.5):  # one arrival a bucket, 500 or 1500 tokens: cs^2 = 0.25
        now[0] = t
        window.arrived(500 if t in (0.5, 4.5, 8.5) else 1500)
    now[0] = 10.0
    obs = observe_pools(10, [], [window.report()], 1, 1)
    assert obs.prompt_length_scv == pytest.approx(((3 * 500**2 + 2 * 1500**2) / 5) / 900**2 - 1)
    assert obs.arrival_scv == pytest.approx(obs.prompt_dispersion - obs.prompt_length_scv)
    p = planner()
    bursty = Observation(
        interval_s=10, requests=200, mean_isl=1000, mean_osl=10, prompt_dispersion=8.5, prompt_length_scv=0.5
    )
    assert p.step(bursty).burstiness == pytest.approx(8.0)


def test_the_wait_rule_puts_the_factor_on_the_wait_only():
    # 1000-token prompts take 100 ms, target 600 ms, factor 3: the mean rule holds s + Wmean <= 200 ms,
    # rho = 2(0.2 - 0.1) / (2(0.2 - 0.1) + 0.1) = 2/3; the wait rule holds s + 3 Wmean <= 600 ms,
    # rho = 2(0.5) / (2(0.5) + 3 x 0.1) = 10/13, about the same for a prompt short against the target.
    assert prefill_capacity(PROFILE, 1000, 0.6, 3.0, factor_on_wait_only=True) == pytest.approx(10 / 13 * 10_000)
    assert prefill_capacity(PROFILE, 1000, 0.6, 3.0, burstiness=4.0, factor_on_wait_only=True) == pytest.approx(
        1 / (1 + 1.2) * 10_000
    )


def test_a_prompt_taking_half_the_target_still_leaves_the_queue_the_other_half():
    # 3000 tokens take 300 ms: the mean rule (mean TTFT <= 600 / 3 ms) leaves nothing; the wait rule leaves
    # the wait 300 ms at 3 x its mean: rho = 2(0.3) / (2(0.3) + 3 x 0.3) = 0.4.
    assert prefill_capacity(PROFILE, 3000, 0.6, 3.0) == 0.0
    assert prefill_capacity(PROFILE, 3000, 0.6, 3.0, factor_on_wait_only=True) == pytest.approx(0.4 * 3000 / 0.3)
    assert prefill_capacity(PROFILE, 7000, 0.6, 3.0, factor_on_wait_only=True) == 0.0  # 700 ms of service: none
