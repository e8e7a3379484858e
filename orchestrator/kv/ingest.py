"""Ordering of each replica's KV event stream into the index.

A publisher numbers its batches 0, 1, 2, ... from its start. Per replica:

    seq == last + 1         apply
    first batch, seq > 0    ask for a replay from 0 (blocks cached before we listened)
    seq >  last + 1         ask for a replay of the gap
    gap and no replay       forget the replica's blocks, apply, carry on
    seq <  last             the publisher restarted (empty cache): forget, apply
    seq == last             duplicate: ignore
    orphaned blocks         an event was lost without a gap (should not happen):
                            forget the replica's blocks

"Forget" is always safe: the index only ever under-states what a replica
holds, which costs locality, never correctness. Malformed batches are the
transport's to count and drop; they never reach here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from orchestrator.kv.events import KVEventBatch
from orchestrator.kv.index import KVIndex


class Action(enum.Enum):
    APPLIED = "applied"
    DUPLICATE = "duplicate"
    REPLAY = "replay"  # not applied: replay from `replay_from`, then pass this batch again
    RESYNCED = "resynced"  # replica's blocks forgotten, then the batch applied


class ResyncReason(str, enum.Enum):
    GAP = "gap"
    RESTART = "restart"
    ORPHANED = "orphaned"


@dataclass
class IngestOutcome:
    action: Action
    replay_from: int | None = None
    resync: ResyncReason | None = None
    stored: int = 0
    removed: int = 0


@dataclass
class _Stream:
    last_seq: int | None = None


@dataclass
class KVEventIngest:
    index: KVIndex
    _streams: dict[str, _Stream] = field(default_factory=dict)

    def forget(self, replica_id: str) -> None:
        """The replica left: its stream and its blocks go."""
        self._streams.pop(replica_id, None)
        self.index.remove_replica(replica_id)

    def last_seq(self, replica_id: str) -> int | None:
        stream = self._streams.get(replica_id)
        return stream.last_seq if stream else None

    def on_batch(self, replica_id: str, batch: KVEventBatch, can_replay: bool = True) -> IngestOutcome:
        stream = self._streams.setdefault(replica_id, _Stream())
        last = stream.last_seq
        expected = 0 if last is None else last + 1
        resync = None
        if last is not None and batch.seq == last:
            return IngestOutcome(Action.DUPLICATE)
        if last is not None and batch.seq < last:
            resync = ResyncReason.RESTART
        elif batch.seq > expected:
            if can_replay:
                return IngestOutcome(Action.REPLAY, replay_from=expected)
            resync = ResyncReason.GAP
        if resync is not None:
            self.index.clear_replica(replica_id)
        result = self.index.apply(replica_id, batch.events)
        stream.last_seq = batch.seq
        if result.orphaned:
            self.index.clear_replica(replica_id)
            resync = ResyncReason.ORPHANED
        return IngestOutcome(
            Action.RESYNCED if resync else Action.APPLIED,
            resync=resync,
            stored=result.stored,
            removed=result.removed,
        )
