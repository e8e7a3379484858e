"""Decode sized from the traffic arriving (issue 36, item 1): the output tokens the arrivals asked for
(`max_tokens`) times the share of their ask the finished requests made, and the streams running now.
Scripted intervals through SlaPlanner.step, hand-checked against the capacity formulas of the profile in
test_planner.py (a decode step 10 ms + 1 ms per sequence: 20 sequences within a 30 ms ITL, 666.7 output
tokens/s a replica)."""

from __future__ import annotations

import math

from orchestrator.planner.observation import observe_pools
from orchestrator.planner.observer import ReplicaReport
from orchestrator.planner.planner import Observation
from tests.unit.test_planner import planner


def interval(requests=200, isl=1000, osl=100.0, asked=100.0, share=1.0, running=0, **kw) -> Observation:
    return Observation(
        interval_s=10,
        requests=requests,
        mean_isl=isl,
        mean_osl=osl,
        mean_max_tokens=asked,
        output_share=share,
        decode_running=running,
        **kw,
    )


def test_a_turn_to_longer_outputs_is_sized_in_its_first_interval():
    # 20 req/s asking 100 tokens and making them: 2000 tokens/s -> 3 decode replicas. Then the arrivals ask
    # for 400 while the requests that finish are still the short ones: sized for 400 at once (12 replicas),
    # where the finished requests' mean alone would keep 3 until the long ones end.
    p = planner()
    assert p.step(interval()).decode == 3
    d = p.step(interval(osl=100, asked=400))
    assert d.predicted_osl == 400 and d.decode == 12
    unknown = planner()
    unknown.step(interval(asked=None, share=None))
    assert unknown.step(interval(osl=100, asked=None, share=None)).decode == 3  # asks not known: as before


def test_loose_asks_are_scaled_by_what_the_finished_requests_made():
    # Clients ask for 4000 tokens and get about 200: the share (0.05) turns the ask into 200, not 4000.
    p = planner()
    d = p.step(interval(osl=200, asked=4000, share=0.05))
    assert math.isclose(d.predicted_osl, 200) and d.decode == 6
    # The share moves halfway to each interval's: the mix of the traffic changes it.
    d = p.step(interval(osl=400, asked=4000, share=0.15))
    assert math.isclose(d.predicted_osl, 4000 * 0.1) and d.decode == 12


def test_streams_running_now_are_a_floor_on_decode():
    # The model's OSL says 3 replicas; 150 streams are running, and a replica holds 20 within the ITL target
    # at this context: 7.5 -> 8 replicas, whatever the prediction.
    p = planner()
    d = p.step(interval(running=150))
    assert math.isclose(d.running_decode, 7.5) and d.decode == 8
    assert p.step(interval(running=0)).decode == 8  # the floor goes with the streams, down the usual way


def test_the_pool_observation_carries_asks_share_and_running_from_the_replicas_reports():
    reports = [
        ReplicaReport(
            arrival_rate=3,
            mean_isl=100,
            mean_osl=50,
            finished=2,
            mean_max_tokens=200,
            finished_max_tokens=100,
            running=7,
        ),
        ReplicaReport(
            arrival_rate=1,
            mean_isl=100,
            mean_osl=20,
            finished=1,
            mean_max_tokens=400,
            finished_max_tokens=40,
            running=5,
        ),
    ]
    obs = observe_pools(10, None, reports, 0, 2)
    assert obs.mean_max_tokens == (3 * 200 + 1 * 400) / 4
    assert math.isclose(obs.output_share, ((2 * 50 + 20) / 3) / ((2 * 100 + 40) / 3))
    assert obs.decode_running == 12
    # A replica that does not know its arrivals' asks (0) makes the pool's unknown.
    blind = [reports[0], ReplicaReport(arrival_rate=1, mean_isl=100, finished=1, mean_osl=20, running=5)]
    obs = observe_pools(10, None, blind, 0, 2)
    assert obs.mean_max_tokens is None and obs.output_share is None


def test_a_decode_pool_slower_than_profiled_is_sized_from_what_it_measures():
    # 40 streams on 2 replicas: 20 each, a 30 ms step in the profile; the replicas measure 45 ms between
    # tokens. Calibrated, the step is (1 + 45/30) / 2 = 1.25 x the profile's: 14 sequences fit 30 ms
    # (1.25 x 24 ms), 466.7 tokens/s a replica, and 2000 tokens/s need 4.3 -> 5 replicas (3 as profiled).
    slow = interval(running=40, itl_p50_s=0.045, decode_replicas=2)
    assert planner(decode_step_calibration=False).step(slow).decode == 3
    calibrated = planner(decode_step_calibration=True)
    d = calibrated.step(slow)
    assert math.isclose(d.proposed_decode, 2000 / (14 / (1.25 * 0.024))) and d.decode == 5
    # Faster than profiled says nothing about the batch the target allows: the scale never goes under 1.
    fast = planner(decode_step_calibration=True)
    assert fast.step(interval(running=40, itl_p50_s=0.015, decode_replicas=2)).decode == 3
