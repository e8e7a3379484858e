"""`PoolClient` over Serve deployment handles."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from ray.serve.handle import DeploymentHandle

from deployments.router_registry import router_for
from orchestrator.pools import ReplicaView
from orchestrator.requests import EngineChunk, EngineRequest, PrefillResult


class ServePoolClient:
    def __init__(self, handle: DeploymentHandle) -> None:
        self.name = handle.deployment_name
        self._handle = handle
        self._stream = handle.options(stream=True)

    def replicas(self) -> list[ReplicaView]:
        router = router_for(self._handle.app_name, self.name)
        return router.replica_views() if router is not None else []

    async def connect(self) -> dict:
        """One call that makes the handle build its router (which then learns
        the pool's replicas); returns the answering replica's engine info."""
        return await self._handle.engine_info.remote()

    async def prefill(self, request: EngineRequest) -> PrefillResult:
        response = self._handle.prefill.remote(request)
        try:
            return await response
        except asyncio.CancelledError:
            response.cancel()
            raise

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        chunks = self._stream.generate.remote(request)
        finished = False
        try:
            async for chunk in chunks:
                yield chunk
            finished = True
        finally:
            if not finished:
                chunks.cancel()  # aborts the request in the replica's engine
