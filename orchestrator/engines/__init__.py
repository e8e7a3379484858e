"""The engine registry: engine kind -> its adapter (`adapter.EngineAdapter`).

The only place that maps an engine kind to code. Adapter modules are
imported on first use, and import their engine library (vLLM, SGLang) only
inside the functions that run the engine, so importing this package, or
resolving an adapter, imports no engine library."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

from orchestrator.config import PRIMARY_GROUP, AppConfig, PlannerMode, PoolConfig
from orchestrator.engines.adapter import EngineAdapter, EngineParsers, EngineSpec, publishes_kv_events
from orchestrator.engines.base import Engine, EngineRole
from orchestrator.kv.events import KVEventBatch

if TYPE_CHECKING:
    from orchestrator.api.reasoning_parsers import ReasoningParser
    from orchestrator.api.tool_parsers import ToolCallParser
    from orchestrator.prompts import Tokenizer

__all__ = [
    "ADAPTER_MODULES",
    "EngineAdapter",
    "EngineSpec",
    "check_app",
    "check_engine_config",
    "check_output_parsers",
    "create_engine",
    "engine_adapter",
    "kv_event_decoder",
    "process_env",
    "publishes_kv_events",
    "reasoning_parser",
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


def check_app(app: AppConfig) -> None:
    """The build-time checks that need the engines' adapters (`orchestrator.config` validates
    without them): each pool's engine settings, that each group's pools hand KV over the same
    way, that an acting planner has the performance figures it sizes with, and the output
    formats the model names. ValueError naming the field."""
    for pool in app.all_pools().values():
        check_engine_config(pool)
    for group, pools in app.group_pools().items():
        _check_kv_handoff(group, pools)
    if app.planner.mode is not PlannerMode.OFF:
        engine = app.decode_pool.engine
        if app.planner.profile is None and engine_adapter(engine.kind).planner_inputs(engine).own_performance is None:
            raise ValueError(
                f"planner.profile is required for {engine.kind} pools (make one with `orchestrator profile`)"
            )
    check_output_parsers(app)


def _check_kv_handoff(group: str, pools: dict[str, PoolConfig]) -> None:
    """The pools of one group must hand KV over the same way
    (`EngineAdapter.kv_handoff`): e.g. an SGLang pool pairs by a bootstrap
    rendezvous, which only SGLang engines speak."""
    handoffs = {name: engine_adapter(pool.engine.kind).kv_handoff for name, pool in pools.items()}
    if len(set(handoffs.values())) > 1:
        where = "" if group == PRIMARY_GROUP else f"pool_groups[{group}]: "
        sides = ", ".join(
            f"{name} is kind {pools[name].engine.kind} ({handoff.value})" for name, handoff in handoffs.items()
        )
        raise ValueError(
            f"{where}prefill and decode pools hand KV over differently ({sides}): a pool hands KV "
            "over only to or from a pool of the same handoff (an SGLang pool: another SGLang pool)"
        )


def _engine_parsers(app: AppConfig) -> EngineParsers | None:
    """The output formats of the engine that writes the answers (the primary group's decode pool)."""
    return engine_adapter(app.decode_pool.engine.kind).parsers


def _check_format(app: AppConfig, field: str, own: Collection[str], engine_names: Callable[[], list[str]]) -> None:
    name = getattr(app.model, field)
    if name is None or name in own:
        return
    known = sorted({*own, *engine_names()})
    if name not in known:
        raise ValueError(
            f"model.{field} {name!r} is not a format of this app's engine "
            f"({app.decode_pool.engine.kind}); known: {', '.join(known)}"
        )


def check_output_parsers(app: AppConfig) -> None:
    """Build-time check that `model.tool_call_parser` and `model.reasoning_parser` name formats the
    frontend or the engine reads; ValueError naming the known ones."""
    from orchestrator.api import reasoning_parsers, tool_parsers

    engine = _engine_parsers(app)
    _check_format(app, "tool_call_parser", tool_parsers.PARSERS, engine.tool_names if engine else list)
    _check_format(app, "reasoning_parser", reasoning_parsers.PARSERS, engine.reasoning_names if engine else list)


def _output_parser(
    app: AppConfig, tokenizer: Tokenizer, field: str, own: Mapping[str, Any], engines: Callable[[EngineParsers], Any]
) -> Any:
    """The format `model.<field>` names: the frontend's own reader of that name (`own`), else the
    engine's parser (`engines` picks its factory); None when the config names none."""
    name = getattr(app.model, field)
    if name is None:
        return None
    if name in own:
        return own[name]
    check_output_parsers(app)
    engine = _engine_parsers(app)
    assert engine is not None  # checked: a name not the frontend's is the engine's
    return engines(engine)(name, tokenizer)


def tool_call_parser(app: AppConfig, tokenizer: Tokenizer) -> ToolCallParser | None:
    """The model's tool-call format for `tool_choice: "auto"` (`model.tool_call_parser`)."""
    from orchestrator.api.tool_parsers import PARSERS

    return _output_parser(app, tokenizer, "tool_call_parser", PARSERS, lambda e: e.tool_parser)


def reasoning_parser(app: AppConfig, tokenizer: Tokenizer) -> ReasoningParser | None:
    """The model's thinking format (`model.reasoning_parser`)."""
    from orchestrator.api.reasoning_parsers import PARSERS

    return _output_parser(app, tokenizer, "reasoning_parser", PARSERS, lambda e: e.reasoning_parser)
