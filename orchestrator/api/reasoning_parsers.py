"""A reasoning model's thinking, split from its answer (`model.reasoning_parser`).

A registry keyed by format name: the formats below are read here; any other
name is looked up in the engine's own registry (vLLM's `--reasoning-parser`
names, orchestrator/engines/vllm_reasoning_parsers.py). A parser makes one
splitter per choice (from the request's template variables and the prompt);
the splitter turns the choice's output into (reasoning, content). The same
`split` serves whole and streamed answers: a stream calls it as the output
grows and sends the growth of each part, with `final=False` holding back a
suffix that could still become a tag.

    think (deepseek_r1, qwen3): [<think>] reasoning </think> content
        as vLLM's BaseThinkingReasoningParser.extract_reasoning
        (vllm/reasoning/basic_parsers.py): the start tag is optional (the
        chat template may have written it), text without an end tag is all
        reasoning, and an empty content is None. qwen3 as vLLM's qwen3
        parser: `enable_thinking: false` in the template variables turns
        thinking off, and all the output is content.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.api.partial_tags import held_back


class ReasoningSplitter(Protocol):
    def split(self, text: str, token_ids: Sequence[int], final: bool = True) -> tuple[str | None, str | None]:
        """(reasoning, content) of one choice's output so far (`text`, its `token_ids`); not `final`:
        what is certain so far. Called with the output as it grows, the last call `final`."""
        ...


class ReasoningParser(Protocol):
    # The format's tags are special tokens in some tokenizers: the engine must keep them in the text.
    keeps_special_tokens: bool

    def splitter(self, template_variables: Mapping[str, Any], prompt_token_ids: Sequence[int]) -> ReasoningSplitter:
        """The splitter of one choice of a request (its chat template's variables, its prompt)."""
        ...


@dataclass(frozen=True)
class AllContent:
    """Thinking turned off: the whole output is the answer."""

    def split(self, text: str, token_ids: Sequence[int] = (), final: bool = True) -> tuple[str | None, str | None]:
        return None, text or None


@dataclass(frozen=True)
class ThinkParser:
    start: str = "<think>"
    end: str = "</think>"
    obeys_enable_thinking: bool = False  # `enable_thinking: false` turns thinking off (qwen3)
    keeps_special_tokens: bool = False

    def splitter(self, template_variables: Mapping[str, Any], prompt_token_ids: Sequence[int]) -> ReasoningSplitter:
        if self.obeys_enable_thinking and template_variables.get("enable_thinking") is False:
            return AllContent()
        return self

    def split(self, text: str, token_ids: Sequence[int] = (), final: bool = True) -> tuple[str | None, str | None]:
        before, tag, after = text.partition(self.start)
        if tag:
            text = after
        elif not final and self.start.startswith(before):
            return None, None  # the start tag may still be coming
        reasoning, tag, content = text.partition(self.end)
        if not tag:
            if not final:
                reasoning = reasoning[: len(reasoning) - held_back(reasoning, self.end)]
            return reasoning or None, None
        return reasoning or None, content or None


# The formats read here; any other name is the engine's (orchestrator.engines.reasoning_parser).
PARSERS: dict[str, ReasoningParser] = {
    "deepseek_r1": ThinkParser(),
    "qwen3": ThinkParser(obeys_enable_thinking=True),
}
