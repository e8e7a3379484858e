"""OpenAI request bodies we accept, as pydantic models.

Unknown fields are rejected (400 naming the field) rather than silently
ignored; fields OpenAI defines that this server does not implement are
accepted only at their no-op value, so a client never gets an answer that
quietly ignored what it asked for.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class _SamplingFields(_Body):
    model: str
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
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
    # Accepted only at their no-op values (see `unsupported_fields`).
    logit_bias: dict[str, float] | None = None
    best_of: int | None = None

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if any(s == "" for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops

    def unsupported_fields(self) -> list[str]:
        """Fields set to something this server does not implement."""
        found = []
        if self.n != 1:
            found.append("n")
        if self.logit_bias:
            found.append("logit_bias")
        if self.best_of not in (None, 1):
            found.append("best_of")
        return found


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=1)
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _single_prompt(cls, v: Any) -> str | list[int]:
        if isinstance(v, str) or (isinstance(v, list) and v and isinstance(v[0], int)):
            return v
        if isinstance(v, list) and len(v) == 1:
            return v[0]
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        raise ValueError("batched prompts are not supported: send one prompt per request")

    def unsupported_fields(self) -> list[str]:
        found = super().unsupported_fields()
        if self.echo:
            found.append("echo")
        if self.logprobs is not None:
            found.append("logprobs")
        if self.suffix:
            found.append("suffix")
        return found


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: dict[str, Any] | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def unsupported_fields(self) -> list[str]:
        found = super().unsupported_fields()
        if self.logprobs or self.top_logprobs:
            found.append("logprobs")
        if self.tools:
            found.append("tools")
        if self.tool_choice not in (None, "none"):
            found.append("tool_choice")
        if self.response_format not in (None, {"type": "text"}):
            found.append("response_format")
        return found
