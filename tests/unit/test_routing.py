from __future__ import annotations

from orchestrator.messages import EngineRequest, SamplingSpec
from orchestrator.pools import ReplicaView
from orchestrator.routing.base import RouteKind
from orchestrator.routing.round_robin import RoundRobinScheduler

REQ = EngineRequest("r", (1, 2, 3), SamplingSpec(max_tokens=4))


def _views(*ids):
    return [ReplicaView(i) for i in ids]


def test_round_robin_cycles_each_pool_independently():
    s = RoundRobinScheduler()
    routes = [s.route_request(REQ, _views("p0"), _views("d0", "d1", "d2")) for _ in range(4)]
    assert [r.decode_replica for r in routes] == ["d0", "d1", "d2", "d0"]
    assert [r.prefill_replica for r in routes] == ["p0"] * 4
    assert all(r.kind is RouteKind.REMOTE_PREFILL and r.remote_prefill for r in routes)


def test_without_a_prefill_pool_routes_are_aggregated():
    route = RoundRobinScheduler().route_request(REQ, None, _views("d0"))
    assert route.kind is RouteKind.AGGREGATED and route.prefill_replica is None and not route.remote_prefill


def test_a_decode_pool_that_has_not_reported_leaves_the_choice_to_serve():
    route = RoundRobinScheduler().route_request(REQ, _views("p0"), [])
    assert route.decode_replica is None and route.prefill_replica == "p0" and route.remote_prefill


def test_no_live_prefill_replica_means_local_prefill_not_a_wait():
    route = RoundRobinScheduler().route_request(REQ, [], _views("d0"))
    assert route.kind is RouteKind.LOCAL_PREFILL and route.decode_replica == "d0" and not route.remote_prefill


def test_requests_derive_prefill_and_decode_forms():
    pre = REQ.for_prefill("p0")
    assert pre.sampling.max_tokens == 1 and pre.target_replica == "p0" and pre.request_id != REQ.request_id
    assert pre.prompt_token_ids == REQ.prompt_token_ids
    dec = REQ.for_decode("d1", None)
    assert dec.target_replica == "d1" and dec.sampling == REQ.sampling and dec.request_id == REQ.request_id
