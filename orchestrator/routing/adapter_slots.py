"""Which LoRA adapters each replica holds, as this scheduler has placed them, and what running a request's
adapter there costs.

An engine runs at most `max_loras` distinct adapters in one batch (vLLM's scheduler skips a waiting request
whose adapter would be one more); an adapter not in its host cache (`max_cpu_loras`, least recently used
evicted) is read from its source first. So, per replica r and adapter a, in the cost function's unit
(blocks of prefill work):

    adapter_cost(r, a) = 0                          a is None, or a runs on r (a slot holds it)
                       = 0                          a slot is free and r's cache holds a
                       = load_blocks                a slot is free, a must be read from its source
                       + slot_wait_blocks           every slot holds another adapter that is running

"Runs" is what this scheduler has in flight there (routed and not finished); the cache is the last
`max_cpu_loras` adapters it sent there, as the engine's LRU keeps them. A hot adapter spreads on its own:
its requests load its replica until another replica, paying `load_blocks`, is cheaper. A cold one goes
where it is cached, so adapters are not read over and over (no thrash).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class AdapterCosts:
    max_loras: int
    max_cpu_loras: int
    load_blocks: float
    slot_wait_blocks: float


class AdapterSlots:
    def __init__(self, costs: AdapterCosts) -> None:
        self.costs = costs
        self._running: defaultdict[str, Counter[str]] = defaultdict(Counter)  # replica -> adapter -> requests
        self._cached: defaultdict[str, OrderedDict[str, None]] = defaultdict(OrderedDict)  # replica -> LRU
        self._placed: dict[tuple[str, str], tuple[str, str]] = {}  # (request, stage) -> (adapter, replica)
        self._full: set[str] = set()  # replicas running max_loras adapters or more
        self._holders: defaultdict[str, set[str]] = defaultdict(set)  # adapter -> replicas running or caching it

    def cost(self, replica: str, adapter: str) -> float:
        running = self._running.get(replica)
        if running and adapter in running:
            return 0.0
        c = self.costs
        cached = self._cached.get(replica)
        cost = 0.0 if cached and adapter in cached else c.load_blocks
        if replica in self._full:
            cost += c.slot_wait_blocks
        return cost

    def costs_of(self, adapter: str) -> tuple[float, dict[str, float]]:
        """`cost(r, adapter)` for every replica at once: (the cost on a replica not named, {replica: its cost}
        for those that run or cache the adapter or whose slots are full); linear in those, not in the pool."""
        holders = self._holders.get(adapter, ())
        return self.costs.load_blocks, {r: self.cost(r, adapter) for r in (*self._full, *holders)}

    def routed(self, key: tuple[str, str], adapter: str | None, replica: str | None) -> None:
        """The work `key` (a request's prefill or decode) runs `adapter` on `replica` until `finished(key)`."""
        self.finished(key)
        if adapter is None or replica is None:
            return
        self._placed[key] = (adapter, replica)
        running = self._running[replica]
        running[adapter] += 1
        if len(running) >= self.costs.max_loras:
            self._full.add(replica)
        self._holders[adapter].add(replica)
        cached = self._cached[replica]
        cached[adapter] = None
        cached.move_to_end(adapter)
        if len(cached) > self.costs.max_cpu_loras:
            evicted, _ = cached.popitem(last=False)
            self._unless_held(evicted, replica)

    def finished(self, key: tuple[str, str]) -> None:
        placed = self._placed.pop(key, None)
        if placed is None:
            return
        adapter, replica = placed
        running = self._running[replica]
        running[adapter] -= 1
        if running[adapter] <= 0:
            del running[adapter]
            if len(running) < self.costs.max_loras:
                self._full.discard(replica)
            self._unless_held(adapter, replica)
        if not running:
            del self._running[replica]

    def _unless_held(self, adapter: str, replica: str) -> None:
        """`replica` leaves the adapter's holders unless it still runs or caches it."""
        if adapter in self._running.get(replica, ()) or adapter in self._cached.get(replica, ()):
            return
        holders = self._holders[adapter]
        holders.discard(replica)
        if not holders:
            del self._holders[adapter]

    def running(self, replica: str) -> set[str]:
        return set(self._running.get(replica, ()))
