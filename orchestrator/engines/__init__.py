"""The engine registry: engine kind -> its adapter (`adapter.EngineAdapter`).

The only place that maps an engine kind to code. Adapter modules are
imported on first use, and import their engine library (vLLM, SGLang) only
inside the functions that run the engine, so importing this package, or
resolving an adapter, imports no engine library."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from orchestrator.config import AppConfig, PoolConfig
from orchestrator.engines.adapter import EngineAdapter, EngineSpec, publishes_kv_events
from orchestrator.engines.base import Engine, EngineRole
from orchestrator.kv.events import KVEventBatch

__all__ = [
    "ADAPTER_MODULES",
    "EngineAdapter",
    "EngineSpec",
    "check_engine_config",
    "create_engine",
    "engine_adapter",
    "kv_event_decoder",
    "process_env",
    "publishes_kv_events",
]

# Engine kind -> the module whose `ADAPTER` serves it.
ADAPTER_MODULES = {
    "vllm": "orchestrator.engines.vllm_engine",
    "sim": "orchestrator.engines.sim_engine",
    "sglang": "orchestrator.engines.sglang_engine",
}


def engine_adapter(kind: str) -> EngineAdapter:
    """The adapter of engine kind `kind`; ValueError naming the known kinds if there is none."""
    module = ADAPTER_MODULES.get(kind)
    if module is None:
        raise ValueError(f"unknown engine kind {kind!r} (known kinds: {', '.join(sorted(ADAPTER_MODULES))})")
    return importlib.import_module(module).ADAPTER


def create_engine(app: AppConfig, pool: PoolConfig, role: EngineRole, host: str) -> Engine:
    """An engine (not started) for one replica of `pool`."""
    return engine_adapter(pool.engine.kind).create(EngineSpec.for_pool(app, pool, role, host))


def kv_event_decoder(engine_kind: str) -> Callable[[bytes, bytes], KVEventBatch]:
    """The decoder of an engine kind's KV event messages: (sequence frame,
    payload frame) -> batch; raises ValueError on garbage."""
    return engine_adapter(engine_kind).kv_event_decoder


def process_env(app: AppConfig, pool: PoolConfig) -> dict[str, str]:
    """Environment variables the pool's replica processes must start with."""
    return engine_adapter(pool.engine.kind).process_env(pool.engine, app.network)


def check_engine_config(pool: PoolConfig) -> None:
    """Engine-specific validation of the pool's engine settings at build time."""
    engine_adapter(pool.engine.kind).check_config(pool.engine)
