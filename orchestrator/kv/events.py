"""KV cache events as the index consumes them, whatever engine produced them.

Engine adapters translate their engine's wire format into these (vLLM:
orchestrator/engines/vllm_kv_events.py). Engine block hashes are opaque
(int or bytes) and only ever compared for equality.
"""

from __future__ import annotations

from dataclasses import dataclass

EngineBlockHash = int | bytes


@dataclass(frozen=True)
class BlockStored:
    """Blocks the engine just cached, in prefix order. `parent_engine_hash` is
    the block before the first one (None: they start the prompt, hashed under
    `cache_salt` when the prompt had one). `lora_name`: the adapter they were
    computed with (None: the base model)."""

    engine_hashes: tuple[EngineBlockHash, ...]
    parent_engine_hash: EngineBlockHash | None
    token_ids: tuple[int, ...]
    block_size: int
    cache_salt: str | None = None
    lora_name: str | None = None


@dataclass(frozen=True)
class BlockRemoved:
    engine_hashes: tuple[EngineBlockHash, ...]


@dataclass(frozen=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True)
class KVEventBatch:
    """One publisher message. `seq` increases by one per batch from 0 at the
    publisher's start, which is how gaps and restarts are seen."""

    seq: int
    ts: float
    events: tuple[KVEvent, ...]
