"""A paged KV block manager with prefix caching and LRU eviction, as vLLM's.

Invariants:
  * a block is either held (ref_count > 0, by the running sequences using it)
    or free; a free block with a hash is still a cache entry until evicted;
  * `_cached[h]` is the block whose full contents hash to h (one per hash);
  * a block gets its hash when it becomes full and computed; the event
    stream then says BlockStored, and BlockRemoved when its block is
    evicted (reused for other contents) — so an index following the events
    always matches `_cached`;
  * free blocks are reused least recently used first, uncached ones before
    any cached one.
Block hashes are the routing hashes (orchestrator/kv/hashing.py), which are
also what the events carry as engine hashes; a salted prompt's chain starts
at its salt's root, as the engine's does.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from orchestrator.kv.events import BlockRemoved, BlockStored, KVEvent
from orchestrator.kv.hashing import block_hashes, iter_block_hashes, prefix_root


@dataclass(slots=True)
class _Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None


@dataclass(slots=True)
class SequenceBlocks:
    """The blocks one sequence holds, in order, and how many of its tokens
    have KV computed in them."""

    token_ids: list[int]
    blocks: list[int] = field(default_factory=list)
    computed_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens found in the cache at allocation
    chain: list[int] = field(default_factory=list)  # hashes of the full, computed blocks, in order
    cache_salt: str | None = None  # the prompt's (vLLM's cache_salt): its first block is hashed under it
    lora_name: str | None = None  # the adapter it runs with: its blocks are hashed under it


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._blocks = [_Block(i) for i in range(num_blocks)]
        # Free blocks: those holding no cache entry (a stack), and cache entries (LRU first).
        self._free_uncached: list[int] = list(range(num_blocks - 1, -1, -1))
        self._free_cached: OrderedDict[int, None] = OrderedDict()
        self._cached: dict[int, int] = {}
        self._events: list[KVEvent | list[int]] = []  # a list: evicted hashes, not yet one BlockRemoved

    # -- capacity -------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        return len(self._free_uncached) + len(self._free_cached)

    @property
    def usage(self) -> float:
        return 1.0 - self.free_blocks / self.num_blocks

    def blocks_needed(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # -- allocation -------------------------------------------------------------

    def cached_prefix(
        self, token_ids: list[int], cache_salt: str | None = None, lora_name: str | None = None
    ) -> list[int]:
        """Blocks that already hold this prompt's leading full blocks (hashed under `cache_salt` and `lora_name`)."""
        if not self.enable_prefix_caching:
            return []
        found = []
        # The last token is always computed, so a fully cached prompt reuses all but its last block.
        for h in iter_block_hashes(token_ids[:-1], self.block_size, prefix_root(cache_salt, lora_name)):
            block_id = self._cached.get(h)
            if block_id is None:
                break
            found.append(block_id)
        return found

    def allocate(
        self, token_ids: list[int], cache_salt: str | None = None, lora_name: str | None = None
    ) -> SequenceBlocks | None:
        """Blocks for a new sequence's prompt: cached leading blocks are
        shared, the rest are fresh. None if they do not fit."""
        cached = self.cached_prefix(token_ids, cache_salt, lora_name)
        reusable_free = sum(1 for b in cached if self._blocks[b].ref_count == 0)
        fresh = self.blocks_needed(len(token_ids)) - len(cached)
        if fresh > self.free_blocks - reusable_free:
            return None
        seq = SequenceBlocks(list(token_ids), cache_salt=cache_salt, lora_name=lora_name)
        for block_id in cached:
            self._hold(block_id)
            seq.blocks.append(block_id)
            seq.chain.append(self._blocks[block_id].hash)
        seq.computed_tokens = seq.cached_tokens = len(seq.blocks) * self.block_size
        for _ in range(fresh):
            seq.blocks.append(self._take_free())
        return seq

    def append_slot(self, seq: SequenceBlocks, token_id: int) -> bool:
        """Room for one more token (a generated one); False if no block is free."""
        if len(seq.token_ids) == len(seq.blocks) * self.block_size:
            if not self.free_blocks:
                return False
            seq.blocks.append(self._take_free())
        seq.token_ids.append(token_id)
        return True

    def mark_computed(self, seq: SequenceBlocks, tokens: int) -> None:
        """`tokens` more of the sequence's tokens have KV now; blocks that
        became full are committed to the cache (BlockStored)."""
        before = seq.computed_tokens // self.block_size
        seq.computed_tokens = min(seq.computed_tokens + tokens, len(seq.token_ids))
        after = seq.computed_tokens // self.block_size
        if after > before and self.enable_prefix_caching:
            self._commit(seq, before, after)

    def free(self, seq: SequenceBlocks) -> None:
        """The sequence is done: its blocks go back, most recently used last,
        cached ones staying reusable until evicted."""
        for block_id in reversed(seq.blocks):
            block = self._blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash is None:
                    self._free_uncached.append(block_id)
                else:
                    self._free_cached[block_id] = None
        seq.blocks.clear()

    def drain_events(self) -> list[KVEvent]:
        """Events since the last drain, in order; consecutive evictions come as
        one BlockRemoved (as vLLM batches them)."""
        events, self._events = self._events, []
        return [BlockRemoved(tuple(e)) if type(e) is list else e for e in events]

    # -- internals --------------------------------------------------------------

    def _hold(self, block_id: int) -> None:
        block = self._blocks[block_id]
        if block.ref_count == 0:  # only cache entries are ever taken back from the free blocks
            del self._free_cached[block_id]
        block.ref_count += 1

    def _take_free(self) -> int:
        # Uncached free blocks first, then the least recently used cached one.
        if self._free_uncached:
            block_id = self._free_uncached.pop()
        else:
            block_id, _ = self._free_cached.popitem(last=False)
        block = self._blocks[block_id]
        if block.hash is not None:  # evicting a cache entry
            del self._cached[block.hash]
            events = self._events
            if events and type(events[-1]) is list:  # a run of evictions being collected
                events[-1].append(block.hash)
            else:
                events.append([block.hash])
            block.hash = None
        block.ref_count = 1
        return block_id

    def _commit(self, seq: SequenceBlocks, first: int, last: int) -> None:
        """Blocks first..last-1 of the sequence just became full: hash them onto
        the sequence's chain and enter them in the cache. A block whose
        contents another block already caches (two sequences computed the
        same prefix at once) stays private; the chain goes on regardless."""
        parent = seq.chain[-1] if seq.chain else prefix_root(seq.cache_salt, seq.lora_name)
        tokens = seq.token_ids[first * self.block_size : last * self.block_size]
        stored: list[int] = []
        for i, h in enumerate(block_hashes(tokens, self.block_size, parent)):
            seq.chain.append(h)
            if h in self._cached:
                continue
            block = self._blocks[seq.blocks[first + i]]
            block.hash = h
            self._cached[h] = block.block_id
            stored.append(i)
        # One event per run of consecutive newly cached blocks, each naming its parent.
        run: list[int] = []
        for i in stored + [None]:
            if run and (i is None or i != run[-1] + 1):
                start_i = run[0]
                block_parent = seq.chain[first + start_i - 1] if first + start_i > 0 else None
                span = tokens[start_i * self.block_size : (run[-1] + 1) * self.block_size]
                self._events.append(
                    BlockStored(
                        tuple(seq.chain[first + j] for j in run),
                        block_parent,
                        tuple(span),
                        self.block_size,
                        seq.cache_salt if block_parent is None else None,
                        seq.lora_name,
                    )
                )
                run = []
            if i is not None:
                run.append(i)
