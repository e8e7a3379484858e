"""KV-aware scheduling with plain data: index contents and replica reports in,
routes out."""

from __future__ import annotations

import random

import pytest

from orchestrator.config import RoutingConfig, SloClassConfig
from orchestrator.engines.base import EngineInfo, EngineRole, EngineStats
from orchestrator.kv.events import BlockStored
from orchestrator.kv.index import KVIndex
from orchestrator.messages import EngineRequest, SamplingSpec
from orchestrator.pools import ReplicaView
from orchestrator.routing import make_scheduler
from orchestrator.routing.base import RouteKind, RouteReason
from orchestrator.routing.cost import pick, replica_cost
from orchestrator.routing.kv_scheduler import KvAwareScheduler

BS = 16


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def prompt(n, seed=0):
    rng = random.Random(seed)
    return tuple(rng.randrange(1, 500) for _ in range(n))


def request(tokens, rid="r"):
    return EngineRequest(rid, tuple(tokens), SamplingSpec(max_tokens=8))


def views(*ids, capacity=None, usage=None):
    info = EngineInfo(EngineRole.DECODE, "vllm", "x", "e", "m", BS, 4096, "h", kv_capacity_blocks=capacity)
    return [
        ReplicaView(i, info=info, stats=EngineStats(kv_cache_usage=usage.get(i, 0.0)) if usage else None) for i in ids
    ]


def scheduler(clock=None, **routing):
    return KvAwareScheduler(RoutingConfig(**routing), BS, clock=clock or Clock(), rng=random.Random(0))


def hold(sched, replica, tokens, cache_salt=None):
    """The replica's engine reports the prompt's full blocks as stored (hashed under `cache_salt`)."""
    n = len(tokens) // BS
    sched.index.apply(
        replica,
        [BlockStored(tuple(f"{replica}-{i}" for i in range(n)), None, tuple(tokens[: n * BS]), BS, cache_salt)],
    )


# -- the cost function, hand-computed ------------------------------------------------


def test_cost_is_weighted_uncached_and_queued_blocks_plus_decode_load():
    # 10 prompt blocks, 6 cached there, 3 queued for prefill, 20 blocks decoding.
    assert replica_cost(10, 6, 3, 20, prefill_weight=1.0) == (10 - 6 + 3) + 20
    assert replica_cost(10, 6, 3, 20, prefill_weight=2.5) == 2.5 * 7 + 20
    assert replica_cost(4, 9, 0, 0, 1.0) == 0  # overlap beyond the prompt never goes negative


def test_pick_takes_the_cheapest_and_softmax_spreads_close_costs():
    rng = random.Random(1)
    assert pick([("a", 5.0), ("b", 2.0), ("c", 9.0)], 0.0, rng) == "b"
    draws = [pick([("a", 1.0), ("b", 1.1)], 1.0, rng) for _ in range(400)]
    assert 100 < draws.count("a") < 300
    assert {pick([("a", 0.0), ("b", 100.0)], 0.01, rng) for _ in range(50)} == {"a"}


# -- locality and load --------------------------------------------------------------------


def test_a_shared_prefix_goes_where_its_blocks_live():
    s = scheduler(local_prefill_max_tokens=10_000)
    shared = prompt(160)
    hold(s, "d1", shared)
    route = s.route_request(request(shared + prompt(20, seed=5)), [], views("d0", "d1", "d2"))
    assert route.decode_replica == "d1"
    assert route.predicted_cached_tokens == 160


def test_a_salted_prefix_is_found_only_by_requests_with_the_same_salt():
    s = scheduler(local_prefill_max_tokens=10_000)
    shared = prompt(160)
    hold(s, "d1", shared, cache_salt="tenant-a")
    hold(s, "d2", shared)

    def route(cache_salt):
        r = EngineRequest("r", tuple(shared + prompt(20, seed=5)), SamplingSpec(max_tokens=8), cache_salt=cache_salt)
        return s.route_request(r, [], views("d0", "d1", "d2"))

    salted, plain, other = route("tenant-a"), route(None), route("tenant-b")
    assert (salted.decode_replica, salted.predicted_cached_tokens) == ("d1", 160)
    assert (plain.decode_replica, plain.predicted_cached_tokens) == ("d2", 160)
    assert other.predicted_cached_tokens == 0


def test_load_outweighs_a_small_overlap():
    s = scheduler(local_prefill_max_tokens=10_000)
    shared = prompt(32)  # 2 blocks
    hold(s, "d1", shared)
    # d1's engine reports 50% of 100 blocks in use: 50 blocks of decode load > 2 blocks of credit.
    route = s.route_request(
        request(shared + prompt(64, seed=3)), [], views("d0", "d1", capacity=100, usage={"d1": 0.5})
    )
    assert route.decode_replica == "d0"


def test_a_burst_spreads_by_in_flight_load_then_drains():
    s = scheduler(local_prefill_max_tokens=10_000, event_lag_ttl_s=0)
    routes = [s.route_request(request(prompt(64, seed=i), rid=f"q{i}"), [], views("d0", "d1")) for i in range(4)]
    assert sorted(r.decode_replica for r in routes) == ["d0", "d0", "d1", "d1"]
    for i in range(4):
        s.on_request_finished(f"q{i}")
    assert s.load.in_flight() == 0 and s.load.decode_blocks("d0") == 0 and s.load.prefill_blocks("d1") == 0


def test_a_prefix_routed_moments_ago_is_found_before_its_events_arrive():
    s = scheduler(local_prefill_max_tokens=10_000, event_lag_ttl_s=5)
    shared = prompt(320)
    first = s.route_request(request(shared + prompt(16, seed=1), rid="a"), [], views("d0", "d1"))
    s.on_request_finished("a")
    second = s.route_request(request(shared + prompt(16, seed=2), rid="b"), [], views("d0", "d1"))
    assert second.decode_replica == first.decode_replica
    assert second.predicted_cached_tokens == 320


# -- conditional disaggregation --------------------------------------------------------------


def test_long_uncached_prompts_are_disaggregated_to_the_least_loaded_prefill_replica():
    s = scheduler(local_prefill_max_tokens=128)
    route = s.route_request(request(prompt(400)), views("p0", "p1"), views("d0"))
    assert route.kind is RouteKind.REMOTE_PREFILL and route.reason is RouteReason.DISAGGREGATED
    other = s.route_request(request(prompt(400, seed=2), rid="r2"), views("p0", "p1"), views("d0"))
    assert {route.prefill_replica, other.prefill_replica} == {"p0", "p1"}  # the first one's work is queued


def test_short_or_mostly_cached_prompts_prefill_on_the_decode_replica():
    s = scheduler(local_prefill_max_tokens=128)
    short = s.route_request(request(prompt(100)), views("p0"), views("d0"))
    assert short.kind is RouteKind.LOCAL_PREFILL and short.reason is RouteReason.SHORT_UNCACHED
    cached = prompt(480)
    hold(s, "d0", cached)
    long_but_cached = s.route_request(request(cached + prompt(40, seed=7), rid="r2"), views("p0"), views("d0"))
    assert long_but_cached.kind is RouteKind.LOCAL_PREFILL
    assert long_but_cached.predicted_cached_tokens == 480


def test_prefix_on_a_prefill_replica_picks_that_prefill_replica():
    s = scheduler(local_prefill_max_tokens=0)
    shared = prompt(320)
    hold(s, "p1", shared)
    route = s.route_request(request(shared + prompt(32, seed=4)), views("p0", "p1"), views("d0"))
    assert route.prefill_replica == "p1" and route.predicted_cached_tokens == 320


def test_a_saturated_prefill_pool_sends_work_to_decode_replicas():
    s = scheduler(local_prefill_max_tokens=0, max_prefill_queue_tokens=300)
    first = s.route_request(request(prompt(400), rid="a"), views("p0"), views("d0"))
    assert first.kind is RouteKind.REMOTE_PREFILL
    second = s.route_request(request(prompt(400, seed=1), rid="b"), views("p0"), views("d0"))
    assert second.kind is RouteKind.LOCAL_PREFILL and second.reason is RouteReason.PREFILL_SATURATED
    s.on_prefill_done("a")
    third = s.route_request(request(prompt(400, seed=2), rid="c"), views("p0"), views("d0"))
    assert third.kind is RouteKind.REMOTE_PREFILL


def test_no_prefill_pool_means_aggregated_and_an_empty_one_means_local():
    s = scheduler()
    assert s.route_request(request(prompt(900)), None, views("d0")).kind is RouteKind.AGGREGATED
    empty = s.route_request(request(prompt(900, seed=3), rid="x"), [], views("d0"))
    assert empty.kind is RouteKind.LOCAL_PREFILL and empty.reason is RouteReason.NO_PREFILL_REPLICA


def test_no_decode_replica_known_yet_leaves_the_choice_to_serve():
    route = scheduler().route_request(request(prompt(50)), None, [])
    assert route.decode_replica is None


# -- approximate mode ------------------------------------------------------------------------------


def test_approximate_mode_remembers_routes_until_their_ttl():
    clock = Clock()
    s = scheduler(clock=clock, kv_events=False, approximate_ttl_s=60, local_prefill_max_tokens=10_000)
    shared = prompt(320)
    first = s.route_request(request(shared + prompt(16, seed=1), rid="a"), [], views("d0", "d1", "d2"))
    s.on_request_finished("a")
    clock.now = 59
    again = s.route_request(request(shared + prompt(16, seed=2), rid="b"), [], views("d0", "d1", "d2"))
    assert again.decode_replica == first.decode_replica and again.predicted_cached_tokens == 320
    s.on_request_finished("b")
    clock.now = 200
    later = s.route_request(request(shared, rid="c"), [], views("d0", "d1", "d2"))
    assert later.predicted_cached_tokens == 0
    assert s.index.num_blocks() == 20  # only the newest route is remembered


@pytest.mark.parametrize("kv_events, ttl_field", [(True, "event_lag_ttl_s"), (False, "approximate_ttl_s")])
def test_memory_ttl_follows_the_mode(kv_events, ttl_field):
    clock = Clock()
    s = scheduler(clock=clock, kv_events=kv_events, **{ttl_field: 10}, local_prefill_max_tokens=10_000)
    s.route_request(request(prompt(64)), [], views("d0"))
    assert s.index.num_blocks() == 4
    clock.now = 11
    s.memory.expire()
    assert s.index.num_blocks() == 0


def test_decode_load_counts_a_shared_prefix_once():
    from orchestrator.routing.load import InflightLoad

    load = InflightLoad()
    prefix, a, b = [1, 2, 3, 4], [5, 6], [7]
    load.routed("a", "d0", 6, "d0", prefix + a)
    assert load.decode_blocks("d0") == 6 + 1
    assert load.added_decode_blocks("d0", prefix + b) == 1 + 1  # only its own block and its output
    assert load.added_decode_blocks("d1", prefix + b) == 5 + 1
    load.routed("b", "d0", 1, "d0", prefix + b)
    assert load.decode_blocks("d0") == 7 + 2
    load.finished("a")
    assert load.decode_blocks("d0") == 5 + 1
    load.finished("b")
    assert load.decode_blocks("d0") == 0 and load.added_decode_blocks("d0", prefix) == 5


# -- SGLang's balance guard ---------------------------------------------------------------


def test_a_burst_on_one_prefix_stays_with_its_cache_until_the_guard_spreads_it():
    """Requests sharing a 32-block prefix held by "a" pile onto "a" (their decode load there is the shared
    blocks, counted once); with the guard, once "a" runs more than 2 requests more than the idlest, the
    next goes to an idle replica, and a request that finishes on "a" lets the cache win again."""
    shared = prompt(32 * BS, seed=3)
    for guard, expected in ((None, ["a"] * 7), (2, ["a", "a", "a", "b", "a", "b", "a"])):
        sched = scheduler(balance_abs_threshold=guard)
        hold(sched, "a", shared)
        pools = views("a", "b")
        routes, guarded = [], []
        for i in range(7):
            if i == 6:  # 4 vs 2 -> 3 vs 2 requests: balanced again
                sched.on_request_finished("r0")
            decision = sched.route_request(request(shared + (i,), f"r{i}"), None, pools)
            routes.append(decision.decode_replica)
            guarded.append(decision.balanced)
        assert routes == expected, guard
        # The decisions the guard narrowed say so (the request path counts them).
        assert guarded == ([False] * 7 if guard is None else [False, False, False, True, False, True, False])


def test_the_guard_reads_the_engines_reported_queue_and_the_relative_threshold():
    shared = prompt(8 * BS, seed=4)
    busy = {"a": EngineStats(num_running=5, num_waiting=2), "b": EngineStats(num_running=4)}
    info = EngineInfo(EngineRole.DECODE, "vllm", "x", "e", "m", BS, 4096, "h")
    pools = [ReplicaView(r, info=info, stats=busy[r]) for r in ("a", "b")]
    sched = scheduler(balance_abs_threshold=2)
    hold(sched, "a", shared)
    assert sched.route_request(request(shared, "x1"), None, pools).decode_replica == "b"  # 7 vs 4: spread
    relaxed = scheduler(balance_abs_threshold=2, balance_rel_threshold=2.0)
    hold(relaxed, "a", shared)
    assert relaxed.route_request(request(shared, "x2"), None, pools).decode_replica == "a"  # 7 < 2 * 4: cache


def test_the_request_path_counts_each_request_the_guard_spreads():
    """Through the frontend: three concurrent requests on one prompt, approximate KV routing, a guard
    that spreads on any imbalance. The first goes where the cost says (either replica: a tie), the second
    finds that one a request busier than the other and is spread (counted), the third finds them even
    and follows the prompt's cache (not counted)."""
    import asyncio
    import collections

    from tests.factories import MODEL, FakePool, make_frontend

    routing = {"policy": "kv_aware", "kv_events": False, "balance_abs_threshold": 0, "balance_rel_threshold": 1.0}
    fe = make_frontend(disaggregated=False, decode=FakePool("decode_pool", chunk_delay_s=0.5), routing=routing)
    body = {"model": MODEL, "prompt": "the same words " * 20, "max_tokens": 2}

    async def three():
        async with fe.client() as client:
            return await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(3)))

    assert all(r.status_code == 200 for r in asyncio.run(three()))
    per_replica = collections.Counter(r.target_replica for r in fe.decode.generates)
    assert sorted(per_replica.values()) == [1, 2]  # ties broken at random: which one takes two varies
    assert fe.metric("orchestrator_balance_guard_routes_total") == 1


def test_an_interactive_prompt_avoids_a_prefill_queue_over_its_budget_where_a_batch_prompt_takes_it():
    """Routing by SLO class: p1 holds a 3,200-token prefix and 800 prompt tokens queued for prefill. By cost
    alone every prompt on that prefix goes to p1 (the prefix outweighs the queue); an interactive prompt, whose
    class allows 512 tokens ahead of it, goes to p0 instead; a batch prompt (no budget) still takes p1; and
    where every replica is over the budget, the interactive prompt takes the cheapest."""
    classes = [
        SloClassConfig(name="interactive", priority=0, ttft_p99_ms=500, itl_p50_ms=50, max_prefill_queue_tokens=512),
        SloClassConfig(name="batch", priority=10),
    ]
    s = make_scheduler(
        RoutingConfig(local_prefill_max_tokens=0), BS, KVIndex(), Clock(), random.Random(0), None, classes
    )
    shared = prompt(3200)
    hold(s, "p1", shared)
    queued = s.route_request(request(shared + prompt(800, seed=1), rid="q"), views("p0", "p1"), views("d0"))
    assert queued.prefill_replica == "p1"  # 50 blocks now queued there

    def route(rid, priority, seed):
        r = EngineRequest(rid, shared + prompt(32, seed=seed), SamplingSpec(max_tokens=8), priority=priority)
        return s.route_request(r, views("p0", "p1"), views("d0")).prefill_replica

    assert route("batch", 10, 2) == "p1"
    assert route("interactive", 0, 3) == "p0"
    s.on_prefill_done("interactive")
    assert route("later", 5, 4) == "p0"  # a request's own lower priority keeps its class's budget
    s.route_request(request(prompt(1600, seed=5), rid="fill"), views("p0"), views("d0"))  # p0 over it too
    assert route("interactive-2", 0, 6) == "p1"  # the cheaper of two over the budget
