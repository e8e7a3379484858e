"""Engine adapters. `create_engine` picks one by the pool's engine kind; each
adapter imports its engine library lazily."""

from __future__ import annotations

from collections.abc import Callable

from orchestrator.config import AppConfig, PoolConfig, RoutingPolicy
from orchestrator.engines.base import Engine, EngineRole
from orchestrator.kv.events import KVEventBatch


def publishes_kv_events(app: AppConfig) -> bool:
    """Engines publish KV events exactly when the scheduler follows them."""
    return app.routing.policy is RoutingPolicy.KV_AWARE and app.routing.kv_events


def create_engine(app: AppConfig, pool: PoolConfig, role: EngineRole, host: str) -> Engine:
    if pool.engine.kind == "vllm":
        from orchestrator.engines.vllm_engine import VllmEngine

        return VllmEngine(app.model, app.kv_cache, pool.engine, role, host, app.network,
                          publish_kv_events=publishes_kv_events(app))
    if pool.engine.kind == "sim":
        from orchestrator.engines.sim_engine import SimEngine

        return SimEngine(app.model, app.kv_cache, pool.engine, role, host,
                         publish_kv_events=publishes_kv_events(app))
    if pool.engine.kind == "sglang":
        from orchestrator.engines.sglang_engine import SglangEngine

        return SglangEngine(app.model, app.kv_cache, pool.engine, role, host, app.network,
                            publish_kv_events=publishes_kv_events(app))
    raise ValueError(f"unknown engine kind {pool.engine.kind!r}")


def kv_event_decoder(engine_kind: str) -> Callable[[bytes, bytes], KVEventBatch]:
    """The decoder of an engine kind's KV event messages: (sequence frame,
    payload frame) -> batch; raises ValueError on garbage."""
    if engine_kind in ("vllm", "sim"):  # the simulated engine speaks vLLM's format
        from orchestrator.engines.vllm_kv_events import decode_batch

        return decode_batch
    if engine_kind == "sglang":  # same frames and replay protocol as vLLM, its own payload encoding
        from orchestrator.engines.sglang_kv_events import decode_batch as decode_sglang_batch

        return decode_sglang_batch
    raise ValueError(f"engine kind {engine_kind!r} publishes no KV events this index reads")


def process_env(app: AppConfig, pool: PoolConfig) -> dict[str, str]:
    """Environment variables the pool's replica processes must start with."""
    if pool.engine.kind == "vllm":
        from orchestrator.engines.vllm_engine import process_env as vllm_env

        return vllm_env(pool.engine, app.network)
    if pool.engine.kind == "sglang":
        from orchestrator.engines.sglang_engine import process_env as sglang_env

        return sglang_env(pool.engine, app.network)
    return {}


def check_engine_config(pool: PoolConfig) -> None:
    """Engine-specific validation at build time.

    vLLM: `engine_args` against vLLM's AsyncEngineArgs (vLLM must be installed).
    SGLang: `server_args` against the fields of SGLang's ServerArgs where SGLang
    is installed (GPU machines); elsewhere against the field names recorded
    in `sglang_engine.RECORDED_SERVER_ARGS_FIELDS` (a subset: a key outside it
    fails here and may still be valid, so check it where SGLang is installed)."""
    if pool.engine.kind == "vllm":
        from orchestrator.engines.vllm_engine import check_engine_args

        check_engine_args(pool.engine)
    elif pool.engine.kind == "sglang":
        from orchestrator.engines.sglang_engine import check_server_args, server_args_fields

        check_server_args(pool.engine, server_args_fields())
