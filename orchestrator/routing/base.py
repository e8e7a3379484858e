"""The scheduler boundary: a request and the pools' replicas in, a route out."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from orchestrator.kv.prompt_blocks import PromptBlocks
from orchestrator.messages import EngineRequest
from orchestrator.pools import ReplicaView


class RouteKind(str, enum.Enum):
    REMOTE_PREFILL = "remote_prefill"  # prefill pool computes the prompt, KV moves to decode
    LOCAL_PREFILL = "local_prefill"  # the decode replica computes the prompt itself
    AGGREGATED = "aggregated"  # no prefill pool configured


class RouteReason(str, enum.Enum):
    """Why a disaggregated application prefilled where it did."""

    DISAGGREGATED = "disaggregated"  # long enough uncached prompt, prefill pool available
    SHORT_UNCACHED = "short_uncached"  # few uncached tokens on the decode replica: cheaper locally
    NO_PREFILL_REPLICA = "no_prefill_replica"  # prefill pool empty (scaling, dead, starting)
    PREFILL_SATURATED = "prefill_saturated"  # prefill pool's queue beyond its limit
    AGGREGATED = "aggregated"
    # Another sample (`n` > 1) of a prompt whose KV the decode replica already holds.
    SIBLING_SAMPLE = "sibling_sample"
    # The request asks for its prompt's log-probabilities, which only the engine that computes the prompt returns.
    PROMPT_LOGPROBS = "prompt_logprobs"


@dataclass(frozen=True)
class RouteDecision:
    kind: RouteKind
    # Serve replica ids; None lets Serve pick any live replica of that pool
    # (used when the pool has not reported its replicas yet).
    decode_replica: str | None
    prefill_replica: str | None = None
    reason: RouteReason | None = None
    # Prompt tokens the scheduler expects the prefilling replica (prefill
    # replica if remote, else decode replica) to find in its prefix cache.
    predicted_cached_tokens: int = 0
    # The balance guard (routing.balance_abs_threshold) left only the idlest decode replicas as candidates.
    balanced: bool = False

    @property
    def remote_prefill(self) -> bool:
        return self.kind is RouteKind.REMOTE_PREFILL


class Scheduler(Protocol):
    def route_request(
        self,
        request: EngineRequest,
        prefill_replicas: Sequence[ReplicaView] | None,
        decode_replicas: Sequence[ReplicaView],
        blocks: PromptBlocks | None = None,
    ) -> RouteDecision:
        """Choose where `request` runs. `prefill_replicas` is None when the
        application has no prefill pool (aggregated serving). `blocks`: the
        prompt's blocks as the shape router already computed them, if it did."""
        ...

    def on_prefill_done(self, request_id: str) -> None:
        """The request's prompt is computed (remote prefill returned, or the
        decode replica produced its first token)."""
        ...

    def on_request_finished(self, request_id: str) -> None:
        """Release whatever the scheduler tracked for the request."""
        ...
