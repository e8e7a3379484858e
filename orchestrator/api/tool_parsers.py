"""Tool calls read from a model's free text (`tool_choice: "auto"`), by the
format the model was trained on, named in the config (`model.tool_call_parser`).

A registry keyed by format name: the formats below are read here; any other
name is looked up in the engine's own registry (vLLM's `--tool-call-parser`
names, orchestrator/engines/vllm_tool_parsers.py). Each parser reads a whole
output into (content, calls), and names the openers a call begins with: a
stream lets content through until one appears (orchestrator/api/call_opener.py).

    hermes: content <tool_call>{"name": ..., "arguments": {...}}</tool_call> ...
            (Hermes 2 Pro, Qwen 2.5 / Qwen 3; as vLLM's `hermes` parser,
            vllm/tool_parsers/hermes_tool_parser.py: the same tags, content is
            the text before the first tag, an unclosed last tag is read to the
            end, any JSON that does not parse leaves the whole text as content)
    llama3_json: [<|python_tag|>]{"name": ..., "parameters": {...}}; {...}
            (Llama 3.1-3.3 and 4's JSON tool format, also "llama4_json"; as vLLM's
            Llama3JsonToolParser, vllm/tool_parsers/llama_tool_parser.py: every
            JSON object not inside an earlier one is a call ("parameters" or
            "arguments"), the text around the calls is dropped; an object that
            does not parse or lacks a name leaves the whole text as content.
            Streamed, an output that does not begin with the tag or "{" is
            content as it comes, as in vLLM)
    pythonic: [get_weather(city="Oslo", days=3), get_time()]
            (Llama 3.2 and 4, ToolACE; as vLLM's PythonicToolParser,
            vllm/tool_parsers/pythonic_tool_parser.py and utils.py: the whole
            output matches its pattern and parses as a Python list of calls with
            literal keyword arguments (tuples and sets become lists, null / true /
            false are read as JSON's, dotted names kept); anything else is
            content. Streamed, an output that does not begin with "[" is content)
"""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.api.protocol import Tool


def tool_call(name: str, arguments: str) -> dict[str, Any]:
    """One OpenAI tool call, with an id as vLLM makes them."""
    return {
        "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


class ToolCallParser(Protocol):
    # Tags of the format are special tokens in some tokenizers: the engine must keep them in the text.
    keeps_special_tokens: bool

    def parse(self, text: str, tools: Sequence[Tool]) -> tuple[str, list[dict[str, Any]]]:
        """(content, tool calls) of a whole output, given the request's tools (some formats read
        argument types from their schemas); no calls when it holds none that parse."""
        ...

    # What a call begins with. Anchored: a call is the output's beginning or there is none;
    # else the first opener anywhere begins one. None: a call may begin anywhere, unmarked.
    openers: tuple[str, ...] | None
    anchored: bool


@dataclass(frozen=True)
class HermesParser:
    open_tag: str = "<tool_call>"
    close_tag: str = "</tool_call>"
    keeps_special_tokens: bool = True
    anchored: bool = False

    @property
    def openers(self) -> tuple[str, ...]:
        return (self.open_tag,)

    def _calls(self, text: str) -> list[dict[str, Any]]:
        pattern = (
            re.escape(self.open_tag) + r"(.*?)" + re.escape(self.close_tag) + "|" + re.escape(self.open_tag) + "(.*)"
        )
        calls = []
        for closed, unclosed in re.findall(pattern, text, re.DOTALL):
            call = json.loads(closed or unclosed)
            calls.append(tool_call(call["name"], json.dumps(call["arguments"], ensure_ascii=False)))
        return calls

    def parse(self, text: str, tools: Sequence[Tool] = ()) -> tuple[str, list[dict[str, Any]]]:
        begin = text.find(self.open_tag)
        if begin < 0:
            return text, []
        try:
            return text[:begin], self._calls(text)
        except (ValueError, KeyError, TypeError):
            return text, []


@dataclass(frozen=True)
class Llama3JsonParser:
    bot_token: str = "<|python_tag|>"
    keeps_special_tokens: bool = False  # vLLM's parser leaves the engine's default (the tag may be skipped)
    anchored: bool = True  # streamed, an output that does not begin with the tag or "{" is content (vLLM's)

    @property
    def openers(self) -> tuple[str, ...]:
        return (self.bot_token, "{")

    def parse(self, text: str, tools: Sequence[Tool] = ()) -> tuple[str, list[dict[str, Any]]]:
        if self.bot_token not in text and "{" not in text:
            return text, []
        decoder = json.JSONDecoder()
        calls: list[dict[str, Any]] = []
        end = -1  # where the last object read ends: braces before it are inside it
        for brace in re.finditer(r"\{", text):
            if brace.start() <= end:
                continue
            try:
                obj, length = decoder.raw_decode(text[brace.start() :])
                end = brace.start() + length
                arguments = obj["arguments"] if "arguments" in obj else obj["parameters"]
                calls.append(tool_call(obj["name"], json.dumps(arguments, ensure_ascii=False)))
            except (ValueError, KeyError, TypeError):
                return text, []
        return ("", calls) if calls else (text, [])


_IDENTIFIER = re.compile(r"[a-zA-Z]\w*")
_CLOSE = re.compile(r"\)\s*\]")
_BLANKS = re.compile(r"\s*")


def _looks_pythonic(text: str) -> bool:
    """Whether vLLM's PythonicToolParser.TOOL_CALL_REGEX matches at the start of `text`, decided in one pass.

    That pattern nests `.*` under repeats and backtracks exponentially on a long output that almost matches
    (20 arguments: ~1 s; vLLM bounds it with a timeout); on this server it would stall the event loop.
    What it accepts: "[" then calls `name(` (names start with a letter); a call with no arguments `name()`
    is followed by "," and blanks (only while no call so far was followed by blanks alone) or by blanks,
    and the list may end there with "]"; a call whose arguments begin `name=` can absorb everything up to
    any later ")" + blanks + "]", so the text matches iff one follows.
    (tests/unit/test_tool_parsers.py checks this against vLLM's pattern on generated texts.)"""
    if not text.startswith("["):
        return False
    pos, commas = 1, True
    while (name := _IDENTIFIER.match(text, pos)) and text.startswith("(", name.end()):
        pos = name.end() + 1
        argument = _IDENTIFIER.match(text, pos)
        if argument and text.startswith("=", argument.end()):
            return _CLOSE.search(text, argument.end()) is not None
        if not text.startswith(")", pos):
            return False
        pos += 1
        if commas and text.startswith(",", pos):
            pos = _BLANKS.match(text, pos + 1).end()
            continue
        commas = False
        pos = _BLANKS.match(text, pos).end()
        if text.startswith("]", pos):
            return True
    return False


_JSON_NAMES = {"null": None, "true": True, "false": False}


def _literal(node: ast.expr) -> Any:
    """A keyword argument's value as vLLM's `get_parameter_value` reads it; ValueError for anything else."""
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, int, float))):
        return node.value
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
        return {k.value: _literal(v) for k, v in zip(node.keys, node.values)}  # type: ignore[union-attr]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_literal(v) for v in node.elts]
    if isinstance(node, ast.JoinedStr) and all(isinstance(part, ast.Constant) for part in node.values):
        return "".join(str(part.value) for part in node.values)  # type: ignore[attr-defined]
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _literal(node.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    raise ValueError(f"not a literal: {ast.dump(node)[:80]}")


def _dotted_name(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise ValueError("a call's name must be a name or a dotted name")
    return ".".join([node.id, *reversed(parts)])


@dataclass(frozen=True)
class PythonicParser:
    keeps_special_tokens: bool = False
    openers: tuple[str, ...] = ("[",)
    anchored: bool = True

    def parse(self, text: str, tools: Sequence[Tool] = ()) -> tuple[str, list[dict[str, Any]]]:
        if not _looks_pythonic(text):
            return text, []
        try:
            listed = getattr(ast.parse(text).body[0], "value", None)
            if not isinstance(listed, ast.List) or not all(isinstance(e, ast.Call) for e in listed.elts):
                return text, []
            calls = [
                tool_call(
                    _dotted_name(call.func),
                    json.dumps({kw.arg: _literal(kw.value) for kw in call.keywords}, ensure_ascii=False),
                )
                for call in listed.elts
            ]
        except (SyntaxError, ValueError, IndexError, RecursionError):
            return text, []
        return "", calls


# The formats read here; any other name is the engine's (orchestrator.engines.tool_call_parser).
PARSERS: dict[str, ToolCallParser] = {
    "hermes": HermesParser(),
    "llama3_json": Llama3JsonParser(),
    "llama4_json": Llama3JsonParser(),
    "pythonic": PythonicParser(),
}
