"""Tool calls as vLLM's server makes them for `tool_choice` "required" or a named function.

The output is constrained (structured decoding) to what the choice allows, and
the tool calls are read back from the constrained text:

    named f     -> constraint: f's parameters schema;   calls: [f(text)]         finish "stop"
    "required"  -> constraint: [{name, parameters}, ...] (anyOf the tools);
                   calls: one per item                                          finish "tool_calls"

Both follow vLLM 0.32 (`vllm/tool_parsers/utils.py::get_json_schema_from_tools`
and `chat_completion/serving.py`); they are restated here because the frontend
does not import an engine. "auto" needs a model-specific parser of free text
and is not served here (a 400, as vLLM's own server without
`--tool-call-parser` gives).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from orchestrator.api.protocol import NamedToolChoice, Tool
from orchestrator.messages import StructuredKind, StructuredOutput

_EMPTY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolMode:
    """How a chat request's output becomes tool calls; None of it for "none"."""

    named: str | None  # the function a named choice forces; None: "required"
    constraint: StructuredOutput

    def calls(self, text: str) -> list[dict[str, Any]] | None:
        """The tool calls in a finished output; None when it is not a whole call (cut by length)."""
        if self.named is not None:
            return [_call(self.named, text)]
        try:
            items = json.loads(text)
        except ValueError:
            return None
        try:
            return [_call(i["name"], json.dumps(i["parameters"], ensure_ascii=False)) for i in items]
        except (KeyError, TypeError):
            return None

    def finish_reason(self, engine_reason: str | None) -> str | None:
        return "tool_calls" if self.named is None and engine_reason == "stop" else engine_reason


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


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


def tool_mode(tools: list[Tool] | None, choice: str | NamedToolChoice, parallel: bool | None = None) -> ToolMode | None:
    """The constraint and reading of a "required" or named choice; None for "none" (and "auto",
    which the caller refuses)."""
    if not tools or choice in ("none", "auto"):
        return None
    if isinstance(choice, NamedToolChoice):
        tool = next(t for t in tools if t.function.name == choice.function.name)
        schema = tool.function.parameters or _EMPTY_OBJECT
        return ToolMode(tool.function.name, StructuredOutput(StructuredKind.JSON, json.dumps(schema)))
    return ToolMode(None, StructuredOutput(StructuredKind.JSON, json.dumps(_required_schema(tools, parallel))))


def template_tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    """Tools as chat templates read them (the request's own JSON)."""
    return [t.model_dump(exclude_none=True) for t in tools] if tools else None
