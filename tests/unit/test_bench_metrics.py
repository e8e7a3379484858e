"""Benchmark metric definitions, hand-computed."""

from __future__ import annotations

import pytest

from tools.bench_stats import find_knee, meets_slo, parse_slo, past_the_knee, percentiles, summarize, tpot_s
from tools.client import RequestRecord


def rec(ttft, itl, e2e, out_tokens, prompt_tokens=10, ok=True, error=None, cached=None):
    return RequestRecord(
        ok=ok,
        ttft_s=ttft,
        itl_s=list(itl),
        e2e_s=e2e,
        output_tokens=out_tokens,
        prompt_tokens=prompt_tokens,
        error=error,
        cached_tokens=cached,
    )


def test_percentiles_interpolate_linearly_in_ms():
    p = percentiles([0.010, 0.020, 0.030, 0.040, 0.050])
    assert p["p50"] == pytest.approx(30.0)
    assert p["p90"] == pytest.approx(46.0)  # 40 + 0.6 * 10
    assert p["p99"] == pytest.approx(49.6)
    assert p["mean"] == pytest.approx(30.0)
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None, "mean": None}


def test_tpot_spreads_decode_time_over_the_tokens_after_the_first():
    assert tpot_s(rec(0.1, [0.02] * 4, 0.2, 5)) == pytest.approx(0.025)
    assert tpot_s(rec(0.1, [], 0.1, 1)) is None


def test_throughput_and_goodput_over_the_run():
    records = [
        rec(0.100, [0.010, 0.010], 0.200, 3),  # meets both
        rec(0.600, [0.010, 0.010], 0.700, 3),  # TTFT too slow
        rec(0.100, [0.050, 0.050], 0.300, 3),  # ITL too slow
        rec(None, [], None, 0, ok=False, error="http_500"),
    ]
    r = summarize(records, duration_s=2.0, slo=parse_slo(["ttft_ms=500", "itl_p50_ms=30"]))
    assert (r.sent, r.completed, r.failed, r.errors) == (4, 3, 1, {"http_500": 1})
    assert r.request_throughput == pytest.approx(1.5)
    assert r.output_token_throughput == pytest.approx(4.5)
    assert r.total_token_throughput == pytest.approx((30 + 9) / 2)
    assert r.goodput_requests == pytest.approx(0.5) and r.goodput_output_tokens == pytest.approx(1.5)
    assert r.ttft_ms["p50"] == pytest.approx(100.0)


def test_without_slo_goodput_is_throughput_and_run_level_slo_uses_percentiles():
    records = [rec(0.1 * (i + 1), [0.01], 1.0, 2) for i in range(10)]  # TTFT 100..1000 ms
    r = summarize(records, 1.0, [])
    assert r.goodput_requests == r.request_throughput == 10
    r = summarize(records, 1.0, parse_slo(["ttft_p50_ms=600", "ttft_p99_ms=500"]))
    assert r.slo_attained == {"ttft_p50_ms": True, "ttft_p99_ms": False}


def test_slo_terms_parse_and_reject_unknown_names():
    terms = parse_slo({"ttft_p99_ms": 500, "tpot_ms": 40})
    assert [(t.metric, t.percentile, t.limit_ms) for t in terms] == [("ttft", 99, 500), ("tpot", None, 40)]
    with pytest.raises(ValueError, match="latency_ms"):
        parse_slo(["latency_ms=3"])
    assert not meets_slo(rec(None, [], None, 0, ok=False), [])


def test_knee_is_where_goodput_reaches_its_plateau():
    curve = [(1, 1.0), (4, 3.8), (8, 7.0), (16, 9.6), (32, 10.0), (48, 9.9), (64, 6.0)]
    assert find_knee(curve) == 16  # 9.6 >= 0.95 * 10
    assert not past_the_knee(curve[:5])
    assert past_the_knee(curve + [(96, 4.0)])
    assert find_knee([]) is None and find_knee([(1, 0.0)]) is None


def test_prefix_hit_rate_comes_from_reported_cached_tokens():
    assert (
        summarize(
            [rec(0.1, [], 0.1, 1, prompt_tokens=100, cached=60), rec(0.1, [], 0.1, 1, prompt_tokens=100, cached=0)],
            1.0,
            [],
        ).prefix_hit_rate
        == 0.3
    )
    assert summarize([rec(0.1, [], 0.1, 1)], 1.0, []).prefix_hit_rate is None
