"""A reasoning model's thinking, split from its answer (`model.reasoning_parser`).

A registry keyed by format name: the formats below are read here; any other
name is looked up in the engine's own registry (vLLM's `--reasoning-parser`
names, orchestrator/engines/vllm_reasoning_parsers.py). A parser makes one
splitter per choice (from the request's template variables and the prompt).
A whole answer is read at once (`split`); a streamed one piece by piece
(`feed`), each piece read once: the splitter carries its state from piece to
piece and holds back only a suffix that could still become a tag, so a
stream's cost is linear in its length. Fed in any split, the pieces add up to
what `split` gives the whole output (tests/unit/test_reasoning_parsers.py).

    think (deepseek_r1, qwen3): [<think>] reasoning </think> content
        as vLLM's BaseThinkingReasoningParser.extract_reasoning
        (vllm/reasoning/basic_parsers.py): the start tag is optional (the
        chat template may have written it), text without an end tag is all
        reasoning, and an empty content is None. qwen3 as vLLM's qwen3
        parser: `enable_thinking: false` in the template variables turns
        thinking off, and all the output is content.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.api.partial_tags import held_back


class ReasoningSplitter(Protocol):
    """One choice's reader; it reads either a whole output (`split`) or a stream (`feed`), not both."""

    def split(self, text: str, token_ids: Sequence[int]) -> tuple[str | None, str | None]:
        """(reasoning, content) of a whole output; None for an empty part."""
        ...

    def feed(self, text: str, token_ids: Sequence[int], final: bool) -> tuple[str, str]:
        """The output's next piece (`text`, its `token_ids`) in; (reasoning, content) it makes certain out.
        `final`: the output ends with this piece."""
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

    def split(self, text: str, token_ids: Sequence[int] = ()) -> tuple[str | None, str | None]:
        return None, text or None

    def feed(self, text: str, token_ids: Sequence[int] = (), final: bool = False) -> tuple[str, str]:
        return "", text


@dataclass(frozen=True)
class ThinkParser:
    start: str = "<think>"
    end: str = "</think>"
    obeys_enable_thinking: bool = False  # `enable_thinking: false` turns thinking off (qwen3)
    keeps_special_tokens: bool = False

    def splitter(self, template_variables: Mapping[str, Any], prompt_token_ids: Sequence[int]) -> ReasoningSplitter:
        if self.obeys_enable_thinking and template_variables.get("enable_thinking") is False:
            return AllContent()
        return ThinkSplitter(self.start, self.end)


class _Part(enum.Enum):
    OPENING = "opening"  # the output so far is a prefix of the start tag: undecided
    REASONING = "reasoning"
    CONTENT = "content"


class ThinkSplitter:
    """[<think>] reasoning </think> content, whole or streamed.

    Streamed, a state machine over the pieces: `held` is the only text read
    twice, and it is shorter than a tag.

        OPENING:   held + piece begins with the start tag -> REASONING after it;
                   still a proper prefix of it -> hold; else REASONING from the start
        REASONING: held + piece holds the end tag -> reasoning before it, CONTENT after;
                   else reasoning, less a suffix that may begin the end tag (held)
        CONTENT:   the piece is content

    A stream reads the start tag only at the output's beginning, where the
    documented formats write it; a whole answer drops text before a start tag
    anywhere, as vLLM's extract_reasoning does.
    """

    def __init__(self, start: str, end: str) -> None:
        self.start, self.end = start, end
        self._part = _Part.OPENING
        self._held = ""

    def split(self, text: str, token_ids: Sequence[int] = ()) -> tuple[str | None, str | None]:
        """As vLLM's extract_reasoning: text before a start tag is dropped; without an end tag all is reasoning."""
        before, tag, after = text.partition(self.start)
        reasoning, tag, content = (after if tag else before).partition(self.end)
        return reasoning or None, (content or None) if tag else None

    def feed(self, text: str, token_ids: Sequence[int] = (), final: bool = False) -> tuple[str, str]:
        text, self._held = self._held + text, ""
        if self._part is _Part.CONTENT:
            return "", text
        if self._part is _Part.OPENING:
            if text.startswith(self.start):
                text = text[len(self.start) :]
            elif self.start.startswith(text) and not final:
                self._held = text
                return "", ""
            self._part = _Part.REASONING
        reasoning, tag, content = text.partition(self.end)
        if tag:
            self._part = _Part.CONTENT
            return reasoning, content
        keep = 0 if final else held_back(reasoning, self.end)
        self._held = reasoning[len(reasoning) - keep :] if keep else ""
        return reasoning[: len(reasoning) - keep], ""


# The formats read here; any other name is the engine's (orchestrator.engines.reasoning_parser).
PARSERS: dict[str, ReasoningParser] = {
    "deepseek_r1": ThinkParser(),
    "qwen3": ThinkParser(obeys_enable_thinking=True),
}
