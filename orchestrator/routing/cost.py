"""Cost of sending a request to a replica (lower is better), and picking by it.

Dynamo's published router cost, per replica:

    cost = prefill_weight * (uncached prompt blocks + queued prefill blocks) + decode blocks

Overlap is credited by shrinking the uncached part; load is counted in KV
blocks so both terms share a unit. The decode term takes the larger of the
scheduler's own in-flight count and the engine's last reported KV usage, so
traffic from other frontends (which this one does not see) still counts.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence


def replica_cost(
    prompt_blocks: int, overlap_blocks: int, queued_prefill_blocks: int, decode_blocks: float, prefill_weight: float
) -> float:
    uncached = prompt_blocks - overlap_blocks if prompt_blocks > overlap_blocks else 0
    return prefill_weight * (uncached + queued_prefill_blocks) + decode_blocks


def pick(costs: Sequence[tuple[str, float]], temperature: float, rng: random.Random) -> str:
    """The cheapest replica (ties broken at random), or with temperature > 0 a
    softmax draw over costs normalised to [0, 1], which spreads load when
    costs are close."""
    if temperature <= 0:
        best = min(c for _, c in costs)
        return rng.choice([r for r, c in costs if c == best])
    lo = min(c for _, c in costs)
    span = (max(c for _, c in costs) - lo) or 1.0
    weights = [math.exp(-((c - lo) / span) / temperature) for _, c in costs]
    return rng.choices([r for r, _ in costs], weights=weights)[0]
