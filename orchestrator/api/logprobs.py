"""Log-probabilities in the OpenAI formats, from the engine's per-position lists.

As vLLM's server writes them (`_create_chat_logprobs`,
`_create_completion_logprobs`): a logprob of -inf is written -9999.0; chat's
`top_logprobs` are the first `top` of the engine's list (which starts with
the sampled token); completions' `top_logprobs` the first `top + 1`.
Prompt log-probabilities (`prompt_logprobs`) are vLLM's per-position dicts
as its server dumps them: None for the first token, else token id ->
{logprob, rank, decoded_token}. With `return_tokens_as_token_ids` a token is
named "token_id:<id>" (vLLM's placeholder); as in vLLM's chat, a sampled
token's `bytes` stay its text's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.messages import PositionLogprobs, TokenLogprob

FLOOR = -9999.0


def _value(t: TokenLogprob) -> float:
    return max(t.logprob, FLOOR)


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8", errors="replace"))


def token_name(token_id: int, text: str, as_ids: bool) -> str:
    return f"token_id:{token_id}" if as_ids else text


def _name(t: TokenLogprob, as_ids: bool) -> str:
    return token_name(t.token_id, t.token, as_ids)


def chat_logprobs(positions: Sequence[PositionLogprobs], top: int, as_ids: bool = False) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": _name(p.sampled, as_ids),
                "logprob": _value(p.sampled),
                "bytes": _bytes(p.sampled.token),
                "top_logprobs": [
                    {"token": (name := _name(c, as_ids)), "logprob": _value(c), "bytes": _bytes(name)}
                    for c in p.candidates[:top]
                ],
            }
            for p in positions
        ]
    }


@dataclass(frozen=True)
class Unscored:
    """A position with no log-probabilities (a prompt's first token, echoed)."""

    token_id: int
    token: str


def prompt_logprobs_body(positions: Sequence[PositionLogprobs | None]) -> list[dict[str, Any] | None]:
    return [
        None
        if p is None
        else {str(c.token_id): {"logprob": _value(c), "rank": c.rank, "decoded_token": c.token} for c in p.candidates}
        for p in positions
    ]


class CompletionLogprobs:
    """One choice's completion logprobs; `text_offset` runs on across streamed chunks."""

    def __init__(self, top: int, as_ids: bool = False, initial_offset: int = 0) -> None:
        self.top = top
        self.as_ids = as_ids
        self.offset = initial_offset

    def body(self, positions: Sequence[PositionLogprobs | Unscored]) -> dict[str, Any]:
        offsets: list[int] = []
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        for p in positions:
            token = (
                token_name(p.token_id, p.token, self.as_ids)
                if isinstance(p, Unscored)
                else _name(p.sampled, self.as_ids)
            )
            offsets.append(self.offset)
            self.offset += len(token)
            tokens.append(token)
            if isinstance(p, Unscored):
                values.append(None)
                tops.append(None)
            else:
                values.append(_value(p.sampled))
                tops.append({_name(c, self.as_ids): _value(c) for c in p.candidates[: self.top + 1]})
        return {"text_offset": offsets, "token_logprobs": values, "tokens": tokens, "top_logprobs": tops}
