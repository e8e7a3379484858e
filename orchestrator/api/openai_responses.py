"""OpenAI's Responses API (`POST /v1/responses`) on the chat path, as vLLM 0.32's server serves it for a model
without Harmony (`vllm/entrypoints/openai/responses`): a Responses request becomes the chat request that says
the same, so one preparation path (template, sampling, tools, reasoning, structured outputs) and one request
path (routing, P/D, admission, migration, metrics) serve both; the chat answer becomes a response object.

    request  instructions -> a system message; then the previous turn's conversation (its messages but the
             system ones, then its output: each message's text as an assistant message, each function call
             as an assistant tool call); then `input`: text -> a user message; items: messages (text parts),
             function_call -> an assistant's tool_calls (merged into the assistant message before it),
             function_call_output -> a tool message, reasoning -> an assistant's `reasoning`. A last assistant
             message `in_progress` or `incomplete` is continued (continue_final_message).
             tools (function) -> chat tools; tool_choice as chat's (a named one -> chat's named form; "auto"
             with no tool-call parser -> "none", as vLLM answers it);
             text.format -> response_format; reasoning.effort -> reasoning_effort; max_output_tokens ->
             max_tokens; include message.output_text.logprobs -> logprobs (top_logprobs); vLLM's sampling
             and engine fields (top_k, seed, stop, ...) as they are
    answer   reasoning -> a reasoning item; content -> a message item (output_text, with logprobs if asked);
             tool calls -> function_call items. finish length -> status incomplete (max_output_tokens)
    usage    input_tokens (cached_tokens), output_tokens, total_tokens

One difference from vLLM, where vLLM drops what a client needs: a previous turn's function calls are carried
into the next turn (vLLM carries its message items alone, so the tool's output that follows answers no call).

Not served (a 400 naming the field): tools other than functions, `prompt` templates, `conversation`, input
items other than the above (images, files, item references, built-in tool calls), encrypted reasoning.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.api.errors import APIError, from_validation_error

LOGPROBS_INCLUDE = "message.output_text.logprobs"
# vLLM's own fields, handed to the chat request as they are (it validates them, under the same names).
CHAT_FIELDS = (
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "logit_bias",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "cache_salt",
    "priority",
    "chat_template_kwargs",
    "vllm_xargs",
    "structured_outputs",
    "include_reasoning",
    "slo_class",
)


class _Open(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Open):
    """A message's text part; annotations and logprobs a client sends back with an output text are ignored."""

    type: Literal["input_text", "output_text", "text"]
    text: str


class MessageItem(_Open):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[TextPart]
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def texts(self) -> list[str]:
        return [self.content] if isinstance(self.content, str) else [p.text for p in self.content]


class FunctionCallItem(_Open):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(_Open):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[TextPart]

    def text(self) -> str:
        return self.output if isinstance(self.output, str) else "".join(p.text for p in self.output)


class ReasoningText(_Open):
    text: str


class ReasoningItem(_Open):
    type: Literal["reasoning"]
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def text(self) -> str:
        # vLLM's: the first content text, else the first summary text.
        if self.content:
            return self.content[0].text
        return self.summary[0].text if self.summary else ""


INPUT_ITEMS = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


class FunctionTool(_Open):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class NamedToolChoice(_Closed):
    type: Literal["function"]
    name: str


class TextFormat(_Open):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(_Open):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(_Open):
    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(_Closed):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    top_p: float | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] = []
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice = "auto"
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: ReasoningConfig | None = None
    include: list[str] | None = None
    previous_response_id: str | None = None
    store: bool = True
    background: bool = False
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    metadata: dict[str, str] | None = None
    user: str | None = None
    max_tool_calls: int | None = Field(default=None, ge=1)
    # Accepted and unused, as vLLM's server: what they ask of OpenAI's service changes nothing in the answer.
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    # Refused below: not served.
    prompt: dict[str, Any] | None = None
    conversation: Any = None
    # vLLM's own fields (CHAT_FIELDS), validated by the chat request they are handed to.
    top_k: Any = None
    min_p: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    repetition_penalty: Any = None
    seed: Any = None
    stop: Any = None
    stop_token_ids: Any = None
    ignore_eos: Any = None
    logit_bias: Any = None
    skip_special_tokens: Any = None
    include_stop_str_in_output: Any = None
    cache_salt: Any = None
    priority: Any = None
    chat_template_kwargs: Any = None
    vllm_xargs: Any = None
    structured_outputs: Any = None
    include_reasoning: Any = None
    slo_class: Any = None

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS_INCLUDE in (self.include or [])


@dataclass(frozen=True)
class PreviousTurn:
    """What a stored response gives the turn that continues it: its conversation and its output items."""

    messages: list[dict[str, Any]]
    output: list[dict[str, Any]]


def parse(body: bytes) -> ResponsesRequest:
    """The Responses request in `body` (APIError 400 naming the field where it is not one this server serves)."""
    try:
        req = ResponsesRequest.model_validate_json(body)
    except ValidationError as e:
        raise from_validation_error(e) from None
    for name in ("prompt", "conversation"):
        if getattr(req, name) is not None:
            raise APIError(400, f"{name}: not served by this server's Responses API", param=name)
    for i, tool in enumerate(req.tools):
        if tool.get("type") != "function":
            where = f"tools.{i}.type"
            raise APIError(400, f"{where}: {tool.get('type')} tools are not served by this server", param=where)
        try:
            FunctionTool.model_validate(tool)
        except ValidationError as e:
            raise from_validation_error(e, f"tools.{i}.") from None
    return req


def chat_request(req: ResponsesRequest, previous: PreviousTurn | None, reads_calls: bool = True) -> dict[str, Any]:
    """The chat request that says what `req` says, continuing `previous`. `reads_calls`: the model has a tool-call
    parser; without one, tool_choice "auto" (the Responses API's default) is chat's "none", as vLLM's server
    answers it there: the tools in the prompt, the output as text."""
    messages = conversation(req, previous)
    chat: dict[str, Any] = {"messages": messages}
    if req.model is not None:
        chat["model"] = req.model
    if _continues(req.input):
        chat["add_generation_prompt"] = False
        chat["continue_final_message"] = True
    for src, dst in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p")):
        if getattr(req, src) is not None:
            chat[dst] = getattr(req, src)
    chat.update({name: getattr(req, name) for name in CHAT_FIELDS if getattr(req, name) is not None})
    if req.stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    if req.tools:
        chat["tools"] = [_chat_tool(FunctionTool.model_validate(t)) for t in req.tools]
        if isinstance(req.tool_choice, NamedToolChoice):
            chat["tool_choice"] = {"type": "function", "function": {"name": req.tool_choice.name}}
        else:
            chat["tool_choice"] = "none" if req.tool_choice == "auto" and not reads_calls else req.tool_choice
    elif req.tool_choice == "required" or isinstance(req.tool_choice, NamedToolChoice):
        raise APIError(400, "tool_choice: a tool choice other than auto or none needs tools", param="tool_choice")
    if req.parallel_tool_calls is not None:
        chat["parallel_tool_calls"] = req.parallel_tool_calls
    if req.text is not None and req.text.format is not None:
        fmt = req.text.format
        if fmt.type == "json_object":
            chat["response_format"] = {"type": "json_object"}
        elif fmt.type == "json_schema" and fmt.schema_ is not None:
            schema = {"name": fmt.name or "response", "schema": fmt.schema_}
            schema |= {k: v for k, v in (("strict", fmt.strict), ("description", fmt.description)) if v is not None}
            chat["response_format"] = {"type": "json_schema", "json_schema": schema}
    if req.reasoning is not None and req.reasoning.effort is not None:
        chat["reasoning_effort"] = req.reasoning.effort
    if req.wants_logprobs:
        chat["logprobs"] = True
        chat["top_logprobs"] = req.top_logprobs or 0
    if req.truncation == "auto":
        chat["truncate_prompt_tokens"] = -1
    return chat


def _chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    function |= {k: v for k, v in (("description", tool.description), ("parameters", tool.parameters)) if v is not None}
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def conversation(req: ResponsesRequest, previous: PreviousTurn | None) -> list[dict[str, Any]]:
    """The chat messages of `req`'s turn (vLLM's `construct_input_messages`): instructions do not carry over."""
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    if previous is not None:
        messages.extend(m for m in previous.messages if m.get("role") != "system")
        for item in previous.output:
            if item["type"] == "message":
                messages.extend({"role": "assistant", "content": part["text"]} for part in item["content"])
            elif item["type"] == "function_call":
                _append(messages, _call_message(item["call_id"], item["name"], item["arguments"]))
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
        return messages
    for i, raw in enumerate(req.input):
        _append(messages, _message(_item(raw, i)))
    return messages


def _item(raw: dict[str, Any], index: int) -> BaseModel:
    kind = raw.get("type", "message")
    model = INPUT_ITEMS.get(kind) if isinstance(kind, str) else None
    if model is None:
        where = f"input.{index}.type"
        raise APIError(400, f"{where}: input items of type {kind} are not served by this server", param=where)
    try:
        item = model.model_validate(raw)
    except ValidationError as e:
        raise from_validation_error(e, f"input.{index}.") from None
    if isinstance(item, ReasoningItem) and item.encrypted_content:
        where = f"input.{index}.encrypted_content"
        raise APIError(400, f"{where}: encrypted reasoning is not served by this server", param=where)
    return item


def _call_message(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


def _message(item: BaseModel) -> dict[str, Any]:
    if isinstance(item, FunctionCallItem):
        return _call_message(item.call_id, item.name, item.arguments)
    if isinstance(item, FunctionCallOutputItem):
        return {"role": "tool", "tool_call_id": item.call_id, "content": item.text()}
    if isinstance(item, ReasoningItem):
        return {"role": "assistant", "content": None, "reasoning": item.text()}
    assert isinstance(item, MessageItem)
    texts = item.texts()
    if item.role == "assistant":  # vLLM's: an assistant message says its first part
        return {"role": "assistant", "content": texts[0] if texts else ""}
    if isinstance(item.content, str):
        return {"role": item.role, "content": item.content}
    return {"role": item.role, "content": [{"type": "text", "text": t} for t in texts]}


def _append(messages: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """`message`, merged into the assistant message before it where vLLM merges: a tool call into its calls, a
    reasoning or a text into the one that has none yet."""
    last = messages[-1] if messages else None
    if message["role"] != "assistant" or last is None or last.get("role") != "assistant":
        messages.append(message)
        return
    if "tool_calls" in message:
        last["tool_calls"] = [*(last.get("tool_calls") or []), *message["tool_calls"]]
        return
    if "reasoning" in message and last.get("reasoning") is None:
        last["reasoning"] = message["reasoning"]
        return
    if "reasoning" not in message and last.get("content") is None:
        last["content"] = message["content"]
        return
    messages.append(message)


def _continues(items: str | list[dict[str, Any]]) -> bool:
    """The last input item is an assistant's message (or reasoning) left unfinished: it is continued."""
    if isinstance(items, str) or not items:
        return False
    last = items[-1]
    kind = last.get("type", "message")
    if kind == "message" and last.get("role") != "assistant":
        return False
    return kind in ("message", "reasoning") and last.get("status") in ("in_progress", "incomplete")


# -- the answer --------------------------------------------------------------------------------------------------


def head(req: ResponsesRequest, response_id: str, created_at: int, model: str) -> dict[str, Any]:
    """The response object's fields that the request sets (vLLM's `ResponsesResponse.from_request`), in progress
    and with no output yet."""
    return {
        "id": response_id,
        "created_at": created_at,
        "incomplete_details": None,
        "instructions": req.instructions,
        "metadata": req.metadata,
        "model": model,
        "object": "response",
        "output": [],
        "parallel_tool_calls": True if req.parallel_tool_calls is None else req.parallel_tool_calls,
        "temperature": 1.0 if req.temperature is None else req.temperature,
        "tool_choice": _tool_choice_of(req),
        "tools": req.tools,
        "top_p": 1.0 if req.top_p is None else req.top_p,
        "background": req.background,
        "max_output_tokens": req.max_output_tokens,
        "max_tool_calls": req.max_tool_calls,
        "previous_response_id": req.previous_response_id,
        "prompt": None,
        "reasoning": req.reasoning.model_dump() if req.reasoning is not None else None,
        "service_tier": req.service_tier or "auto",
        "status": "in_progress",
        "text": req.text.model_dump(by_alias=True, exclude_none=True) if req.text is not None else None,
        "top_logprobs": req.top_logprobs,
        "truncation": req.truncation,
        "usage": None,
        "user": req.user,
        "error": None,
    }


def _tool_choice_of(req: ResponsesRequest) -> str | dict[str, Any]:
    """The tool choice a response reports: with no tools, "auto" is "none" (vLLM's `check_tool_usage`)."""
    if isinstance(req.tool_choice, NamedToolChoice):
        return req.tool_choice.model_dump()
    return "none" if req.tool_choice == "auto" and not req.tools else req.tool_choice


def finished(base: dict[str, Any], output: list[dict[str, Any]], finish: str | None, chat_usage: Any) -> dict:
    """The response object `base` once its answer is whole: its output items, status and usage."""
    incomplete = finish == "length"
    return base | {
        "output": output,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "usage": usage(chat_usage),
    }


def usage(chat_usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if not chat_usage:
        return None
    cached = (chat_usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (chat_usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": chat_usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": chat_usage.get("completion_tokens") or 0,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": chat_usage["prompt_tokens"] + (chat_usage.get("completion_tokens") or 0),
    }


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": None,
    }


def text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def message_item(item_id: str, text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    content = [text_part(text, logprobs)] if text else []
    return {"id": item_id, "type": "message", "role": "assistant", "content": content, "status": "completed"}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def output_items(chat: dict[str, Any], new_id: Callable[[], str]) -> list[dict[str, Any]]:
    """The output items of a whole chat completion's first choice (vLLM's `build_response_output_items`)."""
    choice = chat["choices"][0]
    msg = choice["message"]
    out: list[dict[str, Any]] = []
    if msg.get("reasoning"):
        out.append(reasoning_item(f"rs_{new_id()}", msg["reasoning"]))
    if msg.get("content"):
        logprobs = (choice.get("logprobs") or {}).get("content")
        out.append(message_item(f"msg_{new_id()}", msg["content"], logprobs))
    for call in msg.get("tool_calls") or []:
        function = call["function"]
        out.append(call_item(f"fc_{new_id()}", call["id"], function["name"], function["arguments"]))
    return out or [message_item(f"msg_{new_id()}", "", None)]  # nothing said: one empty message, as vLLM
