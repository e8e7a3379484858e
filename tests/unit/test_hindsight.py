"""The hindsight optimum's search (benchmarks/hindsight.py) on tables whose
cheapest schedule is known by hand."""

from __future__ import annotations

import itertools

import pytest

from benchmarks.hindsight import cheapest_schedule

SMALL, BIG = (1, 1), (2, 1)
# One interval in three needs the bigger prefill pool.
MET = {SMALL: [10, 5, 10], BIG: [10, 10, 10]}
REQUESTS = [10, 10, 10]


def test_it_scales_up_for_the_interval_that_needs_it_when_start_ups_are_free():
    s = cheapest_schedule(MET, REQUESTS, interval_s=10, startup_s=0, target=1.0)
    assert s.counts == (SMALL, BIG, SMALL)
    assert (s.met, s.gpu_s) == (30, 70)


def test_a_start_up_dearer_than_holding_the_replica_keeps_it_and_scaling_down_is_free():
    s = cheapest_schedule(MET, REQUESTS, interval_s=10, startup_s=30, target=1.0)
    assert s.counts == (BIG, BIG, SMALL)  # 80 GPU-s, against 70 + 30 for scaling up in the middle
    assert s.gpu_s == 80


def test_a_lower_target_takes_the_misses_that_save_the_most():
    s = cheapest_schedule(MET, REQUESTS, interval_s=10, startup_s=0, target=0.8)
    assert s.counts == (SMALL, SMALL, SMALL) and s.met == 25 and s.gpu_s == 60


def test_an_unreachable_target_gets_the_most_requests_met_at_the_least_cost():
    met = {SMALL: [8, 5, 8], BIG: [8, 8, 8], (3, 1): [8, 8, 8]}
    s = cheapest_schedule(met, REQUESTS, interval_s=10, startup_s=0, target=0.99)
    assert s.met == 24 and s.counts == (SMALL, BIG, SMALL) and s.price == float("inf")


def test_it_is_no_dearer_than_any_schedule_that_meets_the_target():
    met = {(1, 1): [9, 4, 7, 10], (2, 1): [10, 8, 9, 10], (2, 2): [10, 10, 10, 10]}
    requests = [10, 10, 10, 10]
    s = cheapest_schedule(met, requests, interval_s=10, startup_s=15, target=0.9)
    assert s.met >= 36

    def cost(path):
        ups = sum(max(y - x, 0) for a, b in zip(path, path[1:]) for x, y in zip(a, b))
        return sum(sum(c) for c in path) * 10 + ups * 15

    feasible = [p for p in itertools.product(met, repeat=4) if sum(met[c][t] for t, c in enumerate(p)) >= 36]
    assert s.gpu_s == pytest.approx(min(cost(p) for p in feasible))
