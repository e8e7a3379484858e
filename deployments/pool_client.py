"""`PoolClient` over a Serve deployment: Serve says which replicas exist
(the pool's request router, with their metadata and load); requests go to
the replica the scheduler named over the direct data plane (orchestrator/wire)
where that replica publishes a `stream_port`, else through the handle, counted
in `orchestrator_direct_path_fallbacks_total` when the data plane is on."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ray.serve.handle import DeploymentHandle

from deployments.registries import router_for
from orchestrator.messages import EngineChunk, EngineRequest, PrefillResult
from orchestrator.metrics import DirectPathFallbacks
from orchestrator.pools import DirectPathFallback, ReplicaView
from orchestrator.wire.client import DataPlaneRefused, ReplicaStreams


class ServePoolClient:
    def __init__(
        self,
        handle: DeploymentHandle,
        streams: ReplicaStreams | None = None,
        fallbacks: DirectPathFallbacks | None = None,
    ) -> None:
        """`streams`: the frontend's data-plane connections; None: handle calls only.
        `fallbacks`: where a call that could not take the data plane is counted."""
        self.name = handle.deployment_name
        self._handle = handle
        self._stream = handle.options(stream=True)
        self._streams = streams
        self._fallbacks = fallbacks or DirectPathFallbacks()

    def replicas(self) -> list[ReplicaView]:
        router = router_for(self._handle.app_name, self.name)
        return router.replica_views() if router is not None else []

    def _address(self, request: EngineRequest, view: ReplicaView | None) -> tuple[str, int] | None:
        """The replica's data-plane address, from the view the request was routed on; None: use
        the handle (no data plane configured, or a counted fallback)."""
        if self._streams is None:
            return None
        if request.target_replica is None:
            reason = DirectPathFallback.NO_REPLICA_NAMED
        elif view is None or view.replica_id != request.target_replica:
            reason = DirectPathFallback.REPLICA_NOT_LIVE
        elif view.info is None or view.info.stream_port is None:
            reason = DirectPathFallback.NO_STREAM_PORT
        else:
            return view.info.host, view.info.stream_port
        self._fallbacks.count(self.name, reason)
        return None

    async def connect(self) -> dict:
        """One call that makes the handle build its router (which then learns
        the pool's replicas); returns the answering replica's engine info."""
        return await self._handle.engine_info.remote()

    async def prefill(self, request: EngineRequest, view: ReplicaView | None = None) -> PrefillResult:
        address = self._address(request, view)
        if address is not None:
            try:
                return await self._streams.prefill(address, request)
            except DataPlaneRefused:
                self._fallbacks.count(self.name, DirectPathFallback.REFUSED)
        response = self._handle.prefill.remote(request)
        try:
            return await response
        except asyncio.CancelledError:
            response.cancel()
            raise

    def generate(self, request: EngineRequest, view: ReplicaView | None = None) -> AsyncIterator[EngineChunk]:
        address = self._address(request, view)
        if address is not None:
            return self._direct_generate(address, request)
        return self._handle_generate(request)

    async def _direct_generate(self, address: tuple[str, int], request: EngineRequest) -> AsyncIterator[EngineChunk]:
        """The data plane's stream; a refused proof (before any chunk) takes the handle instead, counted."""
        stream = self._streams.generate(address, request)
        try:
            try:
                first = await anext(stream)
            except StopAsyncIteration:
                return
            except DataPlaneRefused:
                self._fallbacks.count(self.name, DirectPathFallback.REFUSED)
                async for chunk in self._handle_generate(request):
                    yield chunk
                return
            yield first
            async for chunk in stream:
                yield chunk
        finally:
            await stream.aclose()  # closed early: CANCEL now, not when collected

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
