"""The frontend's parts are assembled in one place (`orchestrator.frontend`):
the Serve deployment, the sim server and these tests all go through
`build_frontend`; the cluster simulator through `build_routing`."""

from __future__ import annotations

import httpx
import pytest

from orchestrator.api.app import AppHooks, build_openai_app
from orchestrator.config import PRIMARY_GROUP, AppConfig
from orchestrator.frontend import PoolGroup, build_frontend
from orchestrator.kv.events import BlockStored, KVEventBatch
from orchestrator.routing import build_routing
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


def test_the_simulator_routes_with_the_same_assembly():
    from orchestrator.config import RoutingConfig
    from orchestrator.sim.cluster import ClusterSim, ClusterSpec
    from orchestrator.sim.link import LINKS
    from orchestrator.sim.perf_model import roofline

    sim = ClusterSim(
        ClusterSpec(1, 1, 1000, routing=RoutingConfig()), roofline("H100", "llama-3.1-8b"), LINKS["nvlink"]
    )
    routing = build_routing(RoutingConfig(), 16)
    assert type(sim.scheduler) is type(routing.schedulers[PRIMARY_GROUP]) is KvAwareScheduler
