"""The Responses API's event stream of a chat completion's SSE stream (its first choice), as vLLM 0.32's server
sends it for a model without Harmony (`SimpleStreamingEventProcessor`):

    response.created, response.in_progress                     the response in progress, no output
    per output item, one open at a time, in the order the chat deltas say them:
      reasoning  output_item.added, content_part.added, reasoning_text.delta..., reasoning_text.done,
                 content_part.done, output_item.done
      message    output_item.added, content_part.added, output_text.delta..., output_text.done,
                 content_part.done, output_item.done
      call       output_item.added, function_call_arguments.delta..., function_call_arguments.done,
                 output_item.done                             (a new call index opens a new item)
    response.completed                                         the whole response (status incomplete at length)

Every event has a `sequence_number`, from 0. An error after the start: an `error` event, and the stream ends.
Each chat delta is read once, as the service's dict (never framed and parsed back); the items' text is kept
once, for their `done` events and the final response.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from orchestrator.api import openai_responses as api


class _Item:
    """The output item being streamed: its kind ("reasoning" | "message" | "call"), id and text so far."""

    def __init__(self, kind: str, item_id: str, output_index: int, call: dict[str, Any] | None = None) -> None:
        self.kind, self.id, self.output_index = kind, item_id, output_index
        self.call = call  # a call's call_id, name and chat index
        self.pieces: list[str] = []
        self.logprobs: list[dict[str, Any]] = []

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class ResponseEvents:
    """The events of one streamed response, chat delta by chat delta."""

    def __init__(self, base: dict[str, Any], new_id: Callable[[], str], logprobs: bool) -> None:
        self.base, self.new_id, self.logprobs = base, new_id, logprobs
        self.sequence = 0
        self.item: _Item | None = None
        self.output: list[dict[str, Any]] = []
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.error: dict[str, Any] | None = None  # what failed the answer, once the stream has said it

    def event(self, kind: str, **fields: Any) -> dict[str, Any]:
        out = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return out

    def start(self) -> list[dict[str, Any]]:
        return [
            self.event("response.created", response=self.base),
            self.event("response.in_progress", response=self.base),
        ]

    def delta(self, choice: dict[str, Any]) -> list[dict[str, Any]]:
        """The events of one chat choice delta: tool calls before reasoning before content, as vLLM orders a
        delta's parts."""
        delta = choice.get("delta") or {}
        out: list[dict[str, Any]] = []
        for call in delta.get("tool_calls") or []:
            out += self._call(call)
        if delta.get("reasoning"):
            out += self._to("reasoning")
            out.append(self._text_delta("response.reasoning_text.delta", delta["reasoning"]))
        if delta.get("content"):
            out += self._to("message")
            logprobs = ((choice.get("logprobs") or {}).get("content") or []) if self.logprobs else []
            out.append(self._text_delta("response.output_text.delta", delta["content"], logprobs))
        if choice.get("finish_reason"):
            self.finish = choice["finish_reason"]
        return out

    def end(self) -> list[dict[str, Any]]:
        """The open item's close and `response.completed`, with the whole response."""
        out = self._close()
        response = api.finished(self.base, self.output, self.finish, self.usage)
        out.append(self.event("response.completed", response=response))
        self.response = response
        return out

    def _call(self, call: dict[str, Any]) -> list[dict[str, Any]]:
        function = call.get("function") or {}
        out: list[dict[str, Any]] = []
        index = call.get("index", 0)
        if self.item is None or self.item.kind != "call" or self.item.call["index"] != index:
            out += self._close()
            call_id = call.get("id") or f"call_{self.new_id()}"
            opened = {"call_id": call_id, "name": function.get("name", ""), "index": index}
            self.item = _Item("call", f"fc_{self.new_id()}", len(self.output), opened)
            added = api.call_item(self.item.id, opened["call_id"], opened["name"], "", status="in_progress")
            out.append(self.event("response.output_item.added", output_index=self.item.output_index, item=added))
        if function.get("arguments"):
            self.item.pieces.append(function["arguments"])
            out.append(
                self.event(
                    "response.function_call_arguments.delta",
                    output_index=self.item.output_index,
                    item_id=self.item.id,
                    delta=function["arguments"],
                )
            )
        return out

    def _to(self, kind: str) -> list[dict[str, Any]]:
        if self.item is not None and self.item.kind == kind:
            return []
        out = self._close()
        prefix = "rs" if kind == "reasoning" else "msg"
        self.item = item = _Item(kind, f"{prefix}_{self.new_id()}", len(self.output))
        if kind == "reasoning":
            added = {"id": item.id, "type": "reasoning", "summary": [], "status": "in_progress"}
            part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
        else:
            added = {"id": item.id, "type": "message", "role": "assistant", "content": [], "status": "in_progress"}
            part = api.text_part("", [])
        return [
            *out,
            self.event("response.output_item.added", output_index=item.output_index, item=added),
            self.event(
                "response.content_part.added",
                output_index=item.output_index,
                item_id=item.id,
                content_index=0,
                part=part,
            ),
        ]

    def _text_delta(self, kind: str, text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        item = self.item
        assert item is not None
        item.pieces.append(text)
        fields: dict[str, Any] = {
            "item_id": item.id,
            "output_index": item.output_index,
            "content_index": 0,
            "delta": text,
        }
        if logprobs is not None:
            item.logprobs += logprobs
            fields["logprobs"] = [_stream_logprob(lp) for lp in logprobs]
        return self.event(kind, **fields)

    def _close(self) -> list[dict[str, Any]]:
        item, self.item = self.item, None
        if item is None:
            return []
        at = {"output_index": item.output_index, "item_id": item.id}
        if item.kind == "call":
            call = item.call
            done = api.call_item(item.id, call["call_id"], call["name"], item.text)
            events = [self.event("response.function_call_arguments.done", **at, arguments=item.text, name=call["name"])]
        elif item.kind == "reasoning":
            done = api.reasoning_item(item.id, item.text)
            part = done["content"][0]
            events = [
                self.event("response.reasoning_text.done", **at, content_index=0, text=item.text),
                self.event("response.content_part.done", **at, content_index=0, part=part),
            ]
        else:
            done = api.message_item(item.id, item.text, item.logprobs if self.logprobs else None)
            part = api.text_part(item.text, item.logprobs if self.logprobs else None)
            events = [
                self.event("response.output_text.done", **at, content_index=0, text=item.text, logprobs=[]),
                self.event("response.content_part.done", **at, content_index=0, part=part),
            ]
        self.output.append(done)
        events.append(self.event("response.output_item.done", output_index=item.output_index, item=done))
        return events


def _stream_logprob(lp: dict[str, Any]) -> dict[str, Any]:
    top = [{"token": t["token"], "logprob": t["logprob"]} for t in lp.get("top_logprobs") or []]
    return {"token": lp["token"], "logprob": lp["logprob"], "top_logprobs": top}


def _sse(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode()


async def stream(
    chat_chunks: AsyncGenerator[dict[str, Any], None],
    events: ResponseEvents,
    on_complete: Callable[[dict[str, Any]], Awaitable[None]],
) -> AsyncIterator[bytes]:
    """The Responses events of a chat completion's stream (its chunks' payloads, unframed: the service's
    `framed=False`); `on_complete` gets the whole response before `response.completed` is sent (where it is
    stored)."""
    try:
        for event in events.start():
            yield _sse(event)
        async for chunk in chat_chunks:
            if "error" in chunk:  # the chat stream's own error event, in the Responses API's error event
                error = chunk["error"]
                fields = {"code": error.get("code"), "message": error["message"], "param": error.get("param")}
                events.error = fields
                yield _sse(events.event("error", **fields))
                return
            if chunk.get("usage"):
                events.usage = chunk["usage"]
            for choice in chunk.get("choices") or []:
                if choice.get("index", 0) == 0:
                    for event in events.delta(choice):
                        yield _sse(event)
        final = events.end()
        await on_complete(events.response)
        for event in final:
            yield _sse(event)
    finally:  # a client gone: the chat stream closes at once (its engine requests aborted, its slot given back)
        await chat_chunks.aclose()
