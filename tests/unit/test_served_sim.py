"""The validation's served simulator (benchmarks/sim_validation.py): a request pays the server's idle cost
when nothing else is in flight there and its busy cost when something is; the client's clock starts at the
send."""

import pytest

from benchmarks.sim_validation import ServedSim
from tools.workloads import RequestSpec
from orchestrator.config import RoutingConfig
from orchestrator.sim.cluster import ClusterSpec
from orchestrator.sim.link import LINKS
from orchestrator.sim.perf_model import ProfileModel

PREFILL_S, STEP_S, IDLE_S, BUSY_S = 0.010, 0.002, 0.003, 0.008


def _sim() -> ServedSim:
    perf = ProfileModel([(1, PREFILL_S), (64, PREFILL_S)], {1: [(1, STEP_S), (1000, STEP_S)]},
                        request_overhead_s=IDLE_S, request_overhead_busy_s=BUSY_S)
    spec = ClusterSpec(0, 1, 1000, 16, routing=RoutingConfig(policy="round_robin"))
    return ServedSim(spec, perf, LINKS["pcie"])


def _requests(n: int) -> list[RequestSpec]:
    return [RequestSpec(tuple(range(100 * i, 100 * i + 32)), 4) for i in range(n)]


def test_one_client_at_a_time_always_finds_the_server_idle():
    outcomes = _sim().run_closed(_requests(3), concurrency=1)
    assert [o.ttft_s for o in outcomes] == pytest.approx([IDLE_S + PREFILL_S] * 3)


def _sent_at(times: tuple[float, ...], max_tokens: tuple[int, ...]) -> list[RequestSpec]:
    return [RequestSpec(r.prompt_token_ids, n, arrival_s=t)
            for r, t, n in zip(_requests(len(times)), times, max_tokens)]


def test_a_request_sent_while_another_is_in_flight_pays_the_busy_cost():
    # The first reaches the engine at 3 ms (idle), is prefilled by 13 ms and then decodes a token every 2 ms
    # (steps end at 15, 17, ...). The second, sent at 20.5 ms while the first decodes, reaches the engine
    # at 28.5 ms (busy: 8 ms), joins the step that starts at 29 (its prefill and the first's decode:
    # 12 ms): first token at 41 ms, 20.5 ms after its send. At the idle cost it would reach the engine at
    # 23.5 ms and have its first token at 37 ms. The third, sent after both are done, finds the server idle.
    arrivals = _sent_at((0.0, 0.0205, 1.0), (50, 4, 4))
    first, second, third = sorted(_sim().run(arrivals), key=lambda o: o.arrival_s)
    assert (first.arrival_s, second.arrival_s, third.arrival_s) == pytest.approx((0.0, 0.0205, 1.0))
    assert first.ttft_s == pytest.approx(IDLE_S + PREFILL_S)
    assert second.ttft_s == pytest.approx(0.0205)
    assert third.ttft_s == pytest.approx(IDLE_S + PREFILL_S)

    idle_only = _sim()
    idle_only.perf.request_overhead_busy_s = None
    second_at_idle_cost = sorted(idle_only.run(arrivals), key=lambda o: o.arrival_s)[1]
    assert second_at_idle_cost.ttft_s == pytest.approx(0.0165)


def test_a_rounds_copy_keeps_lengths_shared_prefixes_and_arrivals_with_other_tokens():
    from tools.workloads import TokenPool

    from benchmarks.sim_validation import relabeled

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
    from tools.client import RequestRecord

    from benchmarks.sim_validation import combine_rounds

    def records(ttft_s: float) -> list[RequestRecord]:
        return [RequestRecord(ok=True, ttft_s=ttft_s, itl_s=[0.01] * 10, e2e_s=ttft_s + 0.1, output_tokens=11)
                for _ in range(4)]

    rounds = [{"records": records(0.010), "duration": 1.0, "speed": {"factor": 1.0}, "cpu": {}},
              {"records": records(0.030), "duration": 1.0, "speed": {"factor": 1.2}, "cpu": {}}]
    combined = combine_rounds(rounds)
    assert combined["repeatability"]["ttft_ms_p50"] == pytest.approx((30 - 10) / 20)
    assert combined["repeatability"]["throughput"] == pytest.approx(0.0)
    assert combined["real"]["ttft_ms"]["p50"] == pytest.approx(20.0)
    assert combined["real"]["request_throughput"] == pytest.approx(4.0)
    assert combined["speed"] == {"factor": pytest.approx(1.1), "factors": [1.0, 1.2]}
    assert [r["real"]["ttft_ms"]["p50"] for r in combined["rounds"]] == pytest.approx([10.0, 30.0])
