"""Log-probabilities between our requests and SGLang's: the `async_generate`
arguments that ask for them, and its output's lists read back in vLLM's order.

SGLang's output (`meta_info`, as its TokenizerManager fills it):
`output_token_logprobs` one `(logprob, token id, text)` per output token,
the text None (`Engine.async_generate` takes no `return_text_in_logprobs`:
the adapter decodes each token alone, as SGLang does when asked);
`output_top_logprobs` one list of them per output token, most likely first,
or None; `output_token_ids_logprobs` the same for
the asked tokens (`token_ids_logprob`); `input_token_logprobs` /
`input_top_logprobs` the prompt's, from `logprob_start_len`, the first
token's logprob None. In a cumulative stream each list holds every position
so far; in an incremental one (`incremental_streaming_output`) only the new.

vLLM's order, which the frontend's OpenAI formats slice: the sampled (or
prompt) token first, then the top ranks or the asked tokens, each token
once. SGLang reports no rank for a token outside its top list: such a rank is
None (vLLM computes it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator.engines.base import EngineError
from orchestrator.messages import PositionLogprobs, SamplingSpec, TokenLogprob

# SGLang's logprob_start_len meaning "the output only".
OUTPUT_ONLY = -1

# Each token id's own text, as the engine's tokenizer decodes it alone.
TokenTexts = Callable[[Sequence[int]], Sequence[str]]


def logprob_kwargs(spec: SamplingSpec) -> dict[str, Any]:
    """`async_generate`'s log-probability arguments for what `spec` asks; {} for none. SGLang has one
    `top_logprobs_num` for the output and the prompt: the larger is asked, each side trimmed to its own."""
    if spec.logprobs is None and spec.prompt_logprobs is None:
        return {}
    output_top = 0 if spec.logprob_token_ids else (spec.logprobs or 0)
    kwargs: dict[str, Any] = {
        "return_logprob": True,
        "top_logprobs_num": max(output_top, spec.prompt_logprobs or 0),
        "logprob_start_len": OUTPUT_ONLY if spec.prompt_logprobs is None else 0,
    }
    if spec.logprob_token_ids:
        kwargs["token_ids_logprob"] = list(spec.logprob_token_ids)
    return kwargs


class _Texts:
    """Token texts for the entries an answer lists: SGLang's where it sent them, else decoded in one call."""

    def __init__(self, entries: Sequence[Sequence[Any]], token_texts: TokenTexts) -> None:
        missing = sorted({int(e[1]) for e in entries if e[2] is None})
        self._decoded = dict(zip(missing, token_texts(missing), strict=True)) if missing else {}

    def token(self, entry: Sequence[Any], rank: int | None = None) -> TokenLogprob:
        logprob, token_id, text = entry
        return TokenLogprob(int(token_id), float(logprob), self._decoded[int(token_id)] if text is None else text, rank)

    def position(
        self, chosen: Sequence[Any], others: Sequence[Sequence[Any]] | None, ranked: bool, limit: int | None = None
    ) -> PositionLogprobs:
        """`chosen` (the sampled or prompt token) first, then the first `limit` of `others` less it;
        `ranked`: `others` is the top list SGLang sent, so a token's rank is its place there."""
        others = others or ()
        ranks = {int(e[1]): i + 1 for i, e in enumerate(others)} if ranked else {}
        first = self.token(chosen, ranks.get(int(chosen[1])))
        rest = tuple(
            self.token(e, i + 1 if ranked else None)
            for i, e in enumerate(others[:limit])
            if int(e[1]) != first.token_id
        )
        return PositionLogprobs(first, (first, *rest))


def output_logprobs(
    meta: Mapping[str, Any], spec: SamplingSpec, start: int, count: int, token_texts: TokenTexts
) -> tuple[PositionLogprobs, ...] | None:
    """The log-probabilities of output positions `start`..`start + count` of `meta`'s lists (None when
    `spec` asks for none). Raises EngineError when SGLang sent fewer than that."""
    if spec.logprobs is None:
        return None
    window = slice(start, start + count)
    sampled = list(meta.get("output_token_logprobs") or ())[window]
    asked = bool(spec.logprob_token_ids)
    others = list(meta.get("output_token_ids_logprobs" if asked else "output_top_logprobs") or ())[window]
    if len(sampled) != count or (others and len(others) != count):
        raise EngineError(f"SGLang sent log-probabilities for {len(sampled)} of {count} new tokens")
    others = others or [None] * count
    limit = None if asked else spec.logprobs
    texts = _Texts([*sampled, *(e for o in others for e in (o or ())[:limit])], token_texts)
    return tuple(texts.position(s, o, not asked, limit) for s, o in zip(sampled, others, strict=True))


def prompt_logprobs(
    meta: Mapping[str, Any], spec: SamplingSpec, token_texts: TokenTexts
) -> tuple[PositionLogprobs | None, ...] | None:
    """The prompt's log-probabilities from `meta`, None for its first token (None when `spec` asks for
    none). Raises EngineError when SGLang sent none."""
    if spec.prompt_logprobs is None:
        return None
    tokens = list(meta.get("input_token_logprobs") or ())
    if not tokens:
        raise EngineError("SGLang sent no prompt log-probabilities")
    tops = [top or () for top in meta.get("input_top_logprobs") or [None] * len(tokens)]
    scored = [token for token in tokens if token[0] is not None]
    texts = _Texts([*scored, *(e for top in tops for e in top[: spec.prompt_logprobs])], token_texts)
    return tuple(
        None if token[0] is None else texts.position(token, top, True, spec.prompt_logprobs)
        for token, top in zip(tokens, tops, strict=True)
    )
