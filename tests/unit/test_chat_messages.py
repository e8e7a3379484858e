"""Chat messages reach the template as vLLM's server gives them: the conversation
(orchestrator/api/chat_messages.py) equals what vLLM's own `parse_chat_messages` makes
of the same messages, in both content formats; the content-format detection
(orchestrator/chat_template_format.py) equals vLLM's on templates of each shape; the
developer role becomes system as vLLM turns it; and through the API a multi-part
message renders as vLLM renders it (the answer's `prompt_text`)."""

from __future__ import annotations

import json

import pytest

from orchestrator.api.chat_messages import TemplateTraits, template_messages
from orchestrator.api.protocol import ChatMessage
from orchestrator.chat_template_format import iterates_content_parts
from orchestrator.tiny_model import CHAT_TEMPLATE, make_tiny_model
from tests.factories import MODEL, json_events, make_frontend, post, tiny_tokenizer

# Templates of each shape vLLM's detection tells apart: True where it finds a loop over a message's parts.
TEMPLATES = {
    "tiny model's": (CHAT_TEMPLATE, False),
    "content as a string, tested": (
        "{% for m in messages %}{% if m.content is string %}{{ m.content | trim }}{% endif %}{% endfor %}",
        False,
    ),
    "loop over message['content']": (
        "{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}",
        True,
    ),
    "loop over a slice of the messages": (
        "{% for m in messages[1:] %}{% for p in m.content %}{{ p['text'] }}{% endfor %}{% endfor %}",
        True,
    ),
    "messages through an alias": (
        "{% set msgs = messages %}{% for m in msgs %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}",
        True,
    ),
    "content through a macro's parameter": (
        "{% macro show(c) %}{% for p in c %}{{ p.text }}{% endfor %}{% endmacro %}"
        "{% for m in messages %}{{ show(m.content) }}{% endfor %}",
        True,
    ),
    "content through a macro's keyword": (
        "{% macro show(x, c=none) %}{% for p in c %}{{ p.text }}{% endfor %}{% endmacro %}"
        "{% for m in messages %}{{ show(1, c=m['content']) }}{% endfor %}",
        True,
    ),
    "a loop over a bare `content`": (
        "{% for m in messages %}{% set content = m.content %}{% for p in content %}{{ p }}{% endfor %}{% endfor %}",
        True,
    ),
    "a macro's loop over something else": (
        "{% macro show(c) %}{% for p in c %}{{ p }}{% endfor %}{% endmacro %}"
        "{% for m in messages %}{{ show(m.role) }}{% endfor %}",
        False,
    ),
    "transformers' generation tag": (
        "{% for m in messages %}{% generation %}{% for p in m.content %}{{ p.text }}{% endfor %}"
        "{% endgeneration %}{% endfor %}",
        True,
    ),
    "does not parse": ("{% for m in messages %}{{ m.content ", False),
}


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_the_content_format_is_detected_as_vllm_detects_it(name):
    from vllm.renderers.hf import _detect_content_format

    template, parts = TEMPLATES[name]
    assert iterates_content_parts(template) is parts
    assert (_detect_content_format(template, default="string") == "openai") is parts


# A conversation with every kind of content and field vLLM reads.
MESSAGES = [
    {"role": "system", "content": [{"type": "text", "text": "be brief"}, "and kind"]},
    {"role": "developer", "content": "answer in French", "name": "ops"},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "first", "cache_control": {"type": "ephemeral"}},
            {"type": "input_text", "text": "second"},
        ],
    },
    {
        "role": "assistant",
        "content": [{"type": "output_text", "text": "calling"}, {"type": "refusal", "refusal": "not that"}],
        "reasoning": "the user wants weather",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "c2", "type": "function", "function": {"name": "time", "arguments": "not json"}},
            {"id": "c3", "type": "function", "function": {"name": "date", "arguments": "[1, 2]"}},
            {"id": "c4", "type": "function", "function": {"name": "now", "arguments": ""}},
            # A call accumulated from streamed deltas keeps their `index`; unknown keys are ignored, as vLLM.
            {"index": 4, "id": "c5", "type": "function", "function": {"name": "now", "arguments": "{}"}},
        ],
        "cache_control": {"type": "ephemeral"},
    },
    {"role": "function", "name": "now", "content": "12:00"},  # OpenAI's deprecated function result
    {
        "role": "tool",
        "tool_call_id": "c1",
        "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": "9C"}],
    },
    {"role": "assistant", "content": None, "reasoning_content": "older name", "tool_calls": []},
    {
        "role": "user",
        "content": [{"type": "thinking", "thinking": "hmm", "closed": True}, {"type": "text", "text": "ok"}],
    },
]


@pytest.fixture(scope="module")
def vllm_model_config(tmp_path_factory):
    from vllm.config import ModelConfig

    model = make_tiny_model(tmp_path_factory.mktemp("models") / "tiny")
    return ModelConfig(model=str(model), tokenizer=str(model))


@pytest.mark.parametrize("content_format", ["string", "openai"])
def test_the_conversation_equals_vllms_own_parse_of_the_messages(vllm_model_config, content_format):
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest as VllmRequest
    from vllm.renderers.chat_utils import parse_chat_messages

    # vLLM's request model first: it renames `reasoning_content`, as its server does before parsing.
    vllm_messages = VllmRequest(model=MODEL, messages=json.loads(json.dumps(MESSAGES))).messages
    theirs, _, _ = parse_chat_messages(vllm_messages, vllm_model_config, content_format)
    ours = template_messages(
        [ChatMessage.model_validate(m) for m in MESSAGES], TemplateTraits(as_parts=content_format == "openai")
    )
    assert ours == [dict(m) for m in theirs]


def test_developer_messages_become_one_first_system_message_as_vllm_turns_them():
    from vllm.renderers.hf import _consolidate_system_messages, _convert_developer_to_system

    messages = [ChatMessage.model_validate(m) for m in MESSAGES]
    kept = template_messages(messages, TemplateTraits(developer_role=True))
    assert [m["role"] for m in kept[:2]] == ["system", "developer"]
    turned = template_messages(messages, TemplateTraits(developer_role=False))
    assert turned == _consolidate_system_messages(_convert_developer_to_system(kept))
    assert turned[0] == {"role": "system", "content": "be brief\nand kind\n\nanswer in French"}
    assert TemplateTraits.of(CHAT_TEMPLATE).developer_role is False
    assert TemplateTraits.of(CHAT_TEMPLATE + "{# 'developer' #}").developer_role is True


def _frontend(tmp_path, template: str):
    tokenizer = tiny_tokenizer(tmp_path, [])
    tokenizer.chat_template = template
    return make_frontend(disaggregated=False, max_model_len=512, tokenizer=tokenizer)


def _chat(fe, messages, **body):
    return post(fe, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1, **body})


def test_the_rendered_prompt_joins_text_parts_and_shows_earlier_reasoning_as_vllm_renders(tmp_path):
    template = (
        "{% for m in messages %}[{{ m.role }}]{% if m.reasoning_content %}({{ m.reasoning_content }}){% endif %}"
        "{{ m.content }}{% endfor %}"
    )
    fe = _frontend(tmp_path, template)
    messages = [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "c", "reasoning": "r"},
        {"role": "user", "content": "d"},
    ]
    whole = _chat(fe, messages, return_prompt_text=True).json()
    # The template never names "developer": it reads the message as the system's.
    assert whole["prompt_text"] == "[system]be brief[user]a\nb[assistant](r)c[user]d"
    streamed = json_events(_chat(fe, messages, return_prompt_text=True, stream=True, n=2))
    assert [e["prompt_text"] for e in streamed if "prompt_text" in e] == [whole["prompt_text"]] * 2
    assert "prompt_text" not in _chat(fe, messages).json()


def test_a_template_that_iterates_over_parts_gets_them_even_for_a_string(tmp_path):
    fe = _frontend(tmp_path, "{% for m in messages %}{% for p in m.content %}<{{ p.text }}>{% endfor %}{% endfor %}")
    messages = [{"role": "user", "content": "whole"}, {"role": "user", "content": [{"type": "text", "text": "x"}, "y"]}]
    assert _chat(fe, messages, return_prompt_text=True).json()["prompt_text"] == "<whole><x><y>"


def test_an_answer_sent_back_with_openais_fields_is_read_and_media_parts_get_a_clear_400(tmp_path):
    fe = _frontend(tmp_path, CHAT_TEMPLATE)
    earlier = {  # an OpenAI answer's message as an SDK sends it back
        "role": "assistant",
        "content": None,
        "refusal": "I can't help with that.",
        "annotations": [],
        "audio": None,
        "function_call": None,
    }
    r = _chat(fe, [{"role": "user", "content": "hi"}, earlier, {"role": "user", "content": "ok"}])
    assert r.status_code == 200, r.text
    image = {"type": "image_url", "image_url": {"url": "http://x/cat.png"}}
    r = _chat(fe, [{"role": "user", "content": [{"type": "text", "text": "what is this"}, image]}])
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "messages.0" and "'image_url' are not supported" in error["message"]
    r = _chat(fe, [{"role": "user", "content": [{"type": "text"}]}])
    assert r.status_code == 400 and "content part needs its 'text' text" in r.json()["error"]["message"]
    assert _chat(fe, [{"role": "user", "content": "still serving"}]).status_code == 200


TOOLS = [
    {"type": "function", "function": {"name": "weather"}},
    {
        "type": "function",
        "function": {"name": "mcp.search:web", "description": "d", "parameters": {"type": "object"}, "strict": True},
    },
    {"type": "function", "function": {"name": "later"}, "defer_loading": True},
    {"type": "function", "function": {"name": "kept", "defer_loading": False}, "defer_loading": True},
]


def test_tools_reach_the_template_as_vllm_dumps_them():
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionToolsParam

    from orchestrator.api.protocol import Tool
    from orchestrator.api.tools import template_tools

    ours = template_tools([Tool.model_validate(t) for t in TOOLS])
    assert ours == [ChatCompletionToolsParam.model_validate(t).model_dump() for t in TOOLS]
