"""The autoscale_serve experiment's scale-down windows: each fall in a pool's
polled count, and the requests in flight within 30 s of it."""

from __future__ import annotations

from benchmarks.autoscale_serve import around, scale_downs
from tools.client import RequestRecord
from tools.workloads import RequestSpec


def _spec(arrival_s: float) -> RequestSpec:
    return RequestSpec(prompt_token_ids=(1, 2), max_tokens=4, arrival_s=arrival_s)


def test_a_fall_in_a_pool_count_is_a_scale_down_and_a_rise_is_not():
    samples = [
        {"t": 0.0, "prefill_pool": 2, "decode_pool": 1},
        {"t": 2.0, "prefill_pool": 3, "decode_pool": 1},
        {"t": 4.0, "prefill_pool": 1, "decode_pool": 1},
    ]
    assert scale_downs(samples) == [{"t_s": 4.0, "pool": "prefill_pool", "from": 3, "to": 1}]


def test_the_window_holds_the_requests_in_flight_near_the_scale_down_and_counts_the_lost():
    requests = [_spec(0.0), _spec(50.0), _spec(95.0), _spec(200.0)]
    records = [
        RequestRecord(ok=True, ttft_s=0.1, itl_s=[0.01, 0.02], e2e_s=5.0),  # done by 5 s: before the window
        RequestRecord(ok=True, ttft_s=0.3, itl_s=[0.01, 0.05], e2e_s=30.0),  # 50-80 s: in flight at 70-130 s
        RequestRecord(ok=False, error="reset"),  # arrived 95 s, never answered
        RequestRecord(ok=True, ttft_s=0.1, itl_s=[0.01], e2e_s=1.0),  # after the window
    ]
    w = around(100.0, records, requests, window_s=30.0)
    assert (w["requests"], w["lost"]) == (2, 1)
    assert abs(w["ttft_p99_ms"] - 300.0) < 1e-6


def test_each_interval_counts_the_requests_that_missed_each_slo_term():
    import argparse

    from benchmarks.autoscale_serve import summarize

    args = argparse.Namespace(ttft_p99_ms=200.0, itl_p50_ms=30.0, minutes=1.0)
    requests = [_spec(1.0), _spec(2.0), _spec(3.0), _spec(40.0)]
    records = [
        RequestRecord(ok=True, ttft_s=0.1, itl_s=[0.01, 0.02], e2e_s=1.0),  # within both
        RequestRecord(ok=True, ttft_s=0.5, itl_s=[0.01, 0.02], e2e_s=1.0),  # a late first token
        RequestRecord(ok=True, ttft_s=0.1, itl_s=[0.04, 0.05], e2e_s=1.0),  # slow gaps
        RequestRecord(ok=False, error="reset"),  # unanswered: misses both
    ]
    run = summarize("planner", records, requests, [{"t": 0.0, "prefill_pool": 1, "decode_pool": 1}], args)
    first, second = run["intervals"]
    assert (first["attainment"], first["missed"]) == (1 / 3, {"ttft": 1, "itl": 1})
    assert (second["attainment"], second["missed"]) == (0.0, {"ttft": 1, "itl": 1})
