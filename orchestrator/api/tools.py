"""Tool calls as vLLM's server makes them for `tool_choice` "required" or a named function.

The output is constrained (structured decoding) to what the choice allows, and
the tool calls are read back from the constrained text:

    named f     -> constraint: f's parameters schema;   calls: [f(text)]         finish "stop"
    "required"  -> constraint: [{name, parameters}, ...] (anyOf the tools);
                   calls: one per item                                          finish "tool_calls"
                   (an output that is no such list, cut by max_tokens: no calls and no content;
                   whole, `tool_calls: []` and "tool_calls" where the engine stopped; streamed,
                   nothing and the engine's finish, as vLLM streams only the list's calls)

Both follow vLLM 0.32 (`vllm/tool_parsers/utils.py::get_json_schema_from_tools`
and `chat_completion/serving.py`); they are restated here because the frontend
does not import an engine. "auto" reads the calls from free text with the
model's format (`orchestrator/api/tool_parsers.py`, `model.tool_call_parser`);
without one it is a 400, as vLLM's own server without `--tool-call-parser`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from orchestrator.api.protocol import NamedToolChoice, Tool
from orchestrator.api.tool_parsers import ToolCallParser, tool_call
from orchestrator.messages import StructuredKind, StructuredOutput

_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolMode:
    """How a chat request's output becomes tool calls; None of it for "none"."""

    named: str | None  # the function a named choice forces
    constraint: StructuredOutput | None  # named and "required": what the output is held to
    parser: ToolCallParser | None = None  # "auto": the model's format, read from free text
    tools: tuple[Tool, ...] = ()  # "auto": the request's tools, which the parser may read

    def message(self, text: str) -> tuple[str, list[dict[str, Any]] | None]:
        """(content, tool calls) of a finished output; calls None when it holds no whole call ("auto"), [] when
        a "required" output is no list of calls (vLLM's `TypeAdapter(list[FunctionDefinition])` failing)."""
        if self.parser is not None:
            content, calls = self.parser.parse(text, self.tools)
            return (content, calls) if calls else (text, None)
        if self.named is not None:
            return "", [tool_call(self.named, text)]
        try:
            items = json.loads(text)
            return "", [tool_call(i["name"], json.dumps(i["parameters"], ensure_ascii=False)) for i in items]
        except (ValueError, KeyError, TypeError):  # cut by length
            return "", []

    def finish_reason(self, engine_reason: str | None, called: bool) -> str | None:
        """As vLLM: "tool_calls" when auto found calls or required stopped; named keeps "stop"."""
        if called and self.named is None and (self.parser is not None or engine_reason == "stop"):
            return "tool_calls"
        return engine_reason


def _required_schema(tools: list[Tool], parallel: bool | None) -> dict[str, Any]:
    items = [
        {
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                "parameters": t.function.parameters or _EMPTY_OBJECT,
            },
            "required": ["name", "parameters"],
        }
        for t in tools
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": items}}
    if parallel is False:
        schema["maxItems"] = 1
    return schema


def tool_mode(
    tools: list[Tool] | None,
    choice: str | NamedToolChoice,
    parallel: bool | None = None,
    parser: ToolCallParser | None = None,
) -> ToolMode | None:
    """How the output becomes calls; None for "none". "auto" needs the model's `parser`
    (ValueError without one, as vLLM's server without `--tool-call-parser`)."""
    if not tools or choice == "none":
        return None
    if choice == "auto":
        if parser is None:
            raise ValueError('tool_choice "auto" needs model.tool_call_parser in the config')
        return ToolMode(None, None, parser, tuple(tools))
    if isinstance(choice, NamedToolChoice):
        tool = next(t for t in tools if t.function.name == choice.function.name)
        schema = tool.function.parameters or _EMPTY_OBJECT
        return ToolMode(tool.function.name, StructuredOutput(StructuredKind.JSON, json.dumps(schema)))
    return ToolMode(None, StructuredOutput(StructuredKind.JSON, json.dumps(_required_schema(tools, parallel))))


def template_tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    """Tools as vLLM's server gives them to chat templates (its ChatCompletionToolsParam dumped): a
    function's description and parameters always there (None when not given), `strict` and
    `defer_loading` only when set, a tool's `defer_loading` also its function's unless that sets its own."""
    return [_template_tool(t) for t in tools] if tools else None


def _template_tool(tool: Tool) -> dict[str, Any]:
    f = tool.function
    defer = f.defer_loading if f.defer_loading is not None else tool.defer_loading
    function = {"name": f.name, "description": f.description, "parameters": f.parameters}
    function |= {k: v for k, v in (("strict", f.strict), ("defer_loading", defer)) if v is not None}
    out: dict[str, Any] = {"type": tool.type, "function": function}
    return out | ({"defer_loading": tool.defer_loading} if tool.defer_loading is not None else {})
