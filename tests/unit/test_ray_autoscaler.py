"""Ray Serve's own default policy code, driven on the simulator's clock
(benchmarks/ray_autoscaler.py): its queue-length rule, its delays, its bounds."""

from __future__ import annotations

from ray.serve.config import AutoscalingConfig

from benchmarks.ray_autoscaler import RayDefaultPolicy


def _policy(**config) -> RayDefaultPolicy:
    return RayDefaultPolicy(
        AutoscalingConfig(**{"min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 2, **config}),
        "decode_pool",
    )


def test_scale_up_waits_for_the_upscale_delay_then_follows_ongoing_over_target():
    policy = _policy(upscale_delay_s=30, look_back_period_s=20)
    decisions = []
    for t in range(0, 41, 5):
        policy.sample(float(t), 8.0)  # 8 ongoing on 1 replica, target 2 a replica: 4 wanted
        decisions.append(policy.decide(float(t), running=1, target=1))
    assert decisions[:6] == [1] * 6  # 0 .. 25 s: within the delay
    assert decisions[6] == 4  # 30 s after the first ask


def test_scale_down_waits_for_the_downscale_delay_and_keeps_the_minimum():
    policy = _policy(downscale_delay_s=600, look_back_period_s=20)
    decisions = {}
    for t in range(0, 700, 100):
        policy.sample(float(t), 0.0)
        decisions[t] = policy.decide(float(t), running=4, target=4)
    assert decisions[500] == 4 and decisions[600] == 1


def test_the_look_back_averages_and_max_replicas_bounds():
    policy = _policy(upscale_delay_s=0, look_back_period_s=20)
    policy.sample(0.0, 0.0)
    policy.sample(5.0, 40.0)
    assert policy.decide(5.0, running=1, target=1) == 8  # mean 20 / 2 = 10 wanted, capped at 8
    policy.sample(30.0, 6.0)  # the first two samples are older than the look-back now
    assert policy.decide(30.0, running=8, target=8) == 8  # 6 / (2 x 8) x 8 = 3 wanted, but down waits
