"""Routing among pool groups by request shape.

An application may serve one model from several pool groups (the primary
pools plus `pool_groups`, e.g. a vLLM P/D pair and an SGLang P/D pair). Per
request, before any group's scheduler picks replicas, `ShapeRouter` measures
the request and names the group:

    blocks   = full blocks of the prompt (kv_cache.block_size)
    reused   = longest leading run of those blocks that any replica holds,
               in the KV index over the replicas of *every* group
    reuse    = reused / blocks                      (0 for a prompt under one block)
    shape    = short_prompt  if prompt tokens < min_prompt_tokens
               long_output   if max_tokens > max_output_tokens (when set)
               prefix_heavy  if reuse >= min_prefix_reuse
               unique        otherwise
    group    = prefix_group for prefix_heavy, unique_group for the rest
               (policy round_robin: the groups in turn, shape still measured)

Reuse is measured across all groups on purpose: it describes the request (its
prefix is popular), not where the prefix lives now. Measured per group, the
prefix group would never see a prefix it has not been sent yet, and the
first requests of a shared prefix would keep it away from there. So the
first request of a new prefix is `unique` (nothing holds it yet) and goes to
the unique group; once the index knows the prefix (engine events, or the
route memory of the scheduler that routed it, within `event_lag_ttl_s`),
its later requests are prefix-heavy and go to the prefix group, whose own
scheduler then places them by locality among its replicas.

Events in, decisions out: the router reads the index and the request; it
never calls a pool. No clock; round robin is a counter.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.config import PRIMARY_GROUP, ShapePolicy, ShapeRoutingConfig
from orchestrator.kv.index import KVIndex
from orchestrator.kv.prompt_blocks import PromptBlocks
from orchestrator.messages import EngineRequest
from orchestrator.routing.load import InflightLoad


class ShapeClass(str, enum.Enum):
    PREFIX_HEAVY = "prefix_heavy"
    UNIQUE = "unique"
    SHORT_PROMPT = "short_prompt"
    LONG_OUTPUT = "long_output"


@dataclass(frozen=True)
class ShapeDecision:
    group: str
    shape: ShapeClass
    prompt_tokens: int
    prompt_blocks: int
    reused_blocks: int  # longest cached prefix anywhere, in blocks
    max_tokens: int
    blocks: PromptBlocks  # handed on to the group's scheduler, which would compute the same

    @property
    def reuse(self) -> float:
        """Fraction of the prompt's full blocks that are a cached prefix."""
        return self.reused_blocks / self.prompt_blocks if self.prompt_blocks else 0.0


class ShapeRouter:
    def __init__(
        self, config: ShapeRoutingConfig, block_size: int, index: KVIndex, groups: Sequence[str] = (PRIMARY_GROUP,)
    ) -> None:
        missing = {config.prefix_group, config.unique_group} - set(groups)
        if missing:
            raise ValueError(f"shape routing names groups {sorted(missing)} not among {list(groups)}")
        self.config = config
        self.block_size = block_size
        self.index = index
        self.groups = tuple(groups)
        self._turn = itertools.cycle(self.groups)

    def route(self, request: EngineRequest) -> ShapeDecision:
        """The request's shape and the group its policy names (no state changed
        except the round-robin turn)."""
        blocks = PromptBlocks.of(request, self.block_size, self.index)
        hashes = blocks.hashes
        reused = max(blocks.overlaps.values(), default=0)
        max_tokens = request.sampling.max_tokens
        c = self.config
        n = len(request.prompt_token_ids)
        if n < c.min_prompt_tokens:
            shape = ShapeClass.SHORT_PROMPT
        elif c.max_output_tokens is not None and max_tokens > c.max_output_tokens:
            shape = ShapeClass.LONG_OUTPUT
        elif hashes and reused / len(hashes) >= c.min_prefix_reuse:
            shape = ShapeClass.PREFIX_HEAVY
        else:
            shape = ShapeClass.UNIQUE
        if c.policy is ShapePolicy.ROUND_ROBIN:
            group = next(self._turn)
        else:
            group = c.prefix_group if shape is ShapeClass.PREFIX_HEAVY else c.unique_group
        return ShapeDecision(
            group=group,
            shape=shape,
            prompt_tokens=n,
            prompt_blocks=len(hashes),
            reused_blocks=reused,
            max_tokens=max_tokens,
            blocks=blocks,
        )


class CombinedLoad:
    """The in-flight load of several schedulers (one per group) read as one:
    replica ids are unique across groups, so each replica's load is the sum,
    which is its own scheduler's. For the scrape-time scheduler metrics."""

    def __init__(self, loads: Sequence[InflightLoad]) -> None:
        self._loads = list(loads)

    def prefill_blocks(self, replica_id: str) -> float:
        return sum(load.prefill_blocks(replica_id) for load in self._loads)

    def decode_blocks(self, replica_id: str) -> float:
        return sum(load.decode_blocks(replica_id) for load in self._loads)
