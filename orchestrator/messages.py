"""Plain objects that cross the frontend <-> engine-replica boundary.

They are pickled by Ray between processes, so they hold only plain data:
no engine objects, no handles.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from orchestrator.lora.adapter import LoraAdapter


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop string or a stop token
    LENGTH = "length"  # max_tokens or the model's context reached
    ABORT = "abort"  # cancelled by the client or the server
    REPETITION = "repetition"  # vLLM's repetition_detection ended a looping output


class StructuredKind(str, enum.Enum):
    """The constraint kinds of vLLM's `StructuredOutputsParams` (SGLang's differ in name only)."""

    JSON = "json"  # `value`: a JSON schema, serialised
    JSON_OBJECT = "json_object"  # any JSON object; `value` unused
    REGEX = "regex"
    CHOICE = "choice"  # `value`: the allowed strings
    GRAMMAR = "grammar"  # EBNF / GBNF / Lark, as the engine's backend reads it
    STRUCTURAL_TAG = "structural_tag"  # `value`: xgrammar's structural tag, serialised (vLLM's and SGLang's)


@dataclass(frozen=True)
class StructuredOutput:
    """Constrained decoding: the engine samples only tokens the constraint allows."""

    kind: StructuredKind
    value: str | tuple[str, ...] = ""
    # vLLM's options of the compiled grammar: no free whitespace, no properties a JSON schema does not
    # name, or whitespace matching this pattern.
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    @property
    def has_options(self) -> bool:
        return self.disable_any_whitespace or self.disable_additional_properties or self.whitespace_pattern is not None


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    token: str  # the engine's text for this one token
    rank: int | None = None  # 1 = the most likely token at its position; None: not reported


@dataclass(frozen=True)
class PositionLogprobs:
    """One output position's log-probabilities.

    `candidates` is the engine's list in its own order: the sampled token
    first, then the top `logprobs` by rank (the sampled token once, if among
    them), as vLLM returns them; the OpenAI formats slice it."""

    sampled: TokenLogprob
    candidates: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class RepetitionDetection:
    """vLLM's `repetition_detection`: the output ends ("repetition") once an n-gram of
    min..max_pattern_size tokens has repeated min_count times; max_pattern_size 0: off."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0


@dataclass(frozen=True)
class SamplingSpec:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # Top log-probabilities per output position (0: the sampled token's only); None: none.
    logprobs: int | None = None
    # With `logprobs`: these tokens' log-probabilities at each position instead of the top ones (vLLM's).
    logprob_token_ids: tuple[int, ...] | None = None
    # The same per prompt position (0: the prompt token's only); None: none. The
    # engine that computes the prompt returns them, so such a request prefills
    # where it decodes (`EngineRequest.prefills_where_it_decodes`).
    prompt_logprobs: int | None = None
    logit_bias: tuple[tuple[int, float], ...] = ()
    structured: StructuredOutput | None = None
    # False keeps special tokens in the text (tool-call tags that are special tokens in some models).
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Sampling restricted to these tokens (None: any), and word sequences never generated.
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()
    repetition_detection: RepetitionDetection | None = None
    # vLLM's `vllm_xargs`, for the engine's custom extensions (logits processors): (name, value) pairs,
    # a list value as a tuple. Never the KV transfer's parameters, which the request path alone sets.
    extra_args: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class KVTransfer:
    """Where a prompt's KV blocks wait after a remote prefill.

    Contract: the prefill replica that produced it owns those blocks until the
    decode replica named in the route reads them (NIXL READ) or the engine's
    lease on them expires; the frontend only carries this object from one to
    the other. `engine_params` is the engine connector's own metadata, opaque
    to everything but the engine adapter.
    """

    source_engine_id: str
    num_blocks: int
    num_tokens: int
    engine_params: dict[str, Any]


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingSpec
    # Set on a decode request whose prompt was prefilled remotely.
    kv_transfer: KVTransfer | None = None
    # The replica the scheduler chose (Serve replica unique id); None lets Serve pick.
    target_replica: str | None = None
    # vLLM's cache_salt: the engine and the KV index key this prompt's cached blocks under it, so a prompt
    # reuses only the cache of prompts with the same salt. Kept by every transformation below.
    cache_salt: str | None = None
    # The W3C `traceparent` of the frontend's span of this request, when tracing is on (orchestrator/tracing.py):
    # an engine that traces (vLLM with an OTLP endpoint) parents its spans under it. Kept by every transformation.
    trace_context: str | None = None
    # The LoRA adapter the request runs with, on every engine that computes it (prefill and decode alike);
    # None: the base model. Kept by every transformation, so no engine computes it with other weights.
    lora: LoraAdapter | None = None
    # The engines' scheduling priority (vLLM's rule: lower runs first), from the request's SLO class; on both
    # pools. 0 unless classes are configured (then the engines schedule by priority). Kept by every transformation.
    priority: int = 0

    def for_prefill(self, replica: str | None, samples_first_token: bool = False) -> EngineRequest:
        """The request sent to a prefill replica: the same prompt, one token, KV
        kept for a remote decode. Where the decode replica samples the first
        output token itself (vLLM: the prefill's is discarded), what shapes only
        the output (log-probabilities, a constraint) is left to the decode side.
        Where the decode engine continues from the prefill's token
        (`samples_first_token`, SGLang), the prefill samples it as the output's
        first: under the constraint, scored as asked, never EOS before
        `min_tokens`. Prompt log-probabilities are never the prefill's to give."""
        shaping = (
            {"min_tokens": min(self.sampling.min_tokens, 1)}
            if samples_first_token
            else {"min_tokens": 0, "logprobs": None, "logprob_token_ids": None, "structured": None}
        )
        return replace(
            self,
            request_id=f"{self.request_id}-prefill",
            sampling=replace(self.sampling, max_tokens=1, prompt_logprobs=None, **shaping),
            kv_transfer=None,
            target_replica=replica,
        )

    @property
    def prefills_where_it_decodes(self) -> bool:
        """Whether only the decode replica may compute the prompt: its
        log-probabilities come from the engine that computes it, and a remote
        prefill's stay on the prefill replica."""
        return self.sampling.prompt_logprobs is not None

    def for_decode(self, replica: str | None, kv_transfer: KVTransfer | None) -> EngineRequest:
        return replace(self, kv_transfer=kv_transfer, target_replica=replica)

    @property
    def resumable_mid_output(self) -> bool:
        """Whether another engine request can continue this one after some of its output: a constrained
        output's constraint cannot be resumed mid-output."""
        return self.sampling.structured is None

    def resumable_after(self, generated: Sequence[int]) -> bool:
        """Whether `continued(generated, ...)` exists."""
        return self.resumable_mid_output or not generated

    def continued(self, generated: Sequence[int], attempt: int) -> EngineRequest:
        """The rest of this request after `generated` tokens, to run elsewhere:
        those tokens join the prompt (the new replica computes their KV) and
        the output budget shrinks by as many. Greedy decoding then continues
        exactly where it stopped. Only where `resumable_after(generated)`."""
        s = self.sampling
        if not self.resumable_after(generated):
            raise ValueError("a constrained output cannot be continued after its first token")
        return replace(
            self,
            request_id=f"{self.request_id}-m{attempt}",
            prompt_token_ids=self.prompt_token_ids + tuple(generated),
            sampling=replace(
                s,
                max_tokens=s.max_tokens - len(generated),
                min_tokens=max(0, s.min_tokens - len(generated)),
                # Sent with the first token: a continuation after it has none to send.
                prompt_logprobs=s.prompt_logprobs if not generated else None,
            ),
            kv_transfer=None,
            target_replica=None,
        )


@dataclass(frozen=True)
class EngineChunk:
    """New output of one request since the previous chunk."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    # Known from the first chunk on.
    num_prompt_tokens: int = 0
    # Prompt tokens the engine did not compute: local prefix-cache hits plus
    # tokens whose KV arrived by transfer.
    num_cached_tokens: int = 0
    # One per token in `token_ids` when the request asked for log-probabilities.
    logprobs: tuple[PositionLogprobs, ...] | None = None
    # First chunk only, when the request asked for them: one per prompt token,
    # None for the first (nothing precedes it).
    prompt_logprobs: tuple[PositionLogprobs | None, ...] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @staticmethod
    def merged(chunks: Sequence[EngineChunk]) -> EngineChunk:
        """Consecutive chunks of one stream as one, every field carried: tokens,
        text and their log-probabilities joined; the prompt counts and the prompt's
        log-probabilities of the first chunk that has them; the last finish."""
        if len(chunks) == 1:
            return chunks[0]
        first = next((c for c in chunks if c.num_prompt_tokens), chunks[0])
        last = chunks[-1]
        scored = [c.logprobs for c in chunks if c.logprobs is not None]
        return EngineChunk(
            token_ids=tuple(t for c in chunks for t in c.token_ids),
            text="".join(c.text for c in chunks),
            finish_reason=last.finish_reason,
            stop_reason=last.stop_reason,
            num_prompt_tokens=first.num_prompt_tokens,
            num_cached_tokens=first.num_cached_tokens,
            logprobs=tuple(p for positions in scored for p in positions) if scored else None,
            prompt_logprobs=next((c.prompt_logprobs for c in chunks if c.prompt_logprobs is not None), None),
        )


@dataclass(frozen=True)
class PrefillResult:
    kv_transfer: KVTransfer
    num_prompt_tokens: int
    num_cached_tokens: int
    replica_id: str | None = None


@dataclass
class CompletionTotals:
    """Accumulates a stream of chunks into the whole answer; linear in its length
    (the text's pieces are joined when it is read, once per read after growth)."""

    _pieces: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or token id that ended it; None: EOS, length, ...
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    prompt_logprobs: tuple[PositionLogprobs | None, ...] | None = None

    @property
    def text(self) -> str:
        if len(self._pieces) > 1:
            self._pieces[:] = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    def add(self, chunk: EngineChunk) -> None:
        if chunk.text:
            self._pieces.append(chunk.text)
        self.token_ids.extend(chunk.token_ids)
        if chunk.logprobs:
            self.logprobs.extend(chunk.logprobs)
        if chunk.prompt_logprobs is not None:
            self.prompt_logprobs = chunk.prompt_logprobs
        if chunk.num_prompt_tokens:
            self.num_prompt_tokens = chunk.num_prompt_tokens
            self.num_cached_tokens = chunk.num_cached_tokens
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
            self.stop_reason = chunk.stop_reason
