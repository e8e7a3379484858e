"""The scheduler's own account of the work it has sent each replica.

Engines report their load about once a second; a burst of requests arrives
faster than that. So the scheduler also counts, per replica, the prompt
blocks it has asked it to prefill and not yet seen prefilled, and the blocks
held by requests it is decoding. Every request it routes is accounted here
until `finished`, so the counts drain to zero when traffic stops.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass
class _Entry:
    prefill_replica: str | None
    prefill_blocks: int
    decode_replica: str | None
    decode_blocks: int
    prefilled: bool = False


class InflightLoad:
    def __init__(self) -> None:
        self._requests: dict[str, _Entry] = {}
        self._prefill_blocks: defaultdict[str, int] = defaultdict(int)
        self._decode_blocks: defaultdict[str, int] = defaultdict(int)

    def routed(self, request_id: str, prefill_replica: str | None, prefill_blocks: int,
               decode_replica: str | None, decode_blocks: int) -> None:
        """`prefill_replica` computes `prefill_blocks` (it may be the decode
        replica itself); `decode_replica` then holds `decode_blocks`."""
        self.finished(request_id)
        entry = _Entry(prefill_replica, prefill_blocks, decode_replica, decode_blocks)
        self._requests[request_id] = entry
        if prefill_replica is not None:
            self._prefill_blocks[prefill_replica] += prefill_blocks
        if decode_replica is not None:
            self._decode_blocks[decode_replica] += decode_blocks

    def prefilled(self, request_id: str) -> None:
        entry = self._requests.get(request_id)
        if entry is None or entry.prefilled:
            return
        entry.prefilled = True
        if entry.prefill_replica is not None:
            self._drop(self._prefill_blocks, entry.prefill_replica, entry.prefill_blocks)

    def finished(self, request_id: str) -> None:
        self.prefilled(request_id)
        entry = self._requests.pop(request_id, None)
        if entry is not None and entry.decode_replica is not None:
            self._drop(self._decode_blocks, entry.decode_replica, entry.decode_blocks)

    @staticmethod
    def _drop(counts: defaultdict[str, int], replica: str, n: int) -> None:
        counts[replica] -= n
        if counts[replica] <= 0:
            del counts[replica]

    def prefill_blocks(self, replica: str) -> int:
        return self._prefill_blocks.get(replica, 0)

    def decode_blocks(self, replica: str) -> int:
        return self._decode_blocks.get(replica, 0)

    def in_flight(self) -> int:
        return len(self._requests)
