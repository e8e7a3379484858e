"""A Serve request router that sends each call to the replica the scheduler chose.

The scheduler lives in the frontend (orchestrator/routing). It names a
replica in `EngineRequest.target_replica`; this router delivers the call
there. It also shows the frontend each pool's live replicas, with the static
metadata and the periodic load report every replica publishes
(`record_replica_metadata` / `record_routing_stats`).

Serve builds routers inside the deployment handle; the frontend finds them
in `deployments.registries`.
"""

from __future__ import annotations

import random
from typing import Any

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

from orchestrator.engines.base import EngineInfo, EngineStats
from orchestrator.pools import ReplicaView


def _target_replica(pending: PendingRequest | None) -> str | None:
    if pending is None or not pending.args:
        return None
    return getattr(pending.args[0], "target_replica", None)


def _view(replica: RunningReplica) -> ReplicaView:
    meta: dict[str, Any] = replica.replica_metadata or {}
    stats: dict[str, Any] = replica.routing_stats or {}
    return ReplicaView(
        replica_id=replica.replica_id.unique_id,
        info=EngineInfo.from_dict(meta) if "role" in meta else None,
        stats=EngineStats.from_dict(stats) if stats else None,
    )


class PinnedRequestRouter(FIFOMixin, RequestRouter):
    def initialize_state(self, **kwargs: Any) -> None:
        from deployments import registries  # by reference: see registries

        registries.register(self._deployment_id.app_name, self._deployment_id.name, self)

    def replica_views(self) -> list[ReplicaView]:
        """Live replicas by id, rebuilt only when the replica set or a
        replica's published metadata or load report changed."""
        # Serve reuses a replica's RunningReplica and swaps in a new info (a
        # new routing_stats dict) on every broadcast: those identities, held
        # here so that none can be reused, are the version.
        replicas = tuple(self.curr_replicas.values())
        version = tuple(x for r in replicas for x in (r, r.routing_stats))
        cached = getattr(self, "_version", None)
        if cached is None or len(cached) != len(version) or any(a is not b for a, b in zip(cached, version)):
            views = sorted((_view(r) for r in replicas), key=lambda v: v.replica_id)
            self._views, self._views_by_id, self._version = views, {v.replica_id: v for v in views}, version
        return self._views

    def replica_view(self, replica_id: str) -> ReplicaView | None:
        self.replica_views()
        return self._views_by_id.get(replica_id)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        target = _target_replica(pending_request)
        if target is not None:
            for replica in candidate_replicas:
                if replica.replica_id.unique_id == target:
                    return [[replica]]
        # No choice made, or the chosen replica is gone: two random candidates,
        # of which Serve takes the one with the shorter queue.
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
