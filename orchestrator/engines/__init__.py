"""Engine adapters. `create_engine` picks one by the pool's engine kind; each
adapter imports its engine library lazily."""

from __future__ import annotations

from orchestrator.config import AppConfig, PoolConfig
from orchestrator.engines.base import Engine, EngineRole


def create_engine(app: AppConfig, pool: PoolConfig, role: EngineRole, host: str) -> Engine:
    if pool.engine.kind == "vllm":
        from orchestrator.engines.vllm_engine import VllmEngine

        return VllmEngine(app.model, app.kv_cache, pool.engine, role, host, app.network)
    raise ValueError(f"unknown engine kind {pool.engine.kind!r}")


def process_env(app: AppConfig, pool: PoolConfig) -> dict[str, str]:
    """Environment variables the pool's replica processes must start with."""
    if pool.engine.kind == "vllm":
        from orchestrator.engines.vllm_engine import process_env as vllm_env

        return vllm_env(pool.engine, app.network)
    return {}


def check_engine_config(pool: PoolConfig) -> None:
    """Engine-specific validation that needs the engine library (build time)."""
    if pool.engine.kind == "vllm":
        from orchestrator.engines.vllm_engine import check_engine_args

        check_engine_args(pool.engine)
