"""Choosing replicas for a request: the scheduler interface and its policies."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from orchestrator.config import RoutingConfig, RoutingPolicy
from orchestrator.kv.index import KVIndex
from orchestrator.routing.base import Scheduler


def make_scheduler(config: RoutingConfig, block_size: int, index: KVIndex,
                   clock: Callable[[], float] = time.monotonic, rng: random.Random | None = None) -> Scheduler:
    if config.policy is RoutingPolicy.ROUND_ROBIN:
        from orchestrator.routing.round_robin import RoundRobinScheduler

        return RoundRobinScheduler()
    from orchestrator.routing.kv_scheduler import KvAwareScheduler

    return KvAwareScheduler(config, block_size, index, clock=clock, rng=rng)
