"""The Responses API's store, shared by the frontend replicas of an app that has several (`build_app`; one
frontend keeps its own, as vLLM's server does): one Serve replica holding a `BoundedResponseStore`
(orchestrator/api/response_store.py), and the frontends' client of it.

Where it lives decides what survives: a frontend's restart, yes (the store is its own replica); the store
replica's restart, no (Serve starts it empty); a new deploy, no. Its calls are one actor round trip each: a
stored response's put, a previous turn's get, and, while a frontend runs background responses, a read of
their cancelled ids every `cancel_poll_s`."""

from __future__ import annotations

from ray import serve
from ray.serve.handle import DeploymentHandle

from orchestrator.api.response_store import BoundedResponseStore, Put, StoredResponse


@serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=4096)
class ResponseStoreReplica:
    """Each method is O(1) in the store's size (`cancelled`: in the ids asked) and runs on the replica's loop."""

    def __init__(self, max_responses: int, max_bytes: int) -> None:
        self.store = BoundedResponseStore(max_responses, max_bytes)

    async def put(self, record: StoredResponse) -> Put:
        return await self.store.put(record)

    async def get(self, response_id: str) -> StoredResponse | None:
        return await self.store.get(response_id)

    async def cancel(self, response_id: str) -> StoredResponse | None:
        return await self.store.cancel(response_id)

    async def cancelled(self, response_ids: list[str]) -> list[str]:
        return await self.store.cancelled(response_ids)


class ServeResponseStore:
    """A `ResponseStore` in the app's store replica, through its deployment handle."""

    def __init__(self, handle: DeploymentHandle) -> None:
        self.handle = handle

    async def put(self, record: StoredResponse) -> Put:
        return await self.handle.put.remote(record)

    async def get(self, response_id: str) -> StoredResponse | None:
        return await self.handle.get.remote(response_id)

    async def cancel(self, response_id: str) -> StoredResponse | None:
        return await self.handle.cancel.remote(response_id)

    async def cancelled(self, response_ids: list[str]) -> list[str]:
        return await self.handle.cancelled.remote(response_ids)
