"""KV-locality scheduler: route by where the prompt's blocks live and by load,
and decide per request whether to disaggregate.

    hashes   = block hashes of the prompt
    overlaps = index.overlaps(hashes)                  # leading blocks per replica
    budget   = the prompt's class's max_prefill_queue_tokens (by its engine priority; none: no budget)
    within   = replicas whose queued prefill tokens <= budget, where any is (else all)   # per pool
    if the decode replicas' request counts are imbalanced (SGLang's guard):
        candidates = the least busy decode replicas
    decode   = cheapest candidate                      # overlap credit vs load, + adapter cost (adapter_slots.py)
    if no prefill pool               -> aggregated on `decode`
    elif uncached on decode <= T     -> local prefill on `decode`   (conditional disaggregation)
    elif no prefill replica          -> local prefill
    elif prefill pool saturated      -> local prefill
    else prefill = cheapest prefill replica -> remote prefill, KV to `decode`
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from orchestrator.config import RoutingConfig
from orchestrator.kv.index import KVIndex
from orchestrator.kv.prompt_blocks import PromptBlocks
from orchestrator.messages import EngineRequest
from orchestrator.pools import ReplicaView
from orchestrator.routing.adapter_slots import AdapterCosts, AdapterSlots
from orchestrator.routing.base import RouteDecision, RouteKind, RouteReason
from orchestrator.routing.cost import pick, replica_cost
from orchestrator.routing.load import InflightLoad
from orchestrator.routing.route_memory import RouteMemory


class KvAwareScheduler:
    def __init__(
        self,
        config: RoutingConfig,
        block_size: int,
        index: KVIndex | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        adapter_costs: AdapterCosts | None = None,
        queue_budgets: Mapping[int, int | None] | None = None,
    ) -> None:
        """`adapter_costs`: the engines' LoRA slots and what a missing adapter costs; None: no adapters.
        `queue_budgets`: each SLO class's engine priority -> the prompt tokens a replica may have queued for
        prefill and still take a prompt of it (max_prefill_queue_tokens; None: any replica); a request at a
        priority no class has takes the budget of the nearest class that runs before it (its own)."""
        self.config = config
        self.block_size = block_size
        self.index = index if index is not None else KVIndex()
        self.load = InflightLoad()
        ttl = config.event_lag_ttl_s if config.kv_events else config.approximate_ttl_s
        self.memory = RouteMemory(self.index, ttl, clock)
        self.rng = rng or random.Random()
        self.adapters = AdapterSlots(adapter_costs) if adapter_costs is not None else None
        self.queue_budgets = sorted((queue_budgets or {}).items())

    # -- the decision -----------------------------------------------------------

    def route_request(
        self,
        request: EngineRequest,
        prefill_replicas: Sequence[ReplicaView] | None,
        decode_replicas: Sequence[ReplicaView],
        blocks: PromptBlocks | None = None,
    ) -> RouteDecision:
        self.memory.expire()
        if blocks is None or blocks.block_size != self.block_size:
            blocks = PromptBlocks.of(request, self.block_size, self.index)
        hashes, overlaps = blocks.hashes, blocks.overlaps
        budget = self._queue_budget(request.priority)
        if budget is not None:
            decode_replicas = self._within(decode_replicas, budget)
            prefill_replicas = self._within(prefill_replicas, budget) if prefill_replicas is not None else None
        candidates = self._balanced(decode_replicas)
        adapter = request.lora.name if request.lora is not None and self.adapters is not None else None
        decode = self._cheapest(candidates, hashes, overlaps, adapter)
        decision = self._decide(request, hashes, overlaps, decode, prefill_replicas, adapter)
        if candidates is not decode_replicas:
            decision = replace(decision, balanced=True)
        self._account(request, hashes, decision)
        return decision

    def _decide(
        self,
        request: EngineRequest,
        hashes: list[int],
        overlaps: dict[str, int],
        decode: str | None,
        prefill_replicas: Sequence[ReplicaView] | None,
        adapter: str | None,
    ) -> RouteDecision:
        decode_cached = self._cached_tokens(request, overlaps.get(decode, 0)) if decode else 0
        local = dict(decode_replica=decode, predicted_cached_tokens=decode_cached)
        if prefill_replicas is None:
            return RouteDecision(RouteKind.AGGREGATED, reason=RouteReason.AGGREGATED, **local)
        uncached_on_decode = len(request.prompt_token_ids) - decode_cached
        if uncached_on_decode <= self.config.local_prefill_max_tokens:
            return RouteDecision(RouteKind.LOCAL_PREFILL, reason=RouteReason.SHORT_UNCACHED, **local)
        if not prefill_replicas:
            return RouteDecision(RouteKind.LOCAL_PREFILL, reason=RouteReason.NO_PREFILL_REPLICA, **local)
        if self._prefill_saturated(prefill_replicas):
            return RouteDecision(RouteKind.LOCAL_PREFILL, reason=RouteReason.PREFILL_SATURATED, **local)
        prefill = self._cheapest(prefill_replicas, hashes, overlaps, adapter, with_decode_load=False)
        return RouteDecision(
            RouteKind.REMOTE_PREFILL,
            decode_replica=decode,
            prefill_replica=prefill,
            reason=RouteReason.DISAGGREGATED,
            predicted_cached_tokens=self._cached_tokens(request, overlaps.get(prefill, 0)),
        )

    def _cached_tokens(self, request: EngineRequest, overlap_blocks: int) -> int:
        # The engine always computes at least the last prompt token.
        return min(overlap_blocks * self.block_size, len(request.prompt_token_ids) - 1)

    def _prefill_saturated(self, prefill_replicas: Sequence[ReplicaView]) -> bool:
        limit = self.config.max_prefill_queue_tokens
        if limit is None:
            return False
        least = min(self.load.prefill_blocks(v.replica_id) for v in prefill_replicas)
        return least * self.block_size > limit

    # -- costs -------------------------------------------------------------------

    def requests(self, view: ReplicaView) -> int:
        """Requests on the replica: what its engine last reported running and waiting, or what this
        frontend has sent it and not seen finish, whichever is larger."""
        own = self.load.requests(view.replica_id)
        return max(own, view.stats.num_running + view.stats.num_waiting) if view.stats is not None else own

    def _queue_budget(self, priority: int) -> int | None:
        """The prompt tokens a replica may have queued for prefill and take a prompt of `priority` (None: any)."""
        budget = None
        for p, tokens in self.queue_budgets:  # ascending: the last at or before `priority` is its own or nearest
            if p <= priority:
                budget = tokens
        return budget

    def _within(self, views: Sequence[ReplicaView], budget: int) -> Sequence[ReplicaView]:
        """The replicas whose prompt tokens queued for prefill are within `budget`; all of them where none is."""
        within = [v for v in views if self.load.prefill_blocks(v.replica_id) * self.block_size <= budget]
        return within if within and len(within) < len(views) else views

    def _balanced(self, views: Sequence[ReplicaView]) -> Sequence[ReplicaView]:
        """SGLang's cache-aware guard: when the busiest replica has more than `balance_abs_threshold`
        requests more than the idlest and more than `balance_rel_threshold` times as many, only the
        idlest are candidates (a new list); else all are (`views` itself)."""
        limit = self.config.balance_abs_threshold
        if limit is None or len(views) < 2:
            return views
        counts = [self.requests(v) for v in views]
        lo, hi = min(counts), max(counts)
        if hi - lo > limit and hi > self.config.balance_rel_threshold * lo:
            return [v for v, n in zip(views, counts) if n == lo]
        return views

    def decode_load(self, view: ReplicaView) -> float:
        """Blocks of decode work on the replica: what this frontend sent it, or
        what its engine last reported in use, whichever is larger."""
        own = self.load.decode_blocks(view.replica_id)
        if view.stats is not None and view.info is not None and view.info.kv_capacity_blocks:
            return max(own, view.stats.kv_cache_usage * view.info.kv_capacity_blocks)
        return own

    def _cheapest(
        self,
        views: Sequence[ReplicaView],
        hashes: list[int],
        overlaps: dict[str, int],
        adapter: str | None,
        with_decode_load: bool = True,
    ) -> str | None:
        """Decode load is the replica's with this request added: a replica
        already decoding this prompt's prefix adds only the rest."""
        if not views:
            return None
        weight, n = self.config.prefill_weight, len(hashes)
        queued, decode_load, added = self.load.prefill_blocks, self.decode_load, self.load.added_decode_blocks
        # The adapter's cost on each replica: `other` on those not in `named` (adapter_slots.py).
        other, named = self.adapters.costs_of(adapter) if adapter is not None else (0.0, {})
        costs = []
        for v in views:
            rid = v.replica_id
            decode = decode_load(v) + added(rid, hashes) if with_decode_load else 0.0
            cost = replica_cost(n, overlaps.get(rid, 0), queued(rid), decode, weight)
            costs.append((rid, cost + named.get(rid, other) if adapter is not None else cost))
        return pick(costs, self.config.temperature, self.rng)

    # -- bookkeeping -----------------------------------------------------------------

    def _account(self, request: EngineRequest, hashes: list[int], decision: RouteDecision) -> None:
        blocks = len(hashes)
        prefiller = decision.prefill_replica if decision.remote_prefill else decision.decode_replica
        uncached_blocks = max(blocks - decision.predicted_cached_tokens // self.block_size, 0)
        self.load.routed(request.request_id, prefiller, uncached_blocks, decision.decode_replica, hashes)
        for replica in {decision.decode_replica, prefiller} - {None}:
            self.memory.remember(replica, hashes)
        if self.adapters is not None and request.lora is not None:
            name, rid = request.lora.name, request.request_id
            self.adapters.routed((rid, DECODE), name, decision.decode_replica)
            if decision.remote_prefill:
                self.adapters.routed((rid, PREFILL), name, decision.prefill_replica)

    def on_prefill_done(self, request_id: str) -> None:
        self.load.prefilled(request_id)
        if self.adapters is not None:
            self.adapters.finished((request_id, PREFILL))

    def on_request_finished(self, request_id: str) -> None:
        self.load.finished(request_id)
        if self.adapters is not None:
            self.adapters.finished((request_id, PREFILL))
            self.adapters.finished((request_id, DECODE))


# The stages of a request an adapter runs in, as AdapterSlots keys them.
PREFILL, DECODE = "prefill", "decode"
