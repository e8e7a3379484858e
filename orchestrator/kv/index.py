"""The KV index: which replica holds which block.

Invariants:
  * `_owners[h]` has bit `slot(r)` set  <=>  replica r holds block h
    (its refcount `_held[r][h]` > 0);
  * in event mode, `_engine_map[r]` maps each engine hash r reported as
    stored (and not yet removed) to our routing hash, which is also what a
    later block continuing from it chains onto;
  * a replica that leaves (scaled down, dead, restarted) takes all its
    blocks with it.
Lookups answer "how many leading blocks of this prompt does each replica
hold" by walking the prompt's hash chain with one bitmask of the replicas
still matching, so cost grows with prompt length, not with replica count.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from orchestrator.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, EngineBlockHash, KVEvent
from orchestrator.kv.hashing import block_hashes, prefix_root


@dataclass
class ApplyResult:
    stored: int = 0
    removed: int = 0
    # Blocks whose parent the index never saw: a missed event. The caller
    # should resync the replica.
    orphaned: int = 0
    cleared: bool = False


class KVIndex:
    def __init__(self) -> None:
        self._slots: dict[str, int] = {}
        self._replica_at: dict[int, str] = {}
        self._free_slots: list[int] = []
        self._owners: dict[int, int] = {}
        self._held: dict[str, Counter[int]] = {}
        self._engine_map: dict[str, dict[EngineBlockHash, int]] = {}

    # -- replicas -------------------------------------------------------------

    @property
    def replicas(self) -> list[str]:
        return sorted(self._slots)

    def add_replica(self, replica_id: str) -> None:
        if replica_id in self._slots:
            return
        slot = self._free_slots.pop() if self._free_slots else len(self._slots)
        self._slots[replica_id] = slot
        self._replica_at[slot] = replica_id
        self._held[replica_id] = Counter()
        self._engine_map[replica_id] = {}

    def remove_replica(self, replica_id: str) -> None:
        if replica_id not in self._slots:
            return
        self.clear_replica(replica_id)
        slot = self._slots.pop(replica_id)
        del self._replica_at[slot], self._held[replica_id], self._engine_map[replica_id]
        self._free_slots.append(slot)

    def clear_replica(self, replica_id: str) -> None:
        """Forget every block of the replica (it restarted, cleared its cache,
        or its event stream broke)."""
        held = self._held.get(replica_id)
        if held is None:
            return
        keep = ~(1 << self._slots[replica_id])
        for h in held:
            owners = self._owners[h] & keep
            if owners:
                self._owners[h] = owners
            else:
                del self._owners[h]
        held.clear()
        self._engine_map[replica_id].clear()

    def sync_replicas(self, live: Iterable[str]) -> None:
        """Make the index's replicas exactly `live`."""
        live = set(live)
        for gone in set(self._slots) - live:
            self.remove_replica(gone)
        for new in live - set(self._slots):
            self.add_replica(new)

    # -- blocks by routing hash (approximate mode, tests) ----------------------

    def store_hashes(self, replica_id: str, hashes: Iterable[int]) -> None:
        self.add_replica(replica_id)
        bit = 1 << self._slots[replica_id]
        held = self._held[replica_id]
        owners = self._owners
        for h in hashes:
            if held[h] == 0:
                owners[h] = owners.get(h, 0) | bit
            held[h] += 1

    def remove_hashes(self, replica_id: str, hashes: Iterable[int]) -> int:
        held = self._held.get(replica_id)
        if held is None:
            return 0
        keep = ~(1 << self._slots[replica_id])
        removed = 0
        for h in hashes:
            count = held.get(h, 0)
            if count == 0:
                continue
            if count > 1:
                held[h] = count - 1
                continue
            del held[h]
            removed += 1
            owners = self._owners[h] & keep
            if owners:
                self._owners[h] = owners
            else:
                del self._owners[h]
        return removed

    # -- engine events ----------------------------------------------------------

    def apply(self, replica_id: str, events: Iterable[KVEvent]) -> ApplyResult:
        # The hot path of event ingestion: store and remove are inlined here.
        if replica_id not in self._slots:
            self.add_replica(replica_id)
        result = ApplyResult()
        engine_map = self._engine_map[replica_id]
        held = self._held[replica_id]
        owners = self._owners
        bit = 1 << self._slots[replica_id]
        for event in events:
            kind = type(event)
            if kind is BlockStored:
                parent_engine = event.parent_engine_hash
                parent = (
                    prefix_root(event.cache_salt, event.lora_name)
                    if parent_engine is None
                    else engine_map.get(parent_engine)
                )
                if parent is None:
                    result.orphaned += len(event.engine_hashes)
                    continue
                for engine_hash, h in zip(event.engine_hashes, block_hashes(event.token_ids, event.block_size, parent)):
                    if engine_hash in engine_map:
                        continue
                    engine_map[engine_hash] = h
                    count = held.get(h, 0)
                    if count == 0:
                        owners[h] = owners.get(h, 0) | bit
                    held[h] = count + 1
                    result.stored += 1
            elif kind is BlockRemoved:
                gone = [engine_map.pop(e) for e in event.engine_hashes if e in engine_map]
                result.removed += self.remove_hashes(replica_id, gone)
            elif kind is AllBlocksCleared:
                self.clear_replica(replica_id)
                result.cleared = True
        return result

    # -- lookups ------------------------------------------------------------------

    def overlaps(self, hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks of the prompt (given by its chained hashes) that each
        replica holds; replicas holding none are absent."""
        result: dict[str, int] = {}
        owners = self._owners
        alive = -1  # all replicas, as an infinite bitmask
        depth = 0
        for depth, h in enumerate(hashes):
            still = alive & owners.get(h, 0)
            lost = (alive & ~still) if depth else 0
            if lost:
                self._record(result, lost, depth)
            alive = still
            if not alive:
                return result
        if alive and hashes:
            self._record(result, alive, len(hashes))
        return result

    def _record(self, result: dict[str, int], bits: int, depth: int) -> None:
        while bits:
            low = bits & -bits
            result[self._replica_at[low.bit_length() - 1]] = depth
            bits ^= low

    def holds(self, replica_id: str, block_hash: int) -> bool:
        slot = self._slots.get(replica_id)
        return slot is not None and bool(self._owners.get(block_hash, 0) >> slot & 1)

    def num_blocks(self) -> int:
        """Distinct blocks held anywhere."""
        return len(self._owners)

    def replica_blocks(self, replica_id: str) -> int:
        held = self._held.get(replica_id)
        return len(held) if held is not None else 0
