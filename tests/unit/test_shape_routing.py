"""Routing among pool groups by request shape: the ShapeRouter over
hand-built KV index states, and the service sending each request down the
path of the group it names (fake pools, real request paths and schedulers)."""

from __future__ import annotations

import pytest

from orchestrator.api.admission import AdmissionGate
from orchestrator.api.responses import Endpoint
from orchestrator.api.service import CompletionService, ModelCard
from orchestrator.config import PRIMARY_GROUP, RoutingConfig, ShapePolicy, ShapeRoutingConfig
from orchestrator.kv.hashing import block_hashes
from orchestrator.kv.index import KVIndex
from orchestrator.messages import EngineRequest, SamplingSpec
from orchestrator.metrics import FrontendMetrics
from orchestrator.prompts import PromptRenderer
from orchestrator.request_path import RequestPath
from orchestrator.routing.kv_scheduler import KvAwareScheduler
from orchestrator.routing.load import InflightLoad
from orchestrator.routing.shape import CombinedLoad, ShapeClass, ShapeDecision, ShapeRouter
from tests.factories import MODEL, FakePool, WordTokenizer, run

BS = 4
GROUPS = (PRIMARY_GROUP, "sim")
PREFIX = tuple(range(100, 132))  # 8 blocks
SHAPE = ShapeRoutingConfig(prefix_group="sim", unique_group=PRIMARY_GROUP, min_prefix_reuse=0.5)


def _router(config: ShapeRoutingConfig = SHAPE, index: KVIndex | None = None) -> ShapeRouter:
    return ShapeRouter(config, BS, index if index is not None else KVIndex(), GROUPS)


def _classify(router: ShapeRouter, prompt, max_tokens: int) -> ShapeDecision:
    return router.route(EngineRequest("r", tuple(prompt), SamplingSpec(max_tokens=max_tokens)))


def _index_holding(replica: str, tokens) -> KVIndex:
    index = KVIndex()
    index.store_hashes(replica, block_hashes(tokens, BS))
    return index


def test_nothing_cached_is_unique_and_goes_to_the_unique_group():
    d = _classify(_router(), PREFIX + (1, 2, 3, 4), 16)
    assert (d.group, d.shape) == (PRIMARY_GROUP, ShapeClass.UNIQUE)
    assert (d.prompt_tokens, d.prompt_blocks, d.reused_blocks, d.reuse) == (36, 9, 0, 0.0)


def test_a_cached_prefix_makes_the_request_prefix_heavy_wherever_it_is_cached():
    """Reuse is measured over every group's replicas: a prefix the primary
    group holds sends the request to the prefix group."""
    for holder in ("primary-decode-0", "sim-decode-0"):
        router = _router(index=_index_holding(holder, PREFIX))
        d = _classify(router, PREFIX + (7, 7, 7, 7, 8, 8, 8, 8), 16)
        assert (d.group, d.shape) == ("sim", ShapeClass.PREFIX_HEAVY)
        assert (d.prompt_blocks, d.reused_blocks) == (10, 8) and d.reuse == pytest.approx(0.8)


def test_the_longest_prefix_over_replicas_counts_not_the_sum():
    index = KVIndex()
    index.store_hashes("a", block_hashes(PREFIX[:12], BS))  # 3 blocks
    index.store_hashes("b", block_hashes(PREFIX[:16], BS))  # 4 blocks
    d = _classify(_router(index=index), PREFIX, 1)
    assert d.reused_blocks == 4 and d.reuse == 0.5 and d.shape is ShapeClass.PREFIX_HEAVY  # 0.5 >= 0.5


def test_reuse_below_the_threshold_is_unique():
    index = _index_holding("a", PREFIX[:12])  # 3 of 8 blocks
    d = _classify(_router(index=index), PREFIX, 1)
    assert d.reuse == pytest.approx(3 / 8) and (d.group, d.shape) == (PRIMARY_GROUP, ShapeClass.UNIQUE)


def test_a_block_that_differs_early_breaks_the_prefix():
    """Only a leading run counts: the same blocks after a different first block are not reuse."""
    index = _index_holding("a", PREFIX)
    d = _classify(_router(index=index), (1, 1, 1, 1) + PREFIX[4:], 1)
    assert d.reused_blocks == 0 and d.shape is ShapeClass.UNIQUE


def test_short_prompts_and_long_outputs_stay_on_the_unique_group():
    config = SHAPE.model_copy(update={"min_prompt_tokens": 20, "max_output_tokens": 64})
    index = _index_holding("a", PREFIX)
    router = _router(config, index)
    short = _classify(router, PREFIX[:16], 1)  # fully cached, but 16 < 20 tokens
    assert (short.group, short.shape) == (PRIMARY_GROUP, ShapeClass.SHORT_PROMPT)
    long_out = _classify(router, PREFIX, 65)
    assert (long_out.group, long_out.shape) == (PRIMARY_GROUP, ShapeClass.LONG_OUTPUT)
    assert _classify(router, PREFIX, 64).shape is ShapeClass.PREFIX_HEAVY


def test_a_prompt_under_one_block_has_no_reuse():
    d = _classify(_router(index=_index_holding("a", PREFIX)), PREFIX[:3], 1)
    assert (d.prompt_blocks, d.reuse, d.shape) == (0, 0.0, ShapeClass.UNIQUE)


def test_round_robin_alternates_groups_and_still_measures_shape():
    config = SHAPE.model_copy(update={"policy": ShapePolicy.ROUND_ROBIN})
    router = _router(config, _index_holding("a", PREFIX))
    decisions = [_classify(router, PREFIX, 1) for _ in range(4)]
    assert [d.group for d in decisions] == [PRIMARY_GROUP, "sim", PRIMARY_GROUP, "sim"]
    assert {d.shape for d in decisions} == {ShapeClass.PREFIX_HEAVY}


def test_groups_the_config_names_must_exist():
    with pytest.raises(ValueError, match="sglang"):
        ShapeRouter(SHAPE.model_copy(update={"prefix_group": "sglang"}), BS, KVIndex(), GROUPS)


def test_combined_load_reads_each_replica_from_its_own_scheduler():
    a, b = InflightLoad(), InflightLoad()
    a.routed("q1", "pa", 3, "da", [1, 2, 3])
    b.routed("q2", "pb", 5, "db", [4, 5])
    load = CombinedLoad([a, b])
    assert (load.prefill_blocks("pa"), load.prefill_blocks("pb"), load.prefill_blocks("zz")) == (3, 5, 0)
    assert (load.decode_blocks("da"), load.decode_blocks("db")) == (a.decode_blocks("da"), b.decode_blocks("db"))
    assert load.decode_blocks("da") > 0 and b.decode_blocks("da") == 0


# -- the service over two groups -------------------------------------------------


def _service(config: ShapeRoutingConfig = SHAPE):
    index = KVIndex()
    metrics = FrontendMetrics()
    routing = RoutingConfig(event_lag_ttl_s=60)  # route memory stands in for engine events here
    pools = {PRIMARY_GROUP: FakePool("decode_pool", ("p0",)), "sim": FakePool("sim_decode_pool", ("s0", "s1"))}
    paths = {
        g: RequestPath(pool, None, KvAwareScheduler(routing, BS, index), metrics, prefill_timeout_s=5)
        for g, pool in pools.items()
    }
    ids = iter(range(1000))
    service = CompletionService(
        ModelCard(MODEL, 4096, 0),
        PromptRenderer(WordTokenizer()),
        paths[PRIMARY_GROUP],
        metrics,
        gate=AdmissionGate(16),
        new_id=lambda: f"r{next(ids)}",
        group_paths=paths,
        shape_router=ShapeRouter(config, BS, index, GROUPS),
    )
    return service, pools, metrics


def _complete(service, prompt, max_tokens=2):
    import json

    return run(
        service.handle(
            Endpoint.COMPLETIONS,
            json.dumps({"model": MODEL, "prompt": list(prompt), "max_tokens": max_tokens}).encode(),
        )
    )


def _count(metrics, group, shape):
    value = metrics.registry.get_sample_value(
        "orchestrator_shape_route_decisions_total", {"group": group, "shape": shape}
    )
    return value or 0.0


def test_a_shared_prefix_moves_to_the_prefix_group_once_the_index_knows_it():
    service, pools, metrics = _service()
    for i in range(4):
        _complete(service, PREFIX + (200 + i,) * 4)
    _complete(service, tuple(range(300, 340)))  # unique
    # The first request of the prefix is unique (nothing held it); the
    # scheduler's route memory puts it in the index, so the next three are
    # prefix-heavy and go to the sim group.
    assert [len(r.prompt_token_ids) for r in pools[PRIMARY_GROUP].generates] == [36, 40]
    assert len(pools["sim"].generates) == 3
    # The sim group's scheduler keeps the prefix on one replica.
    assert len({r.target_replica for r in pools["sim"].generates}) == 1
    assert _count(metrics, PRIMARY_GROUP, "unique") == 2 and _count(metrics, "sim", "prefix_heavy") == 3
    assert metrics.registry.get_sample_value("orchestrator_shape_prefix_reuse_ratio_count") == 5


def test_a_group_without_live_replicas_hands_its_requests_to_the_unique_group():
    service, pools, metrics = _service()
    pools["sim"].replica_ids = ()
    for i in range(3):
        _complete(service, PREFIX + (200 + i,) * 4)
    assert len(pools[PRIMARY_GROUP].generates) == 3
    assert _count(metrics, PRIMARY_GROUP, "prefix_heavy") == 2


# -- the application graph ---------------------------------------------------------


def test_the_mixed_config_builds_a_deployment_per_pool_of_every_group():
    from pathlib import Path

    from deployments.app import build_app
    from orchestrator.config import load_app_config

    config = load_app_config(Path(__file__).resolve().parents[2] / "configs" / "mixed-cpu.yaml")
    frontend = build_app(config)._bound_deployment
    _, decode, prefill, groups = frontend.init_args
    assert (decode._bound_deployment.name, prefill._bound_deployment.name) == ("decode_pool", "prefill_pool")
    assert {g: [p._bound_deployment.name for p in pair] for g, pair in groups.items()} == {
        "sim": ["sim_decode_pool", "sim_prefill_pool"]
    }
    # The group's replicas see the group's pools as the top-level ones, in their roles.
    sim_decode, sim_prefill = (p._bound_deployment for p in groups["sim"])
    assert sim_decode.init_args[1] == "decode" and sim_prefill.init_args[1] == "prefill"
    assert sim_decode.init_args[0]["decode_pool"]["engine"]["kind"] == "sim"
    assert sim_decode.init_args[0]["pool_groups"] == [] and sim_decode.init_args[0]["routing"]["shape"] is None


def test_an_app_without_groups_binds_the_frontend_as_before():
    from pathlib import Path

    from deployments.app import build_app
    from orchestrator.config import load_app_config

    config = load_app_config(Path(__file__).resolve().parents[2] / "configs" / "agg-cpu.yaml")
    args = build_app(config)._bound_deployment.init_args
    assert len(args) == 3 and args[2] is None
