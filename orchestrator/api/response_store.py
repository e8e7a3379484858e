"""Stored responses of the Responses API (`store: true`): what `previous_response_id`, `GET /v1/responses/{id}`
and cancel read. One store serves every frontend replica of an app (the shell's, `deployments/response_store.py`,
holds a `BoundedResponseStore` in one Serve replica); tests and single-process apps hold one in-process.

    bounded    at most `max_responses` records and `max_bytes` of their JSON; past either, the oldest are
               evicted (a record is as old as its first put). A record larger than `max_bytes` alone is not kept
    cancelled  a cancelled record is final: a later put of the same id (the run that was cancelled, finishing)
               leaves it as it is
"""

from __future__ import annotations

import enum
import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

# Statuses a background response can still be cancelled in.
RUNNING = frozenset({"queued", "in_progress"})


class Put(str, enum.Enum):
    """What a put did."""

    KEPT = "kept"
    TOO_LARGE = "too_large"  # larger than the store's byte bound alone: not kept
    CANCELLED = "cancelled"  # its id is cancelled: the cancelled record stands


@dataclass(frozen=True)
class StoredResponse:
    """A response object and the chat messages its turn was asked with (what the next turn continues), as JSON;
    `tenant`: whose key made it (only that tenant's requests find it)."""

    id: str
    status: str
    tenant: str
    response_json: bytes
    messages_json: bytes

    @classmethod
    def of(cls, response: dict[str, Any], messages: list[dict[str, Any]], tenant: str) -> StoredResponse:
        return cls(response["id"], response["status"], tenant, _dump(response), _dump(messages))

    @property
    def size(self) -> int:
        return len(self.response_json) + len(self.messages_json)

    def response(self) -> dict[str, Any]:
        return json.loads(self.response_json)

    def messages(self) -> list[dict[str, Any]]:
        return json.loads(self.messages_json)

    def with_status(self, status: str) -> StoredResponse:
        response = _dump(self.response() | {"status": status})
        return StoredResponse(self.id, status, self.tenant, response, self.messages_json)


def _dump(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


class ResponseStore(Protocol):
    async def put(self, record: StoredResponse) -> Put:
        """Keeps `record` (replacing its id's, unless that one is cancelled)."""
        ...

    async def get(self, response_id: str) -> StoredResponse | None: ...

    async def cancel(self, response_id: str) -> StoredResponse | None:
        """Marks a running record cancelled and returns it; the record as it is if it is not running; None if
        there is none."""
        ...

    async def cancelled(self, response_ids: list[str]) -> list[str]:
        """Those of `response_ids` whose records are cancelled."""
        ...


class BoundedResponseStore:
    """The store in one process: insertion-ordered, so the oldest record is the first evicted."""

    def __init__(self, max_responses: int = 10_000, max_bytes: int = 256 * 2**20) -> None:
        if max_responses < 1 or max_bytes < 1:
            raise ValueError("a response store keeps at least one response and one byte")
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()
        self._cancelled: set[str] = set()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._records)

    async def put(self, record: StoredResponse) -> Put:
        key = record.id
        if key in self._cancelled:
            return Put.CANCELLED
        if record.size > self.max_bytes:
            return Put.TOO_LARGE
        old = self._records.get(key)
        if old is not None:
            self.bytes -= old.size
        self._records[key] = record
        self.bytes += record.size
        self._evict()
        return Put.KEPT

    async def get(self, response_id: str) -> StoredResponse | None:
        return self._records.get(response_id)

    async def cancel(self, response_id: str) -> StoredResponse | None:
        record = self._records.get(response_id)
        if record is None or record.status not in RUNNING:
            return record
        cancelled = record.with_status("cancelled")
        self.bytes += cancelled.size - record.size
        self._records[response_id] = cancelled
        self._cancelled.add(response_id)
        return cancelled

    async def cancelled(self, response_ids: list[str]) -> list[str]:
        return [i for i in response_ids if i in self._cancelled]

    def _evict(self) -> None:
        while len(self._records) > self.max_responses or self.bytes > self.max_bytes:
            key, oldest = self._records.popitem(last=False)
            self.bytes -= oldest.size
            self._cancelled.discard(key)
