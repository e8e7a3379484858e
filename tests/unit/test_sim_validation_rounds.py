"""The simulator validation's helpers (benchmarks/sim_validation.py): rounds relabeled and pooled."""

import pytest

from tools.workloads import RequestSpec


def test_a_rounds_copy_keeps_lengths_shared_prefixes_and_arrivals_with_other_tokens():
    from benchmarks.sim_validation import relabeled
    from tools.workloads import TokenPool

    pool = TokenPool.vocabulary(500)
    shared = tuple(range(10, 42))
    specs = [RequestSpec(shared + (50, 51), 4, arrival_s=0.5), RequestSpec(shared + (60,), 8, arrival_s=1.0)]
    assert relabeled(specs, pool, 0) == specs
    a, b = relabeled(specs, pool, 1)
    assert [(len(r.prompt_token_ids), r.max_tokens, r.arrival_s) for r in (a, b)] == [(34, 4, 0.5), (33, 8, 1.0)]
    assert a.prompt_token_ids[:32] == b.prompt_token_ids[:32] != shared
    assert set(a.prompt_token_ids) <= set(pool.ids)
    assert relabeled(specs, pool, 1) == [a, b] != relabeled(specs, pool, 2)


def test_rounds_are_pooled_and_their_spread_is_how_far_their_own_p50s_are_apart():
    from benchmarks.sim_validation import combine_rounds
    from tools.client import RequestRecord

    def records(ttft_s: float) -> list[RequestRecord]:
        return [
            RequestRecord(ok=True, ttft_s=ttft_s, itl_s=[0.01] * 10, e2e_s=ttft_s + 0.1, output_tokens=11)
            for _ in range(4)
        ]

    rounds = [
        {"records": records(0.010), "duration": 1.0, "speed": {"factor": 1.0}, "cpu": {}},
        {"records": records(0.030), "duration": 1.0, "speed": {"factor": 1.2}, "cpu": {}},
    ]
    combined = combine_rounds(rounds)
    assert combined["repeatability"]["ttft_ms_p50"] == pytest.approx((30 - 10) / 20)
    assert combined["repeatability"]["throughput"] == pytest.approx(0.0)
    assert combined["real"]["ttft_ms"]["p50"] == pytest.approx(20.0)
    assert combined["real"]["request_throughput"] == pytest.approx(4.0)
    assert combined["speed"] == {"factor": pytest.approx(1.1), "factors": [1.0, 1.2]}
    assert [r["real"]["ttft_ms"]["p50"] for r in combined["rounds"]] == pytest.approx([10.0, 30.0])
