"""The cluster simulator with a server in front (`ClusterSpec.server_overhead`): a request pays the server's
idle cost when nothing else is in flight there and its busy cost when something is; the client's clock
starts at the send."""

import pytest

from orchestrator.config import RoutingConfig
from orchestrator.sim.cluster import ClusterSim, ClusterSpec
from orchestrator.sim.link import LINKS
from orchestrator.sim.perf_model import ProfileModel
from tools.workloads import RequestSpec

PREFILL_S, STEP_S, IDLE_S, BUSY_S = 0.010, 0.002, 0.003, 0.008


def _sim(server_overhead: bool = True) -> ClusterSim:
    perf = ProfileModel(
        [(1, PREFILL_S), (64, PREFILL_S)],
        {1: [(1, STEP_S), (1000, STEP_S)]},
        request_overhead_s=IDLE_S,
        request_overhead_busy_s=BUSY_S,
    )
    spec = ClusterSpec(0, 1, 1000, 16, routing=RoutingConfig(policy="round_robin"), server_overhead=server_overhead)
    return ClusterSim(spec, perf, LINKS["pcie"])


def _requests(n: int) -> list[RequestSpec]:
    return [RequestSpec(tuple(range(100 * i, 100 * i + 32)), 4) for i in range(n)]


def test_one_client_at_a_time_always_finds_the_server_idle():
    outcomes = _sim().run_closed(_requests(3), concurrency=1)
    assert [o.ttft_s for o in outcomes] == pytest.approx([IDLE_S + PREFILL_S] * 3)


def _sent_at(times: tuple[float, ...], max_tokens: tuple[int, ...]) -> list[RequestSpec]:
    return [
        RequestSpec(r.prompt_token_ids, n, arrival_s=t) for r, t, n in zip(_requests(len(times)), times, max_tokens)
    ]


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


def test_without_a_server_in_front_a_request_reaches_the_engine_when_sent():
    outcomes = _sim(server_overhead=False).run_closed(_requests(3), concurrency=1)
    assert [o.ttft_s for o in outcomes] == pytest.approx([PREFILL_S] * 3)
