"""The scheduler's own account of the work it has sent each replica.

Engines report their load about once a second; a burst of requests arrives
faster than that. So the scheduler also counts, per replica, the prompt
blocks it has asked it to prefill and not yet seen prefilled, and the KV
blocks its decoding requests hold there. Every request it routes is
accounted here until `finished`, so the counts drain to zero when traffic
stops.

Decode load counts *distinct* blocks, as the engine holds them: requests
sharing a prefix on one replica share its blocks (as Dynamo's active-sequence
tracking does), plus one block per request for the tokens it generates.
Because block hashes chain, the blocks of a prompt already held on a replica
are always a leading run of its hashes, found by bisection.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class _Entry:
    prefill_replica: str | None
    prefill_blocks: int
    decode_replica: str | None
    decode_hashes: Sequence[int]
    prefilled: bool = False


class InflightLoad:
    def __init__(self) -> None:
        self._requests: dict[str, _Entry] = {}
        self._prefill_blocks: defaultdict[str, int] = defaultdict(int)
        self._active: defaultdict[str, Counter[int]] = defaultdict(Counter)  # replica -> block hash -> requests
        self._decoding: defaultdict[str, int] = defaultdict(int)  # replica -> requests (one output block each)

    def routed(
        self,
        request_id: str,
        prefill_replica: str | None,
        prefill_blocks: int,
        decode_replica: str | None,
        decode_hashes: Sequence[int],
    ) -> None:
        """`prefill_replica` computes `prefill_blocks` (it may be the decode
        replica itself); `decode_replica` then holds the prompt's blocks."""
        self.finished(request_id)
        entry = _Entry(prefill_replica, prefill_blocks, decode_replica, decode_hashes)
        self._requests[request_id] = entry
        if prefill_replica is not None:
            self._prefill_blocks[prefill_replica] += prefill_blocks
        if decode_replica is not None:
            self._active[decode_replica].update(decode_hashes)
            self._decoding[decode_replica] += 1

    def prefilled(self, request_id: str) -> None:
        entry = self._requests.get(request_id)
        if entry is None or entry.prefilled:
            return
        entry.prefilled = True
        if entry.prefill_replica is not None:
            counts = self._prefill_blocks
            counts[entry.prefill_replica] -= entry.prefill_blocks
            if counts[entry.prefill_replica] <= 0:
                del counts[entry.prefill_replica]

    def finished(self, request_id: str) -> None:
        self.prefilled(request_id)
        entry = self._requests.pop(request_id, None)
        if entry is None or entry.decode_replica is None:
            return
        replica = entry.decode_replica
        active = self._active[replica]
        active.subtract(entry.decode_hashes)
        for h in entry.decode_hashes:
            if active[h] <= 0:
                del active[h]
        self._decoding[replica] -= 1
        if self._decoding[replica] <= 0:
            del self._decoding[replica], self._active[replica]

    def prefill_blocks(self, replica: str) -> int:
        return self._prefill_blocks.get(replica, 0)

    def decode_blocks(self, replica: str) -> int:
        """Distinct KV blocks the replica's decoding requests hold."""
        active = self._active.get(replica)
        return len(active) + self._decoding.get(replica, 0) if active is not None else 0

    def added_decode_blocks(self, replica: str, hashes: Sequence[int]) -> int:
        """Blocks a request with these prompt hashes would add to the replica's
        decode load: those not already held by its decoding requests, plus
        one for its output."""
        active = self._active.get(replica)
        if not active or not hashes or hashes[0] not in active:  # chained: no first block, none held
            return len(hashes) + 1
        lo, hi = 1, len(hashes)  # hashes[:lo] are held; hashes[hi:] are not
        while lo < hi:
            mid = (lo + hi) // 2
            if hashes[mid] in active:
                lo = mid + 1
            else:
                hi = mid
        return len(hashes) - lo + 1

    def requests(self, replica: str) -> int:
        """Requests this scheduler has routed to decode on the replica and not yet seen finish."""
        return self._decoding.get(replica, 0)

    def in_flight(self) -> int:
        return len(self._requests)
