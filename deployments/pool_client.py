"""`PoolClient` over a Serve deployment: Serve says which replicas exist
(the pool's request router, with their metadata and load); requests go to
the replica the scheduler named over the direct data plane (orchestrator/wire)
where that replica publishes a `stream_port`, else through the handle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ray.serve.handle import DeploymentHandle

from deployments.registries import router_for
from orchestrator.messages import EngineChunk, EngineRequest, PrefillResult
from orchestrator.pools import ReplicaView
from orchestrator.wire.client import ReplicaStreams


class ServePoolClient:
    def __init__(self, handle: DeploymentHandle, streams: ReplicaStreams | None = None) -> None:
        """`streams`: the frontend's data-plane connections; None: handle calls only."""
        self.name = handle.deployment_name
        self._handle = handle
        self._stream = handle.options(stream=True)
        self._streams = streams

    def replicas(self) -> list[ReplicaView]:
        router = router_for(self._handle.app_name, self.name)
        return router.replica_views() if router is not None else []

    def _address(self, replica_id: str | None) -> tuple[str, int] | None:
        """The named replica's data-plane address; None: use the handle
        (no data plane, no replica named, or the replica is not live)."""
        if self._streams is None or replica_id is None:
            return None
        router = router_for(self._handle.app_name, self.name)
        view = router.replica_view(replica_id) if router is not None else None
        if view is None or view.info is None or view.info.stream_port is None:
            return None
        return view.info.host, view.info.stream_port

    async def connect(self) -> dict:
        """One call that makes the handle build its router (which then learns
        the pool's replicas); returns the answering replica's engine info."""
        return await self._handle.engine_info.remote()

    async def prefill(self, request: EngineRequest) -> PrefillResult:
        address = self._address(request.target_replica)
        if address is not None:
            return await self._streams.prefill(address, request)
        response = self._handle.prefill.remote(request)
        try:
            return await response
        except asyncio.CancelledError:
            response.cancel()
            raise

    def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        address = self._address(request.target_replica)
        if address is not None:
            return self._streams.generate(address, request)
        return self._handle_generate(request)

    async def _handle_generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        chunks = self._stream.generate.remote(request)
        finished = False
        try:
            async for chunk in chunks:
                yield chunk
            finished = True
        finally:
            if not finished:
                chunks.cancel()  # aborts the request in the replica's engine
