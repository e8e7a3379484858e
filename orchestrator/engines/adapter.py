"""What an engine kind provides: each adapter module (vllm_engine.py,
sim_engine.py, sglang_engine.py) exports one `EngineAdapter` as `ADAPTER`;
the registry (`orchestrator.engines`) finds it by the pool's engine kind.
Everything that differs between engine kinds is a field of the adapter, so
nothing outside the registry and the adapters branches on the kind."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.config import AppConfig, KVCacheConfig, ModelConfig, NetworkConfig, PoolConfig, RoutingPolicy
from orchestrator.engines.base import Engine, EngineRole, KVHandoff
from orchestrator.kv.events import KVEventBatch
from orchestrator.placement import ReplicaPlacement

if TYPE_CHECKING:
    from orchestrator.api.reasoning_parsers import ReasoningParser
    from orchestrator.api.tool_parsers import ToolCallParser
    from orchestrator.prompts import Tokenizer
    from orchestrator.sim.perf_model import PerfModel

# An engine kind's own settings model (`VllmEngineConfig`, `SimEngineConfig`,
# `SglangEngineConfig`): each adapter receives only its own kind's.
EngineSettings = Any


def publishes_kv_events(app: AppConfig) -> bool:
    """Engines publish KV events exactly when the scheduler follows them."""
    return app.routing.policy is RoutingPolicy.KV_AWARE and app.routing.kv_events


@dataclass(frozen=True)
class EngineSpec:
    """Everything one replica's engine is built from."""

    model: ModelConfig
    kv_cache: KVCacheConfig
    engine: EngineSettings  # the pool's engine settings, of the adapter's own kind
    role: EngineRole
    host: str  # the node address the engine binds to and advertises
    network: NetworkConfig = field(default_factory=NetworkConfig)
    publish_kv_events: bool = False
    # Requests carry their SLO class's priority (traffic.classes configured): the engine schedules by it.
    priority_scheduling: bool = False

    @classmethod
    def for_pool(cls, app: AppConfig, pool: PoolConfig, role: EngineRole, host: str) -> EngineSpec:
        """The spec of one replica of `pool` in application `app`."""
        return cls(
            app.model,
            app.kv_cache,
            pool.engine,
            role,
            host,
            app.network,
            publish_kv_events=publishes_kv_events(app),
            priority_scheduling=bool(app.traffic.classes),
        )


@dataclass(frozen=True)
class PlannerInputs:
    """What the SLA planner reads of a pool's engine settings."""

    max_num_seqs: int | None  # the engine's limit on running sequences; None: not set (the planner assumes 256)
    kv_cache_bytes: int | None = None  # a KV budget the settings fix in bytes (vLLM on CPU); None: the profile's
    # The engine's own performance model and KV capacity in tokens, given the
    # block size (the simulated engine); None: it has none, and the planner
    # needs `planner.profile`.
    own_performance: Callable[[int], tuple[PerfModel, int]] | None = None


@dataclass(frozen=True)
class EngineParsers:
    """An engine's own registries of output formats (vLLM's `--tool-call-parser` and
    `--reasoning-parser` names), for the formats the frontend does not read itself
    (orchestrator/api/tool_parsers.py, reasoning_parsers.py). Each `create` takes
    (name, the frontend's tokenizer) and raises ValueError for a name it cannot serve."""

    tool_names: Callable[[], list[str]]
    tool_parser: Callable[[str, Tokenizer], ToolCallParser]
    reasoning_names: Callable[[], list[str]]
    reasoning_parser: Callable[[str, Tokenizer], ReasoningParser]


@dataclass(frozen=True)
class EngineAdapter:
    """One engine kind's capabilities. The callables take the kind's own
    settings model (`EngineSettings`) and never import the engine library at
    build time except where the check needs it (`check_config`)."""

    kind: str  # `engine.kind` in the config, `EngineInfo.engine_kind` at run time
    create: Callable[[EngineSpec], Engine]  # an engine, not started (no model loaded)
    # Environment variables the replica process must start with (before the engine library is imported).
    process_env: Callable[[EngineSettings, NetworkConfig], dict[str, str]]
    # Build-time check of the settings against the engine; raises ValueError.
    check_config: Callable[[EngineSettings], None]
    # (sequence frame, payload frame) of one KV event message -> batch; raises ValueError on garbage.
    kv_event_decoder: Callable[[bytes, bytes], KVEventBatch]
    # A tensor-parallel replica's placement group: (num_cpus, num_gpus, custom resources) -> placement.
    placement: Callable[[float, int, Mapping[str, float]], ReplicaPlacement]
    planner_inputs: Callable[[EngineSettings], PlannerInputs]
    # How a prompt's KV gets from a prefill to a decode replica: the two pools
    # of a disaggregated pair must agree on it.
    kv_handoff: KVHandoff = KVHandoff.AFTER_PREFILL
    # The engine's own tool-call and reasoning formats; None: only the frontend's own.
    parsers: EngineParsers | None = None


def no_config_check(engine: EngineSettings) -> None:
    """`check_config` of an engine whose settings the config model checks in full."""
    del engine


def no_process_env(engine: EngineSettings, network: NetworkConfig) -> dict[str, str]:
    """`process_env` of an engine that needs no environment."""
    del engine, network
    return {}
