"""The frontend's parts are assembled in one place (`orchestrator.frontend`):
the Serve deployment, the sim server and these tests all go through
`build_frontend`; the cluster simulator through `build_routing`, and routes
exactly as the frontend does."""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx
import pytest

from orchestrator.api.app import AppHooks, build_openai_app
from orchestrator.config import PRIMARY_GROUP, AppConfig
from orchestrator.frontend import PoolGroup, build_frontend
from orchestrator.kv.events import BlockStored, KVEventBatch
from orchestrator.kv.ingest import KVEventIngest
from orchestrator.routing.base import RouteDecision, RouteKind, Scheduler
from orchestrator.routing.kv_scheduler import KvAwareScheduler
from tests.factories import FakePool, WordTokenizer, run

SIM = {"engine": {"kind": "sim"}}


def _config(**extra) -> AppConfig:
    return AppConfig.model_validate(
        {
            "model": {"name": "m", "source": "org/m", "max_model_len": 4096},
            "prefill_pool": SIM,
            "decode_pool": SIM,
            "routing": {"kv_events": False},
            **extra,
        }
    )


def _two_groups():
    config = _config(
        pool_groups=[{"name": "side", "decode_pool": SIM}],
        routing={"kv_events": False, "shape": {"prefix_group": "side"}},
    )
    groups = {
        PRIMARY_GROUP: PoolGroup(FakePool("decode_pool"), FakePool("prefill_pool", ("p0",))),
        "side": PoolGroup(FakePool("side_decode_pool", ("s0",))),
    }
    return config, groups


def test_two_groups_share_one_index_and_get_a_scheduler_and_a_path_each():
    config, groups = _two_groups()
    parts = build_frontend(config, groups, WordTokenizer())

    assert set(parts.routing.schedulers) == set(parts.paths) == {PRIMARY_GROUP, "side"}
    assert parts.routing.schedulers[PRIMARY_GROUP] is not parts.routing.schedulers["side"]
    assert all(isinstance(s, KvAwareScheduler) for s in parts.routing.schedulers.values())
    assert parts.routing.shape_router is not None
    assert parts.paths["side"].prefill_pool is None
    assert parts.groups_report() == {
        PRIMARY_GROUP: {"mode": "disaggregated", "pools": ["decode_pool", "prefill_pool"]},
        "side": {"mode": "aggregated", "pools": ["side_decode_pool"]},
    }

    # KV events of a replica in either group land in the one index the shape router measures.
    parts.routing.index.add_replica("s0")
    parts.routing.ingest.on_batch("s0", KVEventBatch(0, 0.0, (BlockStored((11, 12), None, tuple(range(32)), 16),)))
    assert parts.pools_report()["pools"]["side_decode_pool"][0]["indexed_blocks"] == 2


def test_health_is_ready_once_every_pool_of_every_group_has_a_replica():
    config, groups = _two_groups()
    groups["side"] = PoolGroup(FakePool("side_decode_pool", ()))
    parts = build_frontend(config, groups, WordTokenizer())
    health = parts.health()
    assert not health.ready
    assert health.detail["replicas"] == {"decode_pool": 2, "prefill_pool": 1, "side_decode_pool": 0}


def test_a_request_goes_through_the_assembled_service_and_its_path():
    groups = _two_groups()[1]
    parts = build_frontend(_config(), {PRIMARY_GROUP: groups[PRIMARY_GROUP]}, WordTokenizer())

    async def health():
        return parts.health()

    app = build_openai_app(parts.service, AppHooks(health=health, pools=parts.pools_report))

    async def complete():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://f") as client:
            return (
                await client.post("/v1/completions", json={"model": "m", "prompt": "a b c", "max_tokens": 3}),
                await client.get("/health"),
            )

    response, health_response = run(complete())
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 3
    assert health_response.status_code == 200
    assert [r.request_id for r in groups[PRIMARY_GROUP].decode.generates] != []


def test_the_primary_group_is_required():
    config, groups = _two_groups()
    with pytest.raises(ValueError, match="primary"):
        build_frontend(config, {"side": groups["side"]}, WordTokenizer())


class _Shadowed:
    """The simulator's scheduler with build_frontend's shadowing it: each call the simulator
    makes goes to both with the same arguments (the same replica views); the simulator acts
    on its own scheduler's decision, and both decisions are kept, in order."""

    def __init__(self, simulated: Scheduler, frontend: Scheduler) -> None:
        self.simulated, self.frontend = simulated, frontend
        self.decisions: list[tuple[RouteDecision, RouteDecision]] = []

    def route_request(self, request, prefill_replicas, decode_replicas) -> RouteDecision:
        ours = self.simulated.route_request(request, prefill_replicas, decode_replicas)
        self.decisions.append((ours, self.frontend.route_request(request, prefill_replicas, decode_replicas)))
        return ours

    def on_prefill_done(self, request_id: str) -> None:
        self.simulated.on_prefill_done(request_id)
        self.frontend.on_prefill_done(request_id)

    def on_request_finished(self, request_id: str) -> None:
        self.simulated.on_request_finished(request_id)
        self.frontend.on_request_finished(request_id)


class _BothIngests:
    """The simulator's KV event ingest, every batch also fed to the frontend's, at the same moment."""

    def __init__(self, simulated: KVEventIngest, frontend: KVEventIngest) -> None:
        self.simulated, self.frontend = simulated, frontend

    def on_batch(self, replica_id: str, batch: KVEventBatch):
        self.frontend.on_batch(replica_id, batch)
        return self.simulated.on_batch(replica_id, batch)

    def forget(self, replica_id: str) -> None:
        self.frontend.forget(replica_id)
        self.simulated.forget(replica_id)


@dataclass(frozen=True)
class _Arrival:
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival_s: float


def _shared_prefix_burst(n: int, seed: int) -> list[_Arrival]:
    """Prompts of three shapes in turn, arriving faster than they finish: short ones, long
    ones on one of three shared prefixes, and long unique ones."""
    rng = random.Random(seed)

    def tokens(k: int) -> tuple[int, ...]:
        return tuple(rng.randrange(100, 30000) for _ in range(k))

    prefixes = [tokens(1024) for _ in range(3)]

    def prompt(i: int) -> tuple[int, ...]:
        if i % 3 == 0:
            return tokens(64)
        if i % 3 == 1:
            return rng.choice(prefixes) + tokens(96)
        return tokens(1200)

    return [_Arrival(prompt(i), 24, i * 0.004) for i in range(n)]


def test_the_simulator_routes_every_request_as_the_frontend_would():
    """The cluster simulator's scheduler and the one build_frontend assembles, given the same
    routing config and block size, the same replica views and KV events in the same order,
    and the same tie-break seed, decide alike for every request of a simulated run."""
    from orchestrator.config import RoutingConfig
    from orchestrator.sim.cluster import ClusterSim, ClusterSpec
    from orchestrator.sim.link import LINKS
    from orchestrator.sim.perf_model import roofline

    # Away from the defaults, so that a scheduler built from anything but this config routes otherwise.
    # Remembered routes outlive the run: the simulator's clock is virtual, the frontend's the wall's.
    routing = RoutingConfig(
        prefill_weight=1.0, local_prefill_max_tokens=200, balance_abs_threshold=3, event_lag_ttl_s=3600
    )
    seed, block_size = 7, 32
    spec = ClusterSpec(2, 3, num_blocks=600, block_size=block_size, routing=routing)
    sim = ClusterSim(spec, roofline("H100", "llama-3.1-8b"), LINKS["infiniband"], seed=seed)
    parts = build_frontend(
        _config(kv_cache={"block_size": block_size}, routing=routing.model_dump(mode="json")),
        {PRIMARY_GROUP: PoolGroup(FakePool("decode_pool"), FakePool("prefill_pool"))},
        WordTokenizer(),
    )
    frontend = parts.routing.schedulers[PRIMARY_GROUP]
    frontend.rng = random.Random(seed)  # ties break by the scheduler's rng: seeded as the simulator seeds its own
    for replica_id in sim.replicas:  # the frontend follows the same replicas
        parts.routing.index.add_replica(replica_id)
    shadowed = sim.scheduler = _Shadowed(sim.scheduler, frontend)
    sim.ingest = _BothIngests(sim.ingest, parts.routing.ingest)

    requests = _shared_prefix_burst(60, seed)
    outcomes = sim.run(requests)

    assert len(outcomes) == len(shadowed.decisions) == len(requests) and all(o.finished for o in outcomes)
    simulated = [ours for ours, _ in shadowed.decisions]
    assert [theirs for _, theirs in shadowed.decisions] == simulated
    # ... across decisions of every kind: prompts prefilled locally and remotely, prefix cache
    # hits, and the balance guard overriding the cache.
    assert {d.kind for d in simulated} == {RouteKind.LOCAL_PREFILL, RouteKind.REMOTE_PREFILL}
    assert any(d.predicted_cached_tokens > 0 for d in simulated)
    assert any(d.balanced for d in simulated)
