"""The generated load shapes the planner is tested on (tools/workloads.py): each has the rate,
burstiness and lengths it says, and the same seed gives the same requests."""

from __future__ import annotations

import statistics

import pytest

from tools.workloads import bursty_prefill_requests, decode_heavy_requests, diurnal_requests

TOKENS = (100, 32000)


def _gaps(specs) -> list[float]:
    times = [s.arrival_s for s in specs]
    return [b - a for a, b in zip(times, times[1:])]


def test_bursty_prefill_has_long_prompts_short_outputs_and_clustered_arrivals():
    specs = bursty_prefill_requests(10, 4.0, seed=1, token_range=TOKENS)
    gaps = _gaps(specs)
    assert len(specs) / (10 * 60) == pytest.approx(4.0, rel=0.2)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) > 2.0  # Poisson would be 1
    isl = [len(s.prompt_token_ids) for s in specs]
    assert statistics.median(isl) == pytest.approx(1470, rel=0.1) and statistics.fmean(isl) == pytest.approx(
        2000, rel=0.1
    )
    assert statistics.fmean(s.max_tokens for s in specs) == pytest.approx(28, rel=0.15)
    assert specs == bursty_prefill_requests(10, 4.0, seed=1, token_range=TOKENS)


def test_decode_heavy_has_outputs_longer_than_prompts_and_poisson_arrivals():
    specs = decode_heavy_requests(10, 2.0, seed=2, token_range=TOKENS)
    gaps = _gaps(specs)
    assert statistics.pstdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, abs=0.15)
    assert statistics.fmean(s.max_tokens for s in specs) > 2 * statistics.fmean(len(s.prompt_token_ids) for s in specs)


def test_diurnal_ramps_up_to_its_peak_half_way_and_back_down():
    specs = diurnal_requests(30, 2.0, seed=3, token_range=TOKENS)
    horizon = 30 * 60
    thirds = [sum(1 for s in specs if k * horizon / 6 <= s.arrival_s < (k + 1) * horizon / 6) for k in range(6)]
    assert thirds[0] < thirds[2] and thirds[5] < thirds[3]  # quiet at night, busy at noon
    assert max(thirds) > 3 * min(thirds)
