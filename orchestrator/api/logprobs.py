"""Log-probabilities in the OpenAI formats, from the engine's per-position lists.

As vLLM's server writes them (`_create_chat_logprobs`,
`_create_completion_logprobs`): a logprob of -inf is written -9999.0; chat's
`top_logprobs` are the first `top` of the engine's list (which starts with
the sampled token); completions' `top_logprobs` the first `top + 1`.
Prompt log-probabilities (`prompt_logprobs`) are vLLM's per-position dicts
as its server dumps them: None for the first token, else token id ->
{logprob, rank, decoded_token}.
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


def chat_logprobs(positions: Sequence[PositionLogprobs], top: int) -> dict[str, Any]:
    return {
        "content": [
            {
                "token": p.sampled.token,
                "logprob": _value(p.sampled),
                "bytes": _bytes(p.sampled.token),
                "top_logprobs": [
                    {"token": c.token, "logprob": _value(c), "bytes": _bytes(c.token)} for c in p.candidates[:top]
                ],
            }
            for p in positions
        ]
    }


@dataclass(frozen=True)
class Unscored:
    """A position with no log-probabilities (a prompt's first token, echoed)."""

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

    def __init__(self, top: int, initial_offset: int = 0) -> None:
        self.top = top
        self.offset = initial_offset

    def body(self, positions: Sequence[PositionLogprobs | Unscored]) -> dict[str, Any]:
        offsets: list[int] = []
        tokens: list[str] = []
        values: list[float | None] = []
        tops: list[dict[str, float] | None] = []
        for p in positions:
            token = p.token if isinstance(p, Unscored) else p.sampled.token
            offsets.append(self.offset)
            self.offset += len(token)
            tokens.append(token)
            if isinstance(p, Unscored):
                values.append(None)
                tops.append(None)
            else:
                values.append(_value(p.sampled))
                tops.append({c.token: _value(c) for c in p.candidates[: self.top + 1]})
        return {"text_offset": offsets, "token_logprobs": values, "tokens": tokens, "top_logprobs": tops}
