"""Anthropic's Messages API (`POST /v1/messages`) on the chat path, as vLLM 0.32's server serves it
(`vllm/entrypoints/anthropic`): a Messages request becomes the chat request that says the same, so one
preparation path (template, sampling, tools, reasoning) and one request path (routing, P/D, admission,
migration, metrics) serve both; the chat answer becomes Anthropic's message, or its event stream.

    request  system -> a system message; a message's text blocks -> its text (one block: a string, several:
             text parts); an assistant's tool_use blocks -> its tool_calls (input as JSON arguments); a
             user's tool_result blocks -> tool messages before the user's own text; tools -> functions
             (input_schema -> parameters); tool_choice auto / any / tool / none -> auto / required / the
             named function / none (disable_parallel_tool_use -> parallel_tool_calls false);
             max_tokens, stop_sequences -> stop, temperature, top_p, top_k, stream as they are
    answer   reasoning -> a thinking block; content -> a text block; tool_calls -> tool_use blocks; none
             -> one empty text block. finish length -> max_tokens; a matched stop string -> stop_sequence;
             calls -> tool_use; else end_turn. usage: input_tokens (less the cached, which are
             cache_read_input_tokens), output_tokens
    stream   message_start; per block content_block_start, its deltas (text_delta, thinking_delta,
             input_json_delta), content_block_stop; message_delta (stop_reason, usage); message_stop.
             An error after the start: an `error` event
    errors   {"type": "error", "error": {"type", "message"}}, the type from the status

Not served (a 400 naming the field): image and document blocks, `thinking`, `output_config`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.api.errors import APIError, from_validation_error

# Anthropic's error type for each status (https://docs.anthropic.com/en/api/errors).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def error_body(err: APIError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(err.status, "api_error"), "message": err.message}}


# -- the request -------------------------------------------------------------------------------------------------


class _Block(BaseModel):
    """A content block: fields Anthropic adds to blocks that do not change what is said (cache_control,
    citations) are ignored, as vLLM ignores them."""

    model_config = ConfigDict(extra="ignore")


class TextBlock(_Block):
    type: Literal["text"]
    text: str


class ToolUseBlock(_Block):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class ToolResultBlock(_Block):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)


class UnservedBlock(_Block):
    type: Literal["image", "document", "thinking", "redacted_thinking", "server_tool_use", "search_result"]


Block = Annotated[TextBlock | ToolUseBlock | ToolResultBlock | UnservedBlock, Field(discriminator="type")]


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str
    description: str | None = None
    input_schema: dict[str, Any]


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str
    max_tokens: int = Field(ge=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None
    # Accepted and not used, as vLLM: what they ask of Anthropic's service changes nothing in the answer here.
    metadata: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None
    service_tier: str | None = None
    inference_geo: str | None = None
    speed: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    thinking: dict[str, Any] | None = None  # refused below: not served
    output_config: dict[str, Any] | None = None  # refused below: not served


def chat_request(body: bytes) -> tuple[MessagesRequest, dict[str, Any]]:
    """The Messages request in `body` and the chat request that says the same (APIError 400 where it cannot)."""
    try:
        req = MessagesRequest.model_validate_json(body)
    except ValidationError as e:
        raise from_validation_error(e) from None
    for name in ("thinking", "output_config"):
        if getattr(req, name) is not None:
            raise APIError(400, f"{name}: not served by this server's Messages API", param=name)
    messages: list[dict[str, Any]] = []
    if req.system:
        system = req.system if isinstance(req.system, str) else "".join(b.text for b in req.system)
        messages.append({"role": "system", "content": system})
    for i, m in enumerate(req.messages):
        messages.extend(_chat_messages(m, i))
    chat: dict[str, Any] = {"model": req.model, "messages": messages, "max_tokens": req.max_tokens}
    for src, dst in (("stop_sequences", "stop"), ("temperature", "temperature"), ("top_p", "top_p")):
        if getattr(req, src) is not None:
            chat[dst] = getattr(req, src)
    if req.top_k is not None:
        chat["top_k"] = req.top_k
    if req.stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    if req.tools:
        chat["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": t.name,
                    **({"description": t.description} if t.description else {}),
                    "parameters": t.input_schema,
                },
            }
            for t in req.tools
        ]
    if req.tool_choice is not None:
        chat.update(_tool_choice(req.tool_choice))
    return req, chat


def _chat_messages(m: Message, index: int) -> list[dict[str, Any]]:
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    for k, b in enumerate(m.content):
        if isinstance(b, UnservedBlock):
            where = f"messages.{index}.content.{k}.type"
            raise APIError(400, f"{where}: {b.type} blocks are not served by this server", param=where)
    texts = [b.text for b in m.content if isinstance(b, TextBlock)]
    content: str | list[dict[str, str]] = texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]
    if m.role == "assistant":
        calls = [
            {
                "id": b.id,
                "type": "function",
                "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)},
            }
            for b in m.content
            if isinstance(b, ToolUseBlock)
        ]
        message: dict[str, Any] = {"role": "assistant", "content": content if texts else None}
        if calls:
            message["tool_calls"] = calls
        return [message]
    out: list[dict[str, Any]] = [
        {"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()}
        for b in m.content
        if isinstance(b, ToolResultBlock)
    ]
    if texts:
        out.append({"role": "user", "content": content})
    return out


def _tool_choice(choice: ToolChoice) -> dict[str, Any]:
    if choice.type == "tool":
        if not choice.name:
            raise APIError(400, "tool_choice.name: a tool_choice of type tool needs one", param="tool_choice.name")
        out: dict[str, Any] = {"tool_choice": {"type": "function", "function": {"name": choice.name}}}
    else:
        out = {"tool_choice": {"auto": "auto", "any": "required", "none": "none"}[choice.type]}
    if choice.disable_parallel_tool_use:
        out["parallel_tool_calls"] = False
    return out


# -- the answer --------------------------------------------------------------------------------------------------


def message_id(chat_id: str) -> str:
    return "msg_" + chat_id.removeprefix("chatcmpl-")


def usage(chat_usage: dict[str, Any] | None) -> dict[str, int]:
    """Anthropic's usage: input_tokens excludes the cached prompt tokens (cache_read_input_tokens), as vLLM."""
    if not chat_usage:
        return {"input_tokens": 0, "output_tokens": 0}
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    out = {"input_tokens": chat_usage["prompt_tokens"], "output_tokens": chat_usage.get("completion_tokens") or 0}
    if cached is not None:
        out["input_tokens"] = max(0, out["input_tokens"] - cached)
        out["cache_read_input_tokens"] = cached
    return out


def stop_reason(finish: str | None, stop: Any, called: bool) -> tuple[str | None, str | None]:
    """(stop_reason, stop_sequence) of a chat finish (vLLM's `_to_anthropic_stop_reason`)."""
    if finish == "length":
        return "max_tokens", None
    if finish not in ("stop", "tool_calls"):
        return None, None
    if called:
        return "tool_use", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    return ("tool_use" if finish == "tool_calls" else "end_turn"), None


def message(chat: dict[str, Any]) -> dict[str, Any]:
    """The Anthropic message of a whole chat completion (its first choice)."""
    choice = chat["choices"][0]
    msg = choice["message"]
    content: list[dict[str, Any]] = []
    if msg.get("reasoning"):
        content.append({"type": "thinking", "thinking": msg["reasoning"], "signature": ""})
    if msg.get("content"):
        content.append({"type": "text", "text": msg["content"]})
    calls = msg.get("tool_calls") or []
    content.extend(
        {"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": _input(c["function"]["arguments"])}
        for c in calls
    )
    if not content:
        content.append({"type": "text", "text": ""})
    reason, sequence = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"), bool(calls))
    return {
        "id": message_id(chat["id"]),
        "type": "message",
        "role": "assistant",
        "model": chat["model"],
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(chat.get("usage")),
    }


def _input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


# -- the stream --------------------------------------------------------------------------------------------------


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


class _Blocks:
    """The content blocks of a streamed message: one open at a time, each opened by the delta of a new kind
    (or a new tool call) and closed by the next or by the message's end."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # "text" | "thinking" | the open tool call's id

    def to(self, kind: str, start: dict[str, Any]) -> list[bytes]:
        if self.open == kind:
            return []
        out = self.close()
        self.index += 1
        self.open = kind
        return [
            *out,
            _event("content_block_start", {"type": "content_block_start", "index": self.index, "content_block": start}),
        ]

    def delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", {"type": "content_block_stop", "index": self.index})]


async def stream(chat_chunks: AsyncGenerator[dict[str, Any], None], model: str) -> AsyncIterator[bytes]:
    """Anthropic's event stream of a chat completion's stream (its chunks' payloads, unframed: the service's
    `framed=False`; its first choice; usage from its last chunk, which `chat_request` asks for)."""
    try:
        async for event in _events(chat_chunks, model):
            yield event
    finally:  # a client gone: the chat stream closes at once (its engine requests aborted, its slot given back)
        await chat_chunks.aclose()


async def _events(chat_chunks: AsyncIterator[dict[str, Any]], model: str) -> AsyncIterator[bytes]:
    blocks = _Blocks()
    started = False
    finish, stop, called, tail_usage = None, None, False, None
    async for chunk in chat_chunks:
        if "error" in chunk:  # the chat stream's own error event: its OpenAI type kept where Anthropic has it
            kind = "invalid_request_error" if chunk["error"].get("type") == "invalid_request_error" else "api_error"
            yield _event("error", {"type": "error", "error": {"type": kind, "message": chunk["error"]["message"]}})
            return
        if not started:
            started = True
            head = {
                "id": message_id(chunk["id"]),
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 0, "output_tokens": 0},
            }
            yield _event("message_start", {"type": "message_start", "message": head})
        if chunk.get("usage"):
            tail_usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or {}
            for piece in _deltas(blocks, delta):
                yield piece
            if delta.get("tool_calls"):
                called = True
            if choice.get("finish_reason"):
                finish, stop = choice["finish_reason"], choice.get("stop_reason")
    if not started:
        return
    if blocks.index < 0:  # no content at all: one empty text block, as vLLM sends
        for piece in blocks.to("text", {"type": "text", "text": ""}):
            yield piece
    for piece in blocks.close():
        yield piece
    reason, sequence = stop_reason(finish, stop, called)
    yield _event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage(tail_usage),
        },
    )
    yield _event("message_stop", {"type": "message_stop"})


def _deltas(blocks: _Blocks, delta: dict[str, Any]) -> list[bytes]:
    """The events of one chat delta: reasoning, then content, then tool calls, each in its own block."""
    out: list[bytes] = []
    if delta.get("reasoning"):
        out += blocks.to("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        out.append(blocks.delta({"type": "thinking_delta", "thinking": delta["reasoning"]}))
    if delta.get("content"):
        out += blocks.to("text", {"type": "text", "text": ""})
        out.append(blocks.delta({"type": "text_delta", "text": delta["content"]}))
    for call in delta.get("tool_calls") or []:
        function = call.get("function") or {}
        if call.get("id"):
            start = {"type": "tool_use", "id": call["id"], "name": function.get("name", ""), "input": {}}
            out += blocks.to(call["id"], start)
        if function.get("arguments"):
            out.append(blocks.delta({"type": "input_json_delta", "partial_json": function["arguments"]}))
    return out
