"""Round-robin over each pool's live replicas: the baseline policy."""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.kv.prompt_blocks import PromptBlocks
from orchestrator.messages import EngineRequest
from orchestrator.pools import ReplicaView
from orchestrator.routing.base import RouteDecision, RouteKind, RouteReason


class _Cursor:
    def __init__(self) -> None:
        self._next = 0

    def pick(self, replicas: Sequence[ReplicaView]) -> str | None:
        if not replicas:
            return None
        choice = replicas[self._next % len(replicas)].replica_id
        self._next += 1
        return choice


class RoundRobinScheduler:
    """Every request is disaggregated when the prefill pool has a live
    replica; replicas are taken in turn within each pool. A prefill pool with
    no live replica (all dead, or being replaced) means local prefill on the
    decode replica rather than a wait."""

    def __init__(self) -> None:
        self._prefill = _Cursor()
        self._decode = _Cursor()

    def route_request(
        self,
        request: EngineRequest,
        prefill_replicas: Sequence[ReplicaView] | None,
        decode_replicas: Sequence[ReplicaView],
        blocks: PromptBlocks | None = None,
    ) -> RouteDecision:
        decode = self._decode.pick(decode_replicas)
        if prefill_replicas is None:
            return RouteDecision(RouteKind.AGGREGATED, decode_replica=decode, reason=RouteReason.AGGREGATED)
        if not prefill_replicas:
            return RouteDecision(RouteKind.LOCAL_PREFILL, decode_replica=decode, reason=RouteReason.NO_PREFILL_REPLICA)
        return RouteDecision(
            RouteKind.REMOTE_PREFILL,
            decode_replica=decode,
            prefill_replica=self._prefill.pick(prefill_replicas),
            reason=RouteReason.DISAGGREGATED,
        )

    def on_prefill_done(self, request_id: str) -> None:
        pass

    def on_request_finished(self, request_id: str) -> None:
        pass
