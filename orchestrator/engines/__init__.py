"""The engine registry: engine kind -> its adapter (`adapter.EngineAdapter`).

The only place that maps an engine kind to code. Adapter modules are
imported on first use, and import their engine library (vLLM, SGLang) only
inside the functions that run the engine, so importing this package, or
resolving an adapter, imports no engine library."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from orchestrator.config import AppConfig, PoolConfig
from orchestrator.engines.adapter import EngineAdapter, EngineSpec, EngineToolParsers, publishes_kv_events
from orchestrator.engines.base import Engine, EngineRole
from orchestrator.kv.events import KVEventBatch

if TYPE_CHECKING:
    from orchestrator.api.tool_parsers import ToolCallParser
    from orchestrator.prompts import Tokenizer

__all__ = [
    "ADAPTER_MODULES",
    "EngineAdapter",
    "EngineSpec",
    "check_engine_config",
    "check_tool_call_parser",
    "create_engine",
    "engine_adapter",
    "kv_event_decoder",
    "process_env",
    "publishes_kv_events",
    "tool_call_parser",
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


def _engine_tool_parsers(app: AppConfig) -> EngineToolParsers | None:
    """The tool-call formats of the engine that writes the answers (the primary group's decode pool)."""
    return engine_adapter(app.decode_pool.engine.kind).tool_parsers


def check_tool_call_parser(app: AppConfig) -> None:
    """Build-time check that `model.tool_call_parser` names a format the frontend or the engine reads;
    ValueError naming the known ones."""
    from orchestrator.api.tool_parsers import PARSERS

    name = app.model.tool_call_parser
    if name is None or name in PARSERS:
        return
    engine = _engine_tool_parsers(app)
    known = sorted({*PARSERS, *(engine.names() if engine is not None else ())})
    if name not in known:
        raise ValueError(
            f"model.tool_call_parser {name!r} is not a format of this app's engine "
            f"({app.decode_pool.engine.kind}); known: {', '.join(known)}"
        )


def tool_call_parser(app: AppConfig, tokenizer: Tokenizer) -> ToolCallParser | None:
    """The model's tool-call format for `tool_choice: "auto"`: read by the frontend where it has its own
    reader of that name, else by the engine's own parser; None when the config names none."""
    from orchestrator.api.tool_parsers import PARSERS

    name = app.model.tool_call_parser
    if name is None:
        return None
    if name in PARSERS:
        return PARSERS[name]
    check_tool_call_parser(app)
    engine = _engine_tool_parsers(app)
    assert engine is not None  # check_tool_call_parser: a name not ours is the engine's
    return engine.create(name, tokenizer)
