"""A pool of one in-process engine: the `PoolClient` boundary without Ray,
for a standalone server over a single engine (e.g. one simulated replica
that other routers can be put in front of)."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

from orchestrator.engines.base import Engine, EngineInfo
from orchestrator.messages import EngineChunk, EngineRequest, PrefillResult
from orchestrator.pools import ReplicaView


class LocalPool:
    def __init__(self, name: str, engine: Engine, replica_id: str = "local") -> None:
        self.name = name
        self.engine = engine
        self.replica_id = replica_id
        self.info: EngineInfo | None = None

    async def start(self) -> EngineInfo:
        self.info = await self.engine.start()
        return self.info

    def replicas(self) -> list[ReplicaView]:
        if self.info is None:
            return []
        return [ReplicaView(self.replica_id, self.info, self.engine.stats())]

    async def prefill(self, request: EngineRequest, view: ReplicaView | None = None) -> PrefillResult:
        return dataclasses.replace(await self.engine.prefill(request), replica_id=self.replica_id)

    def generate(self, request: EngineRequest, view: ReplicaView | None = None) -> AsyncIterator[EngineChunk]:
        return self.engine.generate(request)
