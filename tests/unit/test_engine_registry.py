"""The engine registry: every engine kind the config accepts resolves to an
adapter that provides every capability; an unknown kind fails naming the
known ones."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

from orchestrator.config import AppConfig, KVCacheConfig, ModelConfig, NetworkConfig, PoolConfig
from orchestrator.engines import ADAPTER_MODULES, EngineAdapter, EngineSpec, check_output_parsers, engine_adapter
from orchestrator.engines.adapter import PlannerInputs
from orchestrator.engines.base import EngineRole, KVHandoff
from orchestrator.placement import ReplicaPlacement
from tests.factories import aggregated_config

KINDS = sorted(ADAPTER_MODULES)
MODEL = ModelConfig(name="m", source="org/m", max_model_len=4096)
# Every field but the kind and the optional ones (kv_handoff has a default; parsers: vLLM's only).
CAPABILITIES = [f.name for f in dataclasses.fields(EngineAdapter) if f.name not in ("kind", "kv_handoff", "parsers")]
ENGINE_METHODS = ("start", "generate", "prefill", "stats", "check_health", "shutdown")


def _engine_settings(kind: str):
    return PoolConfig(engine={"kind": kind}).engine


def test_the_registry_knows_exactly_the_kinds_the_config_accepts():
    assert KINDS == ["sglang", "sim", "vllm"]
    for kind in KINDS:
        assert _engine_settings(kind).kind == kind


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_resolves_to_its_modules_adapter(kind):
    adapter = engine_adapter(kind)
    assert adapter is importlib.import_module(ADAPTER_MODULES[kind]).ADAPTER
    assert isinstance(adapter, EngineAdapter) and adapter.kind == kind


def test_an_unknown_kind_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown engine kind 'tensorrt' \(known kinds: sglang, sim, vllm\)"):
        engine_adapter("tensorrt")


@pytest.mark.parametrize("kind", KINDS)
def test_each_adapter_provides_every_capability(kind):
    adapter, settings = engine_adapter(kind), _engine_settings(kind)
    assert all(callable(getattr(adapter, name)) for name in CAPABILITIES)
    assert isinstance(adapter.kv_handoff, KVHandoff)
    assert (adapter.parsers is not None) == (kind == "vllm")  # vLLM's own registries of output formats
    engine = adapter.create(EngineSpec(MODEL, KVCacheConfig(), settings, EngineRole.AGGREGATED, "127.0.0.1"))
    assert all(callable(getattr(engine, name)) for name in ENGINE_METHODS)
    env = adapter.process_env(settings, NetworkConfig(kv_handshake_timeout_s=30))
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    adapter.check_config(settings)  # the defaults pass
    with pytest.raises(ValueError):
        adapter.kv_event_decoder(bytes(8), b"\xc1not msgpack")
    placement = adapter.placement(4, 8, {"node": 1})
    assert isinstance(placement, ReplicaPlacement) and placement.bundles[0]["CPU"] == 4
    assert sum(b.get("GPU", 0) for b in placement.bundles) == 8
    assert isinstance(adapter.planner_inputs(settings), PlannerInputs)


def test_planner_inputs_are_what_each_engines_settings_say():
    vllm_cpu = PoolConfig(engine={"kind": "vllm", "device": "cpu", "max_num_seqs": 8, "cpu": {"kv_cache_gib": 2}})
    inputs = engine_adapter("vllm").planner_inputs(vllm_cpu.engine)
    assert (inputs.max_num_seqs, inputs.kv_cache_bytes, inputs.own_performance) == (8, 2 * 2**30, None)
    assert engine_adapter("vllm").planner_inputs(_engine_settings("vllm")).kv_cache_bytes is None
    sim = PoolConfig(engine={"kind": "sim", "num_gpu_blocks": 100}).engine
    perf, kv_tokens = engine_adapter("sim").planner_inputs(sim).own_performance(16)
    assert kv_tokens == 1600 and perf.kv_bytes_per_token > 0
    assert engine_adapter("sglang").planner_inputs(_engine_settings("sglang")) == PlannerInputs(max_num_seqs=None)


def test_only_sglang_hands_kv_over_by_rendezvous():
    assert {kind: engine_adapter(kind).kv_handoff for kind in KINDS} == {
        "sglang": KVHandoff.CONCURRENT,
        "sim": KVHandoff.AFTER_PREFILL,
        "vllm": KVHandoff.AFTER_PREFILL,
    }


@pytest.mark.parametrize("policy, published", [("kv_aware", True), ("round_robin", False)])
def test_a_pools_spec_carries_the_application_settings(policy, published):
    app = AppConfig(
        model=MODEL,
        decode_pool=PoolConfig(engine={"kind": "sim"}),
        routing={"policy": policy},
        network=NetworkConfig(kv_handshake_timeout_s=5),
    )
    spec = EngineSpec.for_pool(app, app.decode_pool, EngineRole.DECODE, "10.0.0.1")
    assert spec == EngineSpec(
        MODEL,
        app.kv_cache,
        app.decode_pool.engine,
        EngineRole.DECODE,
        "10.0.0.1",
        app.network,
        publish_kv_events=published,
    )


# (config field, a vLLM-only name, a frontend-own name, the first name a simulated engine knows)
OUTPUT_FORMATS = [
    ("tool_call_parser", "qwen3_coder", "hermes", "hermes"),
    ("reasoning_parser", "glm45", "qwen3", "deepseek_r1"),
]


@pytest.mark.parametrize("field, vllms, own, first_own", OUTPUT_FORMATS)
def test_an_output_format_name_is_checked_against_the_engines_registry_when_the_app_is_built(
    field, vllms, own, first_own
):
    check_output_parsers(aggregated_config("vllm", **{field: vllms}))  # vLLM's
    check_output_parsers(aggregated_config("sim", **{field: own}))  # the frontend's own
    with pytest.raises(
        ValueError, match=rf"{field} 'nope' is not a format of this app's engine \(vllm\); known: .*{vllms}"
    ):
        check_output_parsers(aggregated_config("vllm", **{field: "nope"}))
    with pytest.raises(
        ValueError, match=rf"'{vllms}' is not a format of this app's engine \(sim\); known: {first_own}"
    ):
        check_output_parsers(aggregated_config("sim", **{field: vllms}))
