"""The Responses API's requests (`openai_responses.py`) run as chat requests by a `CompletionService`, with the
turns they store in a `ResponseStore` (shared by the app's frontends):

    create    a request -> its chat request (continuing `previous_response_id`'s turn: 404 when that is not
              stored) -> the chat path -> a response object, or its event stream; stored when `store` is true
              (with the turn's messages, for the next turn). `background`: answered at once, `queued`, after
              preparation and admission (their errors are the request's); the answer runs here and is stored
    retrieve  the stored response object (404 when there is none)
    tenants   a stored response is its tenant's: another tenant's request finds none (404), as for an unknown id
    store     a store that refuses a response (larger than its byte bound) or does not answer leaves it answered
              and unstored (orchestrator_responses_unstored_total); a previous turn it cannot read is a 503
    cancel    a queued or in-progress background response: cancelled in the store (final there), and its run,
              on whichever frontend runs it, aborted: here at once, elsewhere when that frontend next reads
              the store's cancelled ids (every `cancel_poll_s` while it runs background responses)

With no store (`frontend.responses.store` off), `store: true` is ignored (vLLM's default), a previous response
is never found and `background` is refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from orchestrator.api import openai_responses as api
from orchestrator.api.errors import APIError, unavailable
from orchestrator.api.openai_responses_stream import ResponseEvents, stream
from orchestrator.api.response_store import Put, ResponseStore, StoredResponse
from orchestrator.api.responses import Endpoint
from orchestrator.api.service import CompletionService
from orchestrator.traffic.policy import DEFAULT_TENANT

log = logging.getLogger(__name__)


def not_found(response_id: str) -> APIError:
    return APIError(404, f"Response with id '{response_id}' not found.", param="response_id")


class ResponsesService:
    def __init__(
        self,
        chat: CompletionService,
        store: ResponseStore | None,
        wall_clock: Callable[[], float] = time.time,
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
        cancel_poll_s: float = 0.5,
    ) -> None:
        self.chat, self.store = chat, store
        self.wall_clock, self.new_id, self.cancel_poll_s = wall_clock, new_id, cancel_poll_s
        self._running: dict[str, asyncio.Task] = {}  # background responses run here, by id
        self._watcher: asyncio.Task | None = None

    async def create(
        self,
        body: bytes,
        traceparent: str | None = None,
        tenant: str = DEFAULT_TENANT,
        slo_class: str | None = None,
    ) -> dict[str, Any] | AsyncIterator[bytes]:
        req = api.parse(body)
        store = self.store if req.store else None
        if req.background:
            if store is None:
                reason = "background needs store true" if req.store else "this server stores no responses"
                raise APIError(400, f"background: {reason}", param="background")
            if req.stream:
                raise APIError(400, "background: a streamed background response is not served", param="background")
        previous = await self._previous(req.previous_response_id, tenant)
        chat = api.chat_request(req, previous, reads_calls=self.chat.preparer.tool_parser is not None)
        chat.setdefault("model", self.chat.model.name)  # no model named: the served one, as vLLM
        messages = chat["messages"]
        base = api.head(req, f"resp_{self.new_id()}", int(self.wall_clock()), req.model or self.chat.model.name)
        if req.background:
            chat |= {"stream": True, "stream_options": {"include_usage": True}}
        result = await self.chat.handle(
            Endpoint.CHAT,
            json.dumps(chat).encode(),
            traceparent=traceparent,
            tenant=tenant,
            slo_class=slo_class,
            framed=False,
        )

        async def keep(response: dict[str, Any]) -> None:
            if store is not None:
                await self._keep(store, StoredResponse.of(response, messages, tenant))

        if isinstance(result, dict):
            response = api.finished(base, api.output_items(result, self.new_id), _finish(result), result.get("usage"))
            await keep(response)
            return response
        events = ResponseEvents(base, self.new_id, req.wants_logprobs)
        if not req.background:
            return stream(result, events, keep)
        queued = base | {"status": "queued"}
        await keep(queued)
        self._start(queued["id"], self._run(result, events, keep))
        return queued

    async def retrieve(self, response_id: str, tenant: str = DEFAULT_TENANT, stream: bool = False) -> dict[str, Any]:
        if stream:
            raise APIError(400, "stream: replaying a stored response's events is not served", param="stream")
        return (await self._stored(response_id, tenant)).response()

    async def cancel(self, response_id: str, tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        await self._stored(response_id, tenant)
        record = await _answered(self.store.cancel(response_id))
        if record is None:
            raise not_found(response_id)
        if record.status != "cancelled":
            raise APIError(
                400,
                f"Response {response_id} is {record.status}: only a queued or in-progress background response "
                "can be cancelled.",
                param="response_id",
            )
        task = self._running.get(response_id)
        if task is not None:
            task.cancel()
        return record.response()

    async def _previous(self, response_id: str | None, tenant: str) -> api.PreviousTurn | None:
        if response_id is None:
            return None
        record = await self._stored(response_id, tenant)
        return api.PreviousTurn(record.messages(), record.response()["output"])

    async def _stored(self, response_id: str, tenant: str) -> StoredResponse:
        """`tenant`'s stored response `response_id` (404 when there is none; 503 when the store does not answer)."""
        record = await _answered(self.store.get(response_id)) if self.store is not None else None
        if record is None or record.tenant != tenant:
            raise not_found(response_id)
        return record

    async def _keep(self, store: ResponseStore, record: StoredResponse) -> None:
        """Stores `record`; a store that refuses it or does not answer leaves the answer unstored (counted),
        never lost."""
        try:
            put = await store.put(record)
        except Exception:
            log.warning("storing response %s failed", record.id, exc_info=True)
            self.chat.metrics.responses_unstored.labels("unreachable").inc()
            return
        if put is Put.TOO_LARGE:
            self.chat.metrics.responses_unstored.labels("too_large").inc()

    async def _run(self, chat_chunks: Any, events: ResponseEvents, keep: Callable[[dict[str, Any]], Any]) -> None:
        """A background response's answer, read to its end and stored (unless it was cancelled meanwhile)."""
        in_progress = events.base | {"status": "in_progress"}
        await keep(in_progress)
        try:
            async for _ in stream(chat_chunks, events, keep):
                pass
        except Exception as e:
            log.warning("background response %s failed", events.base["id"], exc_info=True)
            events.error = {"code": "server_error", "message": str(e) or type(e).__name__}
        if events.error is not None:  # the answer failed: stored as failed, with what failed
            await keep(in_progress | {"status": "failed", "error": events.error})

    def _start(self, response_id: str, run: Any) -> None:
        task = asyncio.get_running_loop().create_task(run, name=f"response {response_id}")
        self._running[response_id] = task
        task.add_done_callback(lambda _: self._running.pop(response_id, None))
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watch_cancels())

    async def _watch_cancels(self) -> None:
        """Cancels made through another frontend reach the runs here: read while any runs."""
        while self._running:
            await asyncio.sleep(self.cancel_poll_s)
            try:
                cancelled = await self.store.cancelled(list(self._running))
            except Exception:  # the store briefly unreachable: the next read catches up
                log.warning("reading the response store's cancelled ids failed", exc_info=True)
                continue
            for response_id in cancelled:
                task = self._running.get(response_id)
                if task is not None:
                    task.cancel()


async def _answered(call: Awaitable[Any]) -> Any:
    """The store's answer to `call`; a 503 when it gives none."""
    try:
        return await call
    except Exception:
        log.warning("the response store did not answer", exc_info=True)
        raise unavailable("the response store did not answer; retry") from None


def _finish(chat: dict[str, Any]) -> str | None:
    return chat["choices"][0].get("finish_reason")
