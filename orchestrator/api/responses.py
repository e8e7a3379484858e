"""OpenAI response bodies for /v1/completions and /v1/chat/completions,
whole and streamed."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from orchestrator.messages import CompletionTotals, FinishReason


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


def _finish(reason: FinishReason | None) -> str | None:
    return reason.value if reason is not None else None


def whole_response(
    endpoint: Endpoint,
    h: ResponseHeader,
    totals: CompletionTotals,
    usage_body: dict[str, Any],
    prompt_token_ids: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """`prompt_token_ids` given (vLLM's `return_token_ids`): the choice carries its token ids and the prompt's
    (chat: the prompt's at the top, as vLLM's server puts them)."""
    if endpoint is Endpoint.COMPLETIONS:
        choice = {"index": 0, "text": totals.text, "logprobs": None, "finish_reason": _finish(totals.finish_reason)}
        obj = "text_completion"
    else:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": totals.text},
            "logprobs": None,
            "finish_reason": _finish(totals.finish_reason),
        }
        obj = "chat.completion"
    body = {"id": h.id, "object": obj, "created": h.created, "model": h.model, "choices": [choice]}
    if prompt_token_ids is not None:
        choice["token_ids"] = list(totals.token_ids)
        if endpoint is Endpoint.COMPLETIONS:
            choice["prompt_token_ids"] = list(prompt_token_ids)
        else:
            body["prompt_token_ids"] = list(prompt_token_ids)
    body["usage"] = usage_body
    return body


def _chunk(endpoint: Endpoint, h: ResponseHeader, choices: list[dict[str, Any]]) -> dict[str, Any]:
    obj = "text_completion" if endpoint is Endpoint.COMPLETIONS else "chat.completion.chunk"
    return {"id": h.id, "object": obj, "created": h.created, "model": h.model, "choices": choices}


def role_chunk(h: ResponseHeader, prompt_token_ids: tuple[int, ...] | None = None) -> dict[str, Any]:
    """The first chat chunk: the assistant role, no content yet (and the prompt's token ids, when asked)."""
    chunk = _chunk(
        Endpoint.CHAT,
        h,
        [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
    )
    if prompt_token_ids is not None:
        chunk["prompt_token_ids"] = list(prompt_token_ids)
    return chunk


def delta_chunk(
    endpoint: Endpoint,
    h: ResponseHeader,
    text: str,
    finish_reason: FinishReason | None,
    token_ids: tuple[int, ...] | None = None,
    prompt_token_ids: tuple[int, ...] | None = None,
) -> dict[str, Any]:
    """`token_ids` given (vLLM's `return_token_ids`): the chunk's tokens; `prompt_token_ids` on a
    completion's first chunk."""
    if endpoint is Endpoint.COMPLETIONS:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": _finish(finish_reason)}
        if prompt_token_ids is not None:
            choice["prompt_token_ids"] = list(prompt_token_ids)
    else:
        delta = {"content": text} if text else {}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": _finish(finish_reason)}
    if token_ids is not None:
        choice["token_ids"] = list(token_ids)
    return _chunk(endpoint, h, [choice])


def usage_chunk(endpoint: Endpoint, h: ResponseHeader, usage_body: dict[str, Any]) -> dict[str, Any]:
    """The last streamed chunk when `stream_options.include_usage` is set."""
    chunk = _chunk(endpoint, h, [])
    chunk["usage"] = usage_body
    return chunk
