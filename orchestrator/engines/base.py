"""The engine boundary: what a pool replica needs from an inference engine.

Adapters (vLLM, and later SGLang and the simulated engine) implement `Engine`;
nothing outside an adapter sees engine objects.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol

from orchestrator.messages import EngineChunk, EngineRequest, KVTransfer, PrefillResult


class EngineRole(str, enum.Enum):
    PREFILL = "prefill"  # computes prompts and hands their KV to a decode replica
    DECODE = "decode"  # pulls transferred KV and decodes; can also prefill locally
    AGGREGATED = "aggregated"  # no KV transfer


class KVHandoff(str, enum.Enum):
    """How a prompt's KV gets from a prefill replica to a decode replica.

    AFTER_PREFILL: the prefill call returns a `KVTransfer` (vLLM: block ids and
    the NIXL side channel); the decode request starts afterwards, carrying it.
    CONCURRENT: prefill and decode requests start together, carrying the same
    `KVTransfer` built by the frontend before either runs: a rendezvous (the
    prefill replica's bootstrap address and a room number, `rendezvous_transfer`)
    where the decode engine pre-allocates and the prefill engine sends its KV
    and the first output token it sampled, which the decode engine continues
    from (SGLang): so the prefill request carries what shapes that token
    (`EngineRequest.for_prefill(samples_first_token=True)`). After AFTER_PREFILL
    the decode engine samples the first token itself."""

    AFTER_PREFILL = "after_prefill"
    CONCURRENT = "concurrent"


# Keys of a rendezvous KVTransfer's engine_params (SGLang's own request field names).
BOOTSTRAP_HOST = "bootstrap_host"
BOOTSTRAP_PORT = "bootstrap_port"
BOOTSTRAP_ROOM = "bootstrap_room"
# Rooms are drawn uniformly from [0, 2**63), as SGLang's own load balancer does.
BOOTSTRAP_ROOM_BITS = 63


class EngineError(RuntimeError):
    """The engine failed a request (not the caller's fault)."""


class EngineRequestRejected(ValueError):
    """The engine refused a request as invalid (the caller's fault)."""


@dataclass(frozen=True)
class EngineInfo:
    """Static facts about one replica's engine, published once at start-up
    (Serve replica metadata) so that routers can address it."""

    role: EngineRole
    engine_kind: str
    engine_version: str
    engine_id: str
    model: str
    block_size: int
    max_model_len: int
    host: str
    kv_events_endpoint: str | None = None  # ZMQ PUB of KV cache events; None: not published
    kv_events_replay_endpoint: str | None = None  # ZMQ ROUTER serving missed batches by sequence number
    nixl_side_channel_port: int | None = None
    kv_capacity_blocks: int | None = None
    kv_bytes_per_token: int | None = None  # KV cache bytes one token takes (all layers); None: not reported
    pid: int | None = None  # the replica process that owns the engine
    kv_handoff: KVHandoff = KVHandoff.AFTER_PREFILL
    bootstrap_port: int | None = None  # a CONCURRENT prefill engine's rendezvous port, on `host`
    # False: a decode engine that computes no prompt itself (SGLang's decode
    # mode); every request it serves needs a remote prefill.
    prefills_locally: bool = True
    # The replica's direct data-plane port on `host` (orchestrator/wire); None: reach it through Serve only.
    stream_port: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["role"] = self.role.value
        d["kv_handoff"] = self.kv_handoff.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EngineInfo:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        values["role"] = EngineRole(values["role"])
        if "kv_handoff" in values:
            values["kv_handoff"] = KVHandoff(values["kv_handoff"])
        return cls(**values)


def rendezvous_transfer(prefill: EngineInfo, num_tokens: int, room: int) -> KVTransfer:
    """The KVTransfer both halves of a CONCURRENT handoff carry: the prefill
    replica's bootstrap address and a room unique to this request. Raises
    ValueError when the prefill engine published no bootstrap port."""
    if prefill.kv_handoff is not KVHandoff.CONCURRENT or prefill.bootstrap_port is None:
        raise ValueError(f"engine {prefill.engine_id} publishes no KV rendezvous")
    blocks = -(-num_tokens // prefill.block_size)
    return KVTransfer(
        source_engine_id=prefill.engine_id,
        num_blocks=blocks,
        num_tokens=num_tokens,
        engine_params={BOOTSTRAP_HOST: prefill.host, BOOTSTRAP_PORT: prefill.bootstrap_port, BOOTSTRAP_ROOM: room},
    )


@dataclass(frozen=True)
class EngineStats:
    """A replica's load and cumulative counters, as its engine reports them.

    Gauges are the latest values; `*_total` fields only grow over the life of
    the engine (a restarted replica starts from zero)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prompt_tokens_computed_total: int = 0
    prompt_tokens_local_cache_total: int = 0
    prompt_tokens_transferred_total: int = 0
    generation_tokens_total: int = 0
    requests_finished_total: int = 0
    # Engine-side decode of finished requests: seconds from the first output
    # token to the last, and the tokens after the first, as the engine core
    # timed them (before any hop to the client). Their ratio is the engine's
    # own time per output token. 0 from engines that do not report it.
    decode_seconds_total: float = 0.0
    decode_tokens_total: int = 0
    kv_transfers_total: int = 0
    kv_transfer_failures_total: int = 0
    # LoRA adapters read from their source because the engine's host cache (max_cpu_loras, LRU) lacked them:
    # counted by the simulated engine as it loads; for vLLM, replayed from the adapters its scheduler reports
    # running each step through that same LRU (vLLM counts no loads itself).
    lora_loads_total: int = 0
    kv_transfer_bytes_total: int = 0
    kv_transfer_seconds_total: float = 0.0
    # Connections the replica's data-plane server closed: a wrong, missing or late proof, past its connection
    # limit, or a protocol error. Counted by the replica (deployments/engine_replica.py), not the engine.
    data_plane_refused_total: int = 0
    # Data-plane streams the replica cut because their reader took no data for `WireLimits.stalled_stream_s`.
    data_plane_stalled_streams_total: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EngineStats:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


class Engine(Protocol):
    """One inference engine inside one pool replica."""

    async def start(self) -> EngineInfo: ...

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        """Stream the request's output. With `request.kv_transfer` set, the
        prompt's KV is pulled from the prefill replica instead of computed.
        Cancelling the iteration aborts the request in the engine and frees
        its KV blocks."""
        ...

    async def prefill(self, request: EngineRequest) -> PrefillResult:
        """Compute the prompt and keep its KV for a remote decode replica."""
        ...

    def stats(self) -> EngineStats: ...

    async def check_health(self) -> None:
        """Raise if the engine can no longer serve."""
        ...

    def shutdown(self) -> None: ...
