"""A reasoning model's thinking, split from its answer (`model.reasoning_parser`).

A registry keyed by format name; each parser splits an output's text into
(reasoning, content). The same `split` serves whole and streamed answers: a
stream sends the growth of each part, with `final=False` holding back a
suffix that could still become a tag.

    think (deepseek_r1, qwen3): [<think>] reasoning </think> content
        as vLLM's BaseThinkingReasoningParser.extract_reasoning
        (vllm/reasoning/basic_parsers.py): the start tag is optional (the
        chat template may have written it), text without an end tag is all
        reasoning, and an empty content is None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from orchestrator.api.partial_tags import held_back


class ReasoningParser(Protocol):
    def split(self, text: str, final: bool = True) -> tuple[str | None, str | None]:
        """(reasoning, content) of `text`; not `final`: what is certain so far."""
        ...


@dataclass(frozen=True)
class ThinkParser:
    start: str = "<think>"
    end: str = "</think>"

    def split(self, text: str, final: bool = True) -> tuple[str | None, str | None]:
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


PARSERS: dict[str, ReasoningParser] = {"deepseek_r1": ThinkParser(), "qwen3": ThinkParser()}


def parser(name: str) -> ReasoningParser:
    try:
        return PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; known: {sorted(PARSERS)}") from None
