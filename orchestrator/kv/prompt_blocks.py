"""A prompt's blocks as routing sees them, computed once a request: its chained
block hashes and, per replica, how many leading ones the KV index holds. The
shape router and the group's scheduler read the same object (same index, same
block size), in the same turn of the event loop."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.kv.hashing import block_hashes, prefix_root
from orchestrator.kv.index import KVIndex
from orchestrator.messages import EngineRequest


@dataclass(frozen=True)
class PromptBlocks:
    block_size: int
    hashes: list[int]
    overlaps: dict[str, int]  # replica -> leading blocks it holds; replicas holding none are absent

    @classmethod
    def of(cls, request: EngineRequest, block_size: int, index: KVIndex) -> PromptBlocks:
        hashes = block_hashes(
            request.prompt_token_ids,
            block_size,
            prefix_root(request.cache_salt, request.lora.name if request.lora else None),
        )
        return cls(block_size, hashes, index.overlaps(hashes) if hashes else {})
