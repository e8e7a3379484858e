"""Choosing replicas for a request: the scheduler interface and its policies."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.config import PRIMARY_GROUP, LoraConfig, RoutingConfig, RoutingPolicy, SloClassConfig
from orchestrator.kv.index import KVIndex
from orchestrator.kv.ingest import KVEventIngest
from orchestrator.routing.base import Scheduler
from orchestrator.routing.shape import ShapeRouter


def make_scheduler(
    config: RoutingConfig,
    block_size: int,
    index: KVIndex,
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
    lora: LoraConfig | None = None,
    classes: Sequence[SloClassConfig] = (),
) -> Scheduler:
    if config.policy is RoutingPolicy.ROUND_ROBIN:
        from orchestrator.routing.round_robin import RoundRobinScheduler

        return RoundRobinScheduler()
    from orchestrator.routing.adapter_slots import AdapterCosts
    from orchestrator.routing.kv_scheduler import KvAwareScheduler

    costs = None
    if lora is not None:
        cache = lora.max_cpu_loras or lora.max_loras
        costs = AdapterCosts(lora.max_loras, cache, config.lora_load_blocks, config.lora_slot_wait_blocks)
    budgets: dict[int, int | None] = {}  # per class priority, the tightest of its classes' (None: none has one)
    for c in classes:
        limits = [x.max_prefill_queue_tokens for x in classes if x.priority == c.priority]
        budgets[c.priority] = min((t for t in limits if t is not None), default=None)
    if all(b is None for b in budgets.values()):
        budgets = {}
    return KvAwareScheduler(
        config, block_size, index, clock=clock, rng=rng, adapter_costs=costs, queue_budgets=budgets or None
    )


@dataclass(frozen=True)
class RoutingParts:
    """One KV index for every group (replica ids are unique), fed through `ingest`; a scheduler per group."""

    index: KVIndex
    ingest: KVEventIngest
    schedulers: Mapping[str, Scheduler]
    shape_router: ShapeRouter | None


def build_routing(
    config: RoutingConfig,
    block_size: int,
    groups: Sequence[str] = (PRIMARY_GROUP,),
    clock: Callable[[], float] = time.monotonic,
    rng: random.Random | None = None,
    lora: LoraConfig | None = None,
    classes: Sequence[SloClassConfig] = (),
) -> RoutingParts:
    """`lora`: the model's adapters (model.lora), whose slots the KV-aware schedulers weigh; None: none.
    `classes`: the SLO classes (traffic.classes), whose prefill queue budgets the KV-aware schedulers keep."""
    index = KVIndex()
    schedulers = {group: make_scheduler(config, block_size, index, clock, rng, lora, classes) for group in groups}
    shape_router = None
    if config.shape is not None:
        shape_router = ShapeRouter(config.shape, block_size, index, list(groups))
    return RoutingParts(index, KVEventIngest(index), schedulers, shape_router)
