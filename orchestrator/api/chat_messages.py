"""Chat messages as vLLM's server hands them to the model's chat template.

vLLM 0.32 (vllm/renderers/chat_utils.py `_parse_chat_message_content`,
`_postprocess_messages`; vllm/renderers/hf.py `safe_apply_chat_template`):

    content      the text parts (text, input_text, output_text, refusal, thinking; bare strings too)
                 joined by "\\n"; for a template that iterates over a message's parts
                 (`TemplateTraits.as_parts`, vLLM's "openai" content format) the parts as
                 [{"type": "text", "text": ..., <the part's other keys>}], a string content as one
                 such part, a tool message's parts joined all the same; no content is "" (or [])
    reasoning    an assistant's `reasoning` (or its older name `reasoning_content`) under both names,
                 for templates that show earlier turns' thinking
    tool_calls   arguments as objects (a string that is not a JSON object becomes {}); none: no key
    name, tool_call_id   kept; a developer message's `tools` None (vLLM's place for gpt-oss's)
    developer    when the template never names the "developer" role (`TemplateTraits.developer_role`):
                 each developer message becomes a system one, and the system messages are merged into
                 one first message ("\\n\\n" between)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.api.protocol import ChatMessage, ContentPart, ToolCall
from orchestrator.chat_template_format import iterates_content_parts


@dataclass(frozen=True)
class TemplateTraits:
    """What of a chat template decides how messages are given to it."""

    as_parts: bool = False  # it iterates over a message's content parts (vLLM's "openai" content format)
    developer_role: bool = True  # it knows the "developer" role

    @classmethod
    def of(cls, template: str | None) -> TemplateTraits:
        if template is None:
            return cls()
        # vLLM's `_detect_developer_role_support`: the template spells the role out.
        developer = '"developer"' in template or "'developer'" in template
        return cls(as_parts=iterates_content_parts(template), developer_role=developer)


def content_text(message: ChatMessage) -> str:
    """The message's text parts as one string ("" for none)."""
    content = message.content
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(_part_text(p) for p in content)


def template_messages(
    messages: Sequence[ChatMessage], traits: TemplateTraits = TemplateTraits()
) -> list[dict[str, Any]]:
    """The conversation the chat template renders (see the module's docstring)."""
    conversation = [_template_message(m, traits.as_parts) for m in messages]
    if not traits.developer_role and any(m["role"] == "developer" for m in conversation):
        conversation = _merged_system(conversation)
    return conversation


def _part_text(part: ContentPart | str) -> str:
    return part if isinstance(part, str) else part.value()


def _content(message: ChatMessage, as_parts: bool) -> str | list[dict[str, Any]]:
    content = message.content
    if not as_parts or message.role == "tool":
        return content_text(message)
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [
        {"type": "text", "text": part}
        if isinstance(part, str)
        else {"type": "text", "text": part.value(), **(part.model_extra or {})}
        for part in content
    ]


def _template_message(m: ChatMessage, as_parts: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": _content(m, as_parts)}
    if m.role == "assistant" and m.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": c.type, "function": {"name": c.function.name, "arguments": _arguments(c)}}
            | (c.model_extra or {})
            for c in m.tool_calls
        ]
    reasoning = m.reasoning if m.reasoning is not None else m.reasoning_content
    if m.role == "assistant" and reasoning is not None:
        out["reasoning"] = out["reasoning_content"] = reasoning
    if m.role == "tool" and m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    if m.role == "developer":
        out["tools"] = None  # where vLLM puts a developer message's own tools (gpt-oss's); none here
    return out


def _arguments(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as the object templates read; {} for a string that is not one (as vLLM: a
    malformed call in the history must not fail every later turn)."""
    try:
        parsed = json.loads(call.function.arguments) if call.function.arguments else {}
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _merged_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Developer messages as system ones, and the system messages merged into one first message
    when there is more than one or one not first (vLLM's `_convert_developer_to_system` and
    `_consolidate_system_messages`)."""
    converted = [_as_system(m) if m["role"] == "developer" else m for m in conversation]
    systems = [i for i, m in enumerate(converted) if m["role"] == "system"]
    if systems in ([], [0]):
        return converted
    texts = [_as_text(converted[i]["content"]) for i in systems]
    merged = {"role": "system", "content": "\n\n".join(t for t in texts if t)}
    return [merged, *(m for m in converted if m["role"] != "system")]


def _as_system(developer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in developer.items() if k != "tools"} | {"role": "system"}


def _as_text(content: str | list[dict[str, Any]]) -> str:
    return content if isinstance(content, str) else "\n".join(p["text"] for p in content)
