"""The frontend's view of a pool: its live replicas and a way to call them.

`PoolClient` is the transport boundary. Under Ray Serve it is backed by
deployment handles (deployments/pool_client.py); in unit tests and in the
simulator it is backed by plain objects.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from orchestrator.engines.base import EngineInfo, EngineStats
from orchestrator.messages import EngineChunk, EngineRequest, PrefillResult


@dataclass(frozen=True)
class ReplicaView:
    """One live replica as the frontend last saw it."""

    replica_id: str
    info: EngineInfo | None = None
    stats: EngineStats | None = None


class DirectPathFallback(str, enum.Enum):
    """Why a call went through Serve's handles although the direct data plane is on."""

    NO_REPLICA_NAMED = "no_replica_named"  # routed before the pool reported its replicas
    REPLICA_NOT_LIVE = "replica_not_live"  # the named replica is not among the pool's live replicas
    NO_STREAM_PORT = "no_stream_port"  # the replica publishes no data-plane port
    REFUSED = "refused"  # the replica refused this frontend's proof (a frontend of another deploy)


class StreamParked(Exception):
    """A `generate` stream ended because its reader stopped taking chunks (its client stopped reading): the
    engine request was aborted after the chunks already yielded, so the replica holds nothing for it. The
    caller continues the request (its prompt plus the tokens yielded) once its reader reads again."""


class PoolClient(Protocol):
    name: str

    def replicas(self) -> list[ReplicaView]:
        """Live replicas, ordered by id. Empty until the pool has reported in."""
        ...

    async def prefill(self, request: EngineRequest, view: ReplicaView | None = None) -> PrefillResult:
        """Run a remote prefill on `request.target_replica` (any replica if None), whose view, as the
        caller routed on it, is `view` (None: not among the live replicas, or none named).
        Cancelling the call cancels it on the replica."""
        ...

    def generate(self, request: EngineRequest, view: ReplicaView | None = None) -> AsyncIterator[EngineChunk]:
        """Stream a request from `request.target_replica` (any replica if None), `view` as for
        `prefill`. Closing the iterator early aborts the request on the replica. May end with
        `StreamParked` after a stall of its reader, where the request is resumable mid-output."""
        ...
