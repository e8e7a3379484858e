"""vLLM's own tool-call parsers (its `--tool-call-parser` registry, vllm/tool_parsers)
behind the frontend's `ToolCallParser`, for the formats the frontend does not read
itself (mistral, qwen3_coder, deepseek_v3, kimi_k2, glm45, granite, xlam, ...).

    parse(text, tools)   = vLLM's parser made per request as vLLM's server makes it
                           (the tokenizer, the request's tools), then
                           extract_tool_calls(text, a vLLM request holding those tools)
    keeps_special_tokens = the parser's own adjust_request turns skip_special_tokens off
    openers              = what begins a call anywhere in the output: the terminals of its
                           grammar that lead from content into a call (vLLM's engine-based
                           parsers), else its `tool_calls_start_token`, `tool_call_start_token`
                           or `bot_token`; a format with none (None) holds the whole streamed
                           output until the finish, then reads it

Streamed, the calls come whole with the finish, as for the frontend's own formats
(vLLM's server streams each call's arguments as they grow). vLLM is imported when a
parser is made (in the frontend's process), not with this module.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.api.protocol import Tool
from orchestrator.prompts import Tokenizer

if TYPE_CHECKING:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.tool_parsers import ToolParser

log = logging.getLogger(__name__)

_MARKER_ATTRIBUTES = ("tool_calls_start_token", "tool_call_start_token", "bot_token")
# A tool any format can be asked about, to learn how the parser adjusts a request.
_PROBE_TOOL = Tool.model_validate({"type": "function", "function": {"name": "probe", "parameters": {}}})


def _call_openers(parser: ToolParser) -> tuple[str, ...]:
    """The strings that begin a call in the parser's format (see the module's docstring)."""
    from vllm.parser.engine.parser_engine_config import ParserState

    config = getattr(getattr(parser, "_parser_engine", None), "parser_engine_config", None)
    if config is not None:
        spellings: list[str] = []
        for (state, terminal), transition in config.transitions.items():
            if state is ParserState.CONTENT and transition.next_state not in (
                ParserState.CONTENT,
                ParserState.REASONING,
            ):
                value = config.terminals.get(terminal) or ()
                spellings.extend([value] if isinstance(value, str) else value)
        return tuple(dict.fromkeys(s for s in spellings if s))
    for attribute in _MARKER_ATTRIBUTES:
        if isinstance(marker := getattr(parser, attribute, None), str) and marker:
            return (marker,)
    return ()


def names() -> list[str]:
    """Every `--tool-call-parser` name of this vLLM."""
    from vllm.tool_parsers import ToolParserManager

    return ToolParserManager.list_registered()


def chat_request(
    tools: Sequence[Tool] = (), template_variables: Mapping[str, Any] | None = None
) -> ChatCompletionRequest:
    """The part of a chat request vLLM's output parsers read: the tools (tool_choice "auto") and the
    chat template's variables."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(
        model="",
        messages=[{"role": "user", "content": ""}],
        tools=[t.model_dump(exclude_none=True) for t in tools] or None,
        tool_choice="auto" if tools else None,
        chat_template_kwargs=dict(template_variables or {}),
    )


class VllmToolParser:
    """One vLLM tool-call format. ValueError when vLLM has no parser of that name or the
    tokenizer lacks the format's special tokens (the parser refuses to start)."""

    def __init__(self, name: str, tokenizer: Tokenizer) -> None:
        from vllm.tokenizers.hf import get_cached_tokenizer
        from vllm.tool_parsers import ToolParserManager

        try:
            self._parser_class: type[ToolParser] = ToolParserManager.get_tool_parser(name)
        except KeyError:
            raise ValueError(f"vLLM has no tool-call parser {name!r}; known: {', '.join(names())}") from None
        self.name = name
        # Its vocabulary read once: parsers look their tokens up in it each time one is made.
        self._tokenizer = get_cached_tokenizer(tokenizer)
        probe_request = chat_request([_PROBE_TOOL])
        probe = self._new(probe_request)
        self.keeps_special_tokens: bool = not probe.adjust_request(probe_request).skip_special_tokens
        self.openers: tuple[str, ...] | None = _call_openers(probe) or None
        self.anchored = False
        try:
            probe.extract_tool_calls("", probe_request)
        except NotImplementedError:  # e.g. "openai": vLLM reads gpt-oss calls from Harmony tokens, not text
            raise ValueError(f"vLLM's tool-call parser {name!r} does not read calls from text") from None

    def _new(self, request: ChatCompletionRequest) -> ToolParser:
        try:
            return self._parser_class(self._tokenizer, request.tools)
        except RuntimeError as e:  # the tokenizer lacks the format's tokens
            raise ValueError(f"tool-call parser {self.name!r} cannot read this model's output: {e}") from None

    def parse(self, text: str, tools: Sequence[Tool]) -> tuple[str, list[dict[str, Any]]]:
        request = chat_request(tools)
        try:
            found = self._new(request).extract_tool_calls(text, request)
        except Exception:  # a parser's bug on odd output: the answer stays content
            log.exception("vLLM tool-call parser %r failed on an output; returned as content", self.name)
            return text, []
        if not found.tools_called or not found.tool_calls:
            return text, []
        calls = [
            {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
            for c in found.tool_calls
        ]
        return found.content or "", calls
