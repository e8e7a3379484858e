"""Blocks the scheduler believes a replica holds because it sent them there.

Approximate mode (no KV events): the only source of the index, kept for a
TTL comparable to how long an engine keeps unused blocks. Event mode: a
short bridge over the delay before the engine's events arrive, so a burst
of requests sharing a prefix lands together. Each remembered route holds one
reference on its blocks in the index until it expires.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from orchestrator.kv.index import KVIndex


class RouteMemory:
    def __init__(self, index: KVIndex, ttl_s: float, clock: Callable[[], float]) -> None:
        self._index = index
        self._ttl_s = ttl_s
        self._clock = clock
        self._entries: deque[tuple[float, str, tuple[int, ...]]] = deque()

    def remember(self, replica_id: str, hashes: Sequence[int]) -> None:
        if self._ttl_s <= 0 or not hashes:
            return
        self.expire()
        hashes = tuple(hashes)
        self._index.store_hashes(replica_id, hashes)
        self._entries.append((self._clock() + self._ttl_s, replica_id, hashes))

    def expire(self) -> None:
        now = self._clock()
        while self._entries and self._entries[0][0] <= now:
            _, replica_id, hashes = self._entries.popleft()
            self._index.remove_hashes(replica_id, hashes)

    def __len__(self) -> int:
        return len(self._entries)
