"""What request preparation hands the rest of the request's way: the answer's
plan, one `ChoicePlan` per choice, and the options that shape its output."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.api.reasoning_parsers import ReasoningParser
from orchestrator.api.responses import Endpoint, ResponseHeader
from orchestrator.api.tools import ToolMode
from orchestrator.lora.adapter import LoraAdapter
from orchestrator.messages import EngineRequest
from orchestrator.traffic.policy import Resolved


@dataclass(frozen=True)
class ModelCard:
    name: str
    max_model_len: int
    created: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.name,
            "object": "model",
            "created": self.created,
            "owned_by": "orchestrator",
            "max_model_len": self.max_model_len,
        }

    def adapter_card(self, adapter: LoraAdapter) -> dict[str, Any]:
        """A LoRA adapter of this model as vLLM lists it: `root` its source, `parent` this model."""
        return {**self.to_dict(), "id": adapter.name, "root": adapter.source, "parent": self.name}


@dataclass(frozen=True)
class ChoicePlan:
    """One choice of the answer. Prompt i's sample j is choice i * n + j; its
    seed is the request's + j (vLLM's rule for `n`). A prompt's first sample
    (`lead`) is routed; the others follow it to the decode replica that then
    holds the prompt's KV, and prefill there from its cache."""

    index: int
    request: EngineRequest
    prompt: int
    lead: bool
    # Written before the output: the prompt's text (completions' `echo`), or the
    # last message's content when it has the answer's role (chat's).
    echo: str = ""
    # Echo with logprobs: the prompt's first token's text (it has no log-probability).
    first_token: str = ""
    # An echo with max_tokens 0: the answer is the prompt alone (its text and log-probabilities); the one
    # token the engine sampled is left out of it, counted in usage and token ids as vLLM counts it.
    prompt_only: bool = False


@dataclass(frozen=True)
class OutputOptions:
    top_logprobs: int | None = None  # None: no log-probabilities
    return_token_ids: bool = False
    tools: ToolMode | None = None
    reasoning: ReasoningParser | None = None  # splits the model's thinking from its answer (chat)
    # The field a constraint came from, named when the engine rejects the constraint.
    constraint_param: str | None = None
    prompt_logprobs: bool = False  # the answer carries `prompt_logprobs`
    tokens_as_ids: bool = False  # log-probability tokens named "token_id:<id>"
    role: str = "assistant"  # chat: the answer's role
    # Chat with a reasoning parser and `include_reasoning: false`: the reasoning
    # is dropped, and with it logprobs and token ids, which would carry it.
    hide_reasoning: bool = False
    stream_interval: int = 1  # tokens an SSE event waits for, between a choice's first and last
    # Chat: the template's variables (chat_template_kwargs and the request's own), which a reasoning format may read.
    template_variables: tuple[tuple[str, Any], ...] = ()
    prompt_text: str | None = None  # chat with return_prompt_text: the rendered template, in the answer


@dataclass(frozen=True)
class PreparedRequest:
    endpoint: Endpoint
    header: ResponseHeader
    choices: tuple[ChoicePlan, ...]
    prompts: tuple[tuple[int, ...], ...]
    stream: bool
    include_usage: bool
    arrival: float
    # stream_options continuous_usage_stats (with include_usage): every event carries its choice's usage so far.
    continuous_usage: bool = False
    options: OutputOptions = OutputOptions()
    # What the body claims of its traffic class (orchestrator/traffic): `slo_class` and vLLM's `priority`.
    slo_class: str | None = None
    priority: int = 0
    # The class and tenant it was admitted as (set at admission); None before, or with no classes configured.
    traffic: Resolved | None = None
