"""OpenAI request bodies we accept, as pydantic models.

Unknown request fields are rejected (400 naming the field) rather than
silently ignored (unknown keys of the objects inside are ignored, as vLLM
ignores them); fields this server does not implement are accepted only at their
no-op value (`unsupported_fields`), so a client never gets an answer that
quietly ignored what it asked for. Field names and limits follow vLLM's own
OpenAI server, extensions included (`structured_outputs`, `return_token_ids`,
`top_k`, `min_p`, ...).
"""

from __future__ import annotations

import functools
import json
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from orchestrator.messages import StructuredKind, StructuredOutput


class _Body(BaseModel):
    """An object inside a request (a message, a tool, a response format, ...): keys it does not define are
    ignored, as vLLM's server ignores them (a streamed tool call's `index` kept in the history, a provider's
    `cache_control`). A known field given as null takes its default, as vLLM reads null for every field it
    defaults (`n`: 1, `stream`: false, a completion's `max_tokens`: 16, ...)."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_is_the_default(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        known = cls._field_names()
        return {k: v for k, v in data.items() if v is not None or k not in known}

    @classmethod
    @functools.cache
    def _field_names(cls) -> frozenset[str]:
        return frozenset(name for key, f in cls.model_fields.items() for name in (key, f.alias) if name)


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(_Body):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class LegacyStructuralTag(_Body):
    begin: str
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    end: str


class ResponseFormat(_Body):
    """OpenAI's formats, and vLLM's `structural_tag` in both its forms: `format` (xgrammar's structural
    tag) or the older `structures` + `triggers`."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    format: dict[str, Any] | None = None
    structures: list[LegacyStructuralTag] | None = None
    triggers: list[str] | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError('type "json_schema" needs json_schema.schema')
        if self.type == "structural_tag" and (self.format is None) == (self.structures is None):
            raise ValueError('type "structural_tag" needs either format, or structures and triggers')
        if self.structures is not None and self.triggers is None:
            raise ValueError('type "structural_tag" with structures needs triggers')
        return self

    def constraint(self) -> StructuredOutput | None:
        """What the format holds the output to; None for "text"."""
        if self.type == "json_object":
            return StructuredOutput(StructuredKind.JSON_OBJECT)
        if self.type == "json_schema":
            assert self.json_schema is not None
            return StructuredOutput(StructuredKind.JSON, json.dumps(self.json_schema.schema_))
        if self.type == "structural_tag":
            return StructuredOutput(StructuredKind.STRUCTURAL_TAG, self._structural_tag())
        return None

    def _structural_tag(self) -> str:
        """The tag as vLLM hands it to the engine: the format's object, serialised."""
        if self.format is not None:
            return json.dumps({"type": self.type, "format": self.format})
        structures = [s.model_dump(by_alias=True) for s in self.structures or ()]
        return json.dumps({"type": self.type, "structures": structures, "triggers": self.triggers})


class StructuredOutputsBody(_Body):
    """vLLM's `structured_outputs` extension: exactly one constraint."""

    json_: str | dict[str, Any] | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = Field(default=None, min_length=1)
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None  # xgrammar's structural tag, serialised
    # Options of the compiled grammar, as vLLM's.
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputsBody:
        given = [k for k in _CONSTRAINT_FIELDS if getattr(self, k)]
        if len(given) != 1:
            raise ValueError("set exactly one of json, regex, choice, grammar, json_object, structural_tag")
        return self

    def constraint(self) -> StructuredOutput:
        field = next(k for k in _CONSTRAINT_FIELDS if getattr(self, k))
        value = getattr(self, field)
        if isinstance(value, dict):
            value = json.dumps(value)
        return StructuredOutput(
            _CONSTRAINT_FIELDS[field],
            "" if isinstance(value, bool) else tuple(value) if isinstance(value, list) else value,
            disable_any_whitespace=self.disable_any_whitespace,
            disable_additional_properties=self.disable_additional_properties,
            whitespace_pattern=self.whitespace_pattern,
        )


# The constraint fields of `structured_outputs` -> their kind.
_CONSTRAINT_FIELDS = {
    "json_": StructuredKind.JSON,
    "regex": StructuredKind.REGEX,
    "choice": StructuredKind.CHOICE,
    "grammar": StructuredKind.GRAMMAR,
    "json_object": StructuredKind.JSON_OBJECT,
    "structural_tag": StructuredKind.STRUCTURAL_TAG,
}


CACHE_SALT_MAX_LENGTH = 128
CACHE_SALT_FORBIDDEN = frozenset("@/\\\x00")


class Unsupported(NamedTuple):
    """A field set to something this server does not do, and why."""

    param: str
    message: str


class RepetitionDetectionBody(_Body):
    """vLLM's RepetitionDetectionParams, with its checks and messages."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0

    @model_validator(mode="after")
    def _valid(self) -> RepetitionDetectionBody:
        if self.max_pattern_size < 0 or self.min_pattern_size < 0 or self.min_pattern_size > self.max_pattern_size:
            raise ValueError(
                "max_pattern_size, min_pattern_size must be >=0, with min_pattern_size <= max_pattern_size. "
                "Set both to 0 to disable repetitive pattern detection."
            )
        if self.max_pattern_size > 0 and self.min_count < 2:
            raise ValueError(
                "min_count must be >= 2 to detect repetitive patterns in engine output. If you do not wish to "
                "detect repetitive patterns, set max_pattern_size to 0."
            )
        return self


class NotServed(NamedTuple):
    """A field this server takes only at a value that asks for nothing (`no_op`), and why."""

    reason: str
    no_op: tuple[Any, ...] = (None,)


# Fields of vLLM's server and OpenAI's API asking for what this server does not do: a 400 with the reason
# unless at a no-op value (vLLM's server reads the first four; OpenAI's fields it ignores).
NOT_SERVED_FIELDS: dict[str, NotServed] = {
    "kv_transfer_params": NotServed("this server moves the KV cache between its pools itself"),
    "ec_transfer_params": NotServed("encoder caches are not transferred here (text-only models)"),
    "thinking_token_budget": NotServed("a thinking budget needs vLLM's reasoning config on every engine (not set)"),
    "watermarking": NotServed("watermarking is not built here (vLLM applies it in its GPU worker only)", (None, False)),
}
NOT_SERVED_CHAT_FIELDS: dict[str, NotServed] = {
    "modalities": NotServed("this server answers in text only", (None, ["text"])),
    "audio": NotServed("audio output needs an audio model; this server serves text"),
    "web_search_options": NotServed("this server has no web search"),
    "functions": NotServed("the deprecated `functions` are not served: give them as `tools`"),
    "function_call": NotServed("the deprecated `function_call` is not served: use `tool_choice`"),
    "moderation": NotServed("this server runs no moderation"),
}
NOT_SERVED_COMPLETION_FIELDS: dict[str, NotServed] = {
    "prompt_embeds": NotServed("prompt embeddings are not carried over this server's pools"),
}


def _not_served(body: BaseModel, table: dict[str, NotServed]) -> list[Unsupported]:
    return [
        Unsupported(name, f"{name}: {entry.reason}")
        for name, entry in table.items()
        if getattr(body, name) not in entry.no_op
    ]


# vllm_xargs keys this server sets itself: the KV transfer between its pools.
RESERVED_XARGS = frozenset({"kv_transfer_params", "ec_transfer_params"})


class _SamplingFields(_Body):
    """A request's own fields: one neither OpenAI's API nor vLLM's server defines is a 400 naming it, since a
    misspelt parameter would otherwise be a silent no-op (vLLM's server ignores it with a log line)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**63)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    n: int = Field(default=1, ge=1)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's extension: each choice carries its token ids, and the answer the prompt's.
    return_token_ids: bool = False
    # Token id (as a string, as OpenAI sends it) -> bias; vLLM clamps to [-100, 100].
    logit_bias: dict[str, float] | None = None
    # vLLM's extensions: output text, token restrictions, prompt truncation (keeps the last k tokens).
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    allowed_token_ids: list[int] | None = Field(default=None, min_length=1)
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = Field(default=None, ge=-1)
    # vLLM's extension: the top log-probabilities at each prompt position (not streamed).
    prompt_logprobs: int | None = Field(default=None, ge=-1)
    # vLLM's extension: with logprobs, the log-probabilities of these tokens at each output position (besides
    # the sampled token's), in place of the top ones; at most vLLM's MAX_LOGPROB_TOKEN_IDS.
    logprob_token_ids: list[int] | None = Field(default=None, max_length=128)
    # vLLM V1 has no best_of: accepted when it asks for no more than `n`.
    best_of: int | None = Field(default=None, ge=1)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsBody | None = None
    # vLLM's extensions. The answer's id is "cmpl-"/"chatcmpl-" + request_id when given.
    request_id: str | None = None
    session_id: str | None = None  # request metadata: vLLM's scheduler reads none of it, nor does this server
    priority: int = 0  # vLLM's: the engines' priority, lower first; taken where the request's SLO class allows it
    slo_class: str | None = Field(default=None, max_length=64)  # the traffic class (also the x-slo-class header)
    # Log-probability tokens written "token_id:<id>" (vLLM's placeholder for text JSON cannot carry).
    return_tokens_as_token_ids: bool | None = None
    truncation_side: Literal["left", "right"] | None = None  # which end truncate_prompt_tokens cuts; left by default
    use_beam_search: bool = False
    length_penalty: float = 1.0  # beam search's; vLLM reads it only there
    return_token_offsets: bool | None = None  # vLLM fills it on /render endpoints only; generation ignores it
    # Tokens an SSE event carries at least (the first and last are sent at once), as vLLM's.
    stream_interval: int | None = Field(default=None, ge=1)
    # vLLM's: the prompt reuses only prefix cache computed under the same salt (engines and the KV index).
    cache_salt: str | None = None
    # vLLM's: the output ends early ("repetition") when it loops.
    repetition_detection: RepetitionDetectionBody | None = None
    # vLLM's: arguments for the engine's custom extensions (its SamplingParams.extra_args).
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    # vLLM's, for engines or endpoints this server does not run: accepted at values that ask nothing.
    routed_experts_prompt_start: int = Field(default=0, ge=0)  # no routed-expert data is returned here
    mm_payload: Literal["tensors", "none"] = "tensors"  # /render's; no media here
    return_mm_kwargs: bool | None = None  # /render's, deprecated
    # NOT_SERVED_FIELDS: a 400 with the reason unless at their no-op value.
    kv_transfer_params: Any = None
    ec_transfer_params: Any = None
    thinking_token_budget: Any = None
    watermarking: Any = None

    @field_validator("vllm_xargs")
    @classmethod
    def _own_xargs(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        reserved = sorted(set(v or {}) & RESERVED_XARGS)
        if reserved:
            raise ValueError(f"vllm_xargs may not set {', '.join(reserved)}: this server moves the KV cache itself")
        return v

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if any(s == "" for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops

    @field_validator("cache_salt")
    @classmethod
    def _cache_salt(cls, v: str | None) -> str | None:
        # vLLM's rules and message (entrypoints/generate/base/protocol.py, validate_cache_salt).
        if v is None:
            return None
        if not v:
            raise ValueError("Parameter 'cache_salt' must be a non-empty string if provided.")
        if len(v) > CACHE_SALT_MAX_LENGTH or any(c in CACHE_SALT_FORBIDDEN for c in v):
            raise ValueError(
                f"Parameter 'cache_salt' must be at most {CACHE_SALT_MAX_LENGTH} characters "
                "and must not contain '@', '/', '\\\\', or NUL."
            )
        return v

    @field_validator("logit_bias")
    @classmethod
    def _bias_keys(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        for key in v or {}:
            if not key.lstrip("-").isdigit():
                raise ValueError(f"logit_bias keys are token ids; got {key[:40]!r}")
        return v

    def unsupported_fields(self) -> list[Unsupported]:
        """Fields set to something this server does not implement."""
        found = []
        if self.best_of is not None and self.best_of > self.n:
            found.append(Unsupported("best_of", "best_of > n is not supported (vLLM V1 has no best_of)"))
        if self.response_format is not None and self.structured_outputs is not None:
            found.append(
                Unsupported("structured_outputs", "response_format and structured_outputs cannot both be given")
            )
        if self.use_beam_search:
            found.append(Unsupported("use_beam_search", "beam search is not supported by this server"))
        return found + _not_served(self, NOT_SERVED_FIELDS)


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False  # before max_tokens: its check reads it
    # 0 only with echo: the prompt scored alone. null is the default, 16, as vLLM reads it.
    max_tokens: int = Field(default=16, ge=0)
    logprobs: int | None = Field(default=None, ge=0)
    suffix: str | None = None
    add_special_tokens: bool = True  # the tokenizer's BOS and the like, around a text prompt
    prompt_embeds: Any = None  # NOT_SERVED_COMPLETION_FIELDS

    @field_validator("max_tokens")
    @classmethod
    def _zero_tokens_echo(cls, v: int, info: ValidationInfo) -> int:
        if v == 0 and not info.data.get("echo"):
            raise ValueError("max_tokens must be at least 1, got 0 (0 only with echo: the prompt scored alone)")
        if v == 0 and info.data.get("logprob_token_ids"):
            raise ValueError(
                "`logprob_token_ids` is not supported when `echo=True` and `max_tokens=0` because no output "
                "tokens are generated."
            )
        return v

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, v: Any) -> Any:
        if isinstance(v, list) and (not v or any(isinstance(p, list | str) and not p for p in v)):
            raise ValueError("prompt must not be empty")
        return v

    def prompts(self) -> list[str | list[int]]:
        """The request's prompts, in order: one, or each of a batch."""
        p = self.prompt
        if isinstance(p, str) or isinstance(p[0], int):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]

    def unsupported_fields(self) -> list[Unsupported]:
        found = super().unsupported_fields()
        if self.suffix:
            found.append(Unsupported("suffix", "suffix is not supported (nor by vLLM's server)"))
        return found + _not_served(self, NOT_SERVED_COMPLETION_FIELDS)


# Content part types read as text (vLLM's TEXT_PART_TYPES) -> the key holding the text.
TEXT_PART_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}


class ContentPart(BaseModel):
    """A text part of a message's content. Its other keys (e.g. `cache_control`) are kept, as vLLM
    keeps them for templates that read a message's parts."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text", "input_text", "output_text", "refusal", "thinking"]
    text: str | None = None
    refusal: str | None = None
    thinking: str | None = None
    closed: bool | None = None  # a thinking part's

    def value(self) -> str:
        return getattr(self, TEXT_PART_KEYS[self.type])


class FunctionCall(_Body):
    name: str
    arguments: str


class ToolCall(_Body):
    """A call in an assistant message of the history. Its other keys (a streamed call's `index`) reach the
    template, as vLLM passes a call on."""

    model_config = ConfigDict(extra="allow")

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]  # "function": OpenAI's deprecated
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None  # the older name vLLM still reads
    # OpenAI's answer fields, sent back with an earlier answer; no template reads them (nor vLLM's).
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: dict[str, Any] | None = None
    function_call: FunctionCall | None = None  # OpenAI's deprecated single call
    # After `role`: its check reads it. An assistant's may be absent (tool calls, a refusal).
    content: str | list[ContentPart | str] | None = Field(default=None, validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _text_parts(cls, data: Any) -> Any:
        """Each content part a text part with its text (said plainly, before pydantic's union errors)."""
        parts = data.get("content") if isinstance(data, dict) else None
        for part in parts if isinstance(parts, list) else ():
            if not isinstance(part, dict):
                continue
            kind = part.get("type")
            if kind not in TEXT_PART_KEYS:
                raise ValueError(
                    f"content parts of type {kind!r} are not supported: this server serves a text-only model "
                    f"(parts of type {', '.join(TEXT_PART_KEYS)} are)"
                )
            if not isinstance(part.get(TEXT_PART_KEYS[kind]), str):
                raise ValueError(f"a {kind!r} content part needs its {TEXT_PART_KEYS[kind]!r} text")
        return data

    @field_validator("content")
    @classmethod
    def _content_given(cls, v: Any, info: ValidationInfo) -> Any:
        if v is None and info.data.get("role") != "assistant":
            raise ValueError("content is required (an assistant message may give tool_calls instead)")
        return v


class FunctionDefinition(_Body):
    # Any non-empty name, as vLLM's server takes (OpenAI's own API allows [A-Za-z0-9_-]{1,64}; MCP servers'
    # tools are often named "server.tool" or "server:tool").
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None  # vLLM's, for templates that load some tools only when searched for


class Tool(_Body):
    type: Literal["function"] = "function"
    function: FunctionDefinition
    defer_loading: bool | None = None  # the function's too, unless it says otherwise (vLLM's rule)


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"] = "function"
    function: NamedFunction


# The template call's own arguments, which a request's template variables may not override.
RESERVED_TEMPLATE_KWARGS = frozenset(
    {"chat_template", "tokenize", "conversation", "tools", "add_generation_prompt", "continue_final_message"}
)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # vLLM's chat-template extensions.
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, str]] | None = None  # to the template, for retrieval-augmented templates
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None
    include_reasoning: bool = True  # False: no reasoning in the answer, nor logprobs or token ids (they'd leak it)
    # The last message's content written before the answer, when it has the answer's role (vLLM's chat echo).
    echo: bool = False
    chat_template: str | None = None  # refused: a template is code, and only the model's runs here
    return_prompt_text: bool | None = None  # vLLM's: the rendered prompt in the answer (a stream's first event)
    media_io_kwargs: dict[str, dict[str, Any]] | None = None  # vLLM's media loading options; no media here
    mm_processor_kwargs: dict[str, Any] | None = None  # vLLM's, for the HF processor of media; no media here
    # OpenAI's fields that ask nothing of the answer: stored completions, billing tiers and safety ids, its
    # prompt cache's routing hints (the KV-aware scheduler routes by the prompt's blocks themselves),
    # predicted outputs (a latency hint), GPT-5's verbosity. Accepted and unused, as vLLM's server.
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    # NOT_SERVED_CHAT_FIELDS: a 400 with the reason unless at their no-op value.
    modalities: list[str] | None = None
    audio: Any = None
    web_search_options: Any = None
    functions: Any = None
    function_call: Any = None
    moderation: Any = None

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_variables(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        reserved = sorted(set(v or {}) & RESERVED_TEMPLATE_KWARGS)
        if reserved:
            raise ValueError(f"chat_template_kwargs may not set {', '.join(reserved)}")
        return v

    @field_validator("continue_final_message")
    @classmethod
    def _continue_or_prompt(cls, v: bool, info: ValidationInfo) -> bool:
        if v and info.data.get("add_generation_prompt"):
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        return v

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _choice_in_tools(cls, v: Any, info: ValidationInfo) -> Any:
        if isinstance(v, NamedToolChoice) or v == "required":
            names = {t.function.name for t in info.data.get("tools") or ()}
            if not names:
                raise ValueError("tool_choice asks for a tool call, but no tools are given")
            if isinstance(v, NamedToolChoice) and v.function.name not in names:
                raise ValueError(f"tool_choice names {v.function.name!r}, which is not in tools")
        return v

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def effective_tool_choice(self) -> str | NamedToolChoice:
        """OpenAI's default: "auto" when tools are given, else "none"."""
        if self.tool_choice is not None:
            return self.tool_choice
        return "auto" if self.tools else "none"

    @property
    def response_role(self) -> str:
        """vLLM's rule: the assistant's, unless the last message is continued, whose role it keeps."""
        return "assistant" if self.add_generation_prompt else self.messages[-1].role

    def unsupported_fields(self) -> list[Unsupported]:
        found = super().unsupported_fields()
        if self.chat_template is not None:
            found.append(
                Unsupported(
                    "chat_template",
                    "a chat template in the request is refused (as by vLLM's server without "
                    "--trust-request-chat-template); the model's own template is used",
                )
            )
        forced = self.tools and (self.tool_choice == "required" or isinstance(self.tool_choice, NamedToolChoice))
        constrained = self.structured_outputs is not None or (
            self.response_format is not None and self.response_format.type != "text"
        )
        if forced and constrained:
            # A forced tool call's arguments are already the constraint.
            found.append(Unsupported("tool_choice", "a forced tool call cannot also take response_format"))
        return found + _not_served(self, NOT_SERVED_CHAT_FIELDS)
