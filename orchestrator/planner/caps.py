"""When the plan wants more than it may have: which pool, what its load needs, what it got, and what stopped it.

    max_replicas   the pool's own bound (planner.prefill / planner.decode .max_replicas)
    max_gpus       the GPU budget the pools share (planner.max_gpus)
    unreachable    no count holds the SLO: one prompt alone takes longer than the TTFT budget, or one
                   sequence's decode step longer than the ITL target, at the predicted lengths

The load over what the granted replicas hold within the SLO (needed / granted) says by how much the SLO
cannot be held: 1.25 is a pool a quarter short.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class CapShortfall:
    pool: str
    needed: float  # replicas the load needs (inf: no count does it)
    granted: int
    limit: str  # max_replicas | max_gpus | unreachable

    @property
    def load_over_capacity(self) -> float:
        return self.needed / self.granted if self.granted else math.inf

    def describe(self) -> str:
        if self.limit == "unreachable":
            return f"{self.pool}: no replica count holds the SLO at the predicted load ({self.granted} granted)"
        return (
            f"{self.pool}: needs {self.needed:.1f} replicas, {self.limit} grants {self.granted}: "
            f"its load is x{self.load_over_capacity:.2f} what they hold within the SLO"
        )


def shortfalls(
    needed: Mapping[str, float], bounded: Mapping[str, int], granted: Mapping[str, int]
) -> tuple[CapShortfall, ...]:
    """Per pool: `needed` the replicas the load needs, `bounded` the count after the pool's own bounds and
    stabilisation, `granted` after the GPU budget too."""
    out = []
    for pool, need in needed.items():
        if math.isinf(need):
            out.append(CapShortfall(pool, need, granted[pool], "unreachable"))
        elif math.ceil(need - 1e-9) > granted[pool]:
            limit = "max_gpus" if granted[pool] < bounded[pool] else "max_replicas"
            out.append(CapShortfall(pool, need, granted[pool], limit))
    return tuple(out)
