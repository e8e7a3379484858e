"""OpenAI response bodies for /v1/completions and /v1/chat/completions,
whole and streamed, one choice at a time (`index` orders them: prompt i's
sample j is choice i * n + j, as vLLM numbers them)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any


class Endpoint(str, enum.Enum):
    COMPLETIONS = "completions"
    CHAT = "chat"


@dataclass(frozen=True)
class ResponseHeader:
    id: str
    created: int
    model: str


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def _choice(
    index: int, part: dict[str, Any], finish_reason: str | None, logprobs: Any, stop_reason: Any = None, **optional: Any
) -> dict:
    """A choice: its index, its part (text, message or delta), logprobs, finish, what stopped it (vLLM's
    `stop_reason`: the stop string or token id, else null; a stream's finishing delta only), then the
    optional fields set."""
    choice = {"index": index, **part, "logprobs": logprobs, "finish_reason": finish_reason}
    if finish_reason is not None or "delta" not in part:
        choice["stop_reason"] = stop_reason
    return choice | {k: v for k, v in optional.items() if v is not None}


def completion_choice(
    index: int,
    text: str,
    finish_reason: str | None,
    logprobs: dict[str, Any] | None = None,
    token_ids: list[int] | None = None,
    prompt_token_ids: list[int] | None = None,
    prompt_logprobs: list[dict[str, Any] | None] | None = None,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    return _choice(
        index,
        {"text": text},
        finish_reason,
        logprobs,
        stop_reason,
        prompt_logprobs=prompt_logprobs,
        prompt_token_ids=prompt_token_ids,
        token_ids=token_ids,
    )


def chat_choice(
    index: int,
    message: dict[str, Any],
    finish_reason: str | None,
    logprobs: dict[str, Any] | None = None,
    token_ids: list[int] | None = None,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    return _choice(index, {"message": message}, finish_reason, logprobs, stop_reason, token_ids=token_ids)


def whole_response(
    endpoint: Endpoint,
    h: ResponseHeader,
    choices: list[dict[str, Any]],
    usage_body: dict[str, Any],
    prompt_token_ids: list[int] | None = None,
    prompt_logprobs: list[dict[str, Any] | None] | None = None,
    prompt_text: str | None = None,
) -> dict[str, Any]:
    """`prompt_token_ids`, `prompt_logprobs`: chat's at the top (as vLLM's server
    puts them); a completion's are in its choices. `prompt_text`: chat's rendered template."""
    obj = "text_completion" if endpoint is Endpoint.COMPLETIONS else "chat.completion"
    body = {"id": h.id, "object": obj, "created": h.created, "model": h.model, "choices": choices}
    if prompt_logprobs is not None:
        body["prompt_logprobs"] = prompt_logprobs
    if prompt_token_ids is not None:
        body["prompt_token_ids"] = prompt_token_ids
    if prompt_text is not None:
        body["prompt_text"] = prompt_text
    body["usage"] = usage_body
    return body


def chunk(endpoint: Endpoint, h: ResponseHeader, choices: list[dict[str, Any]]) -> dict[str, Any]:
    obj = "text_completion" if endpoint is Endpoint.COMPLETIONS else "chat.completion.chunk"
    return {"id": h.id, "object": obj, "created": h.created, "model": h.model, "choices": choices}


def role_chunk(
    h: ResponseHeader,
    index: int = 0,
    prompt_token_ids: list[int] | None = None,
    role: str = "assistant",
    prompt_text: str | None = None,
) -> dict[str, Any]:
    """A chat choice's first chunk: the answer's role, no content yet (and the prompt's token ids and
    rendered text, when asked)."""
    body = chunk(
        Endpoint.CHAT,
        h,
        [{"index": index, "delta": {"role": role, "content": ""}, "logprobs": None, "finish_reason": None}],
    )
    if prompt_token_ids is not None:
        body["prompt_token_ids"] = prompt_token_ids
    if prompt_text is not None:
        body["prompt_text"] = prompt_text
    return body


def chat_delta(
    index: int,
    delta: dict[str, Any],
    finish_reason: str | None,
    logprobs: dict[str, Any] | None = None,
    token_ids: list[int] | None = None,
    stop_reason: str | int | None = None,
) -> dict[str, Any]:
    return _choice(index, {"delta": delta}, finish_reason, logprobs, stop_reason, token_ids=token_ids)


def usage_chunk(endpoint: Endpoint, h: ResponseHeader, usage_body: dict[str, Any]) -> dict[str, Any]:
    """The last streamed chunk when `stream_options.include_usage` is set."""
    body = chunk(endpoint, h, [])
    body["usage"] = usage_body
    return body
