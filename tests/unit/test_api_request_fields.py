"""Request fields beyond sampling that vLLM's server accepts: OpenAI's fields that ask
nothing of the answer are taken and unused (as vLLM), fields that ask for what this
server does not do are a 400 naming the field unless at a value that asks nothing,
and a field neither OpenAI nor vLLM defines is a 400 (vLLM's server would ignore it)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from orchestrator.api.protocol import NOT_SERVED_CHAT_FIELDS, NOT_SERVED_COMPLETION_FIELDS, NOT_SERVED_FIELDS
from tests.factories import MODEL, chat, make_frontend, post

# OpenAI's chat fields that ask nothing of the answer, as the SDK sends them.
UNUSED_OPENAI_FIELDS = {
    "store": True,
    "metadata": {"team": "search"},
    "service_tier": "auto",
    "safety_identifier": "user-1",
    "prompt_cache_key": "session-9",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "explicit", "ttl": "30m"},
    "prediction": {"type": "content", "content": "Paris"},
    "verbosity": "low",
    "modalities": ["text"],
    "parallel_tool_calls": True,
}
# vLLM's fields at values that ask nothing of this server.
NO_OP_VLLM_FIELDS = {
    "kv_transfer_params": None,
    "ec_transfer_params": None,
    "thinking_token_budget": None,
    "watermarking": False,
    "routed_experts_prompt_start": 0,
    "mm_payload": "none",
    "return_mm_kwargs": False,
}
# A value of each refused field that asks for something.
ASKING = {
    "kv_transfer_params": {"do_remote_decode": True},
    "ec_transfer_params": {"do_remote_encode": True},
    "thinking_token_budget": 64,
    "watermarking": True,
    "modalities": ["text", "audio"],
    "audio": {"voice": "alloy", "format": "wav"},
    "web_search_options": {},
    "functions": [{"name": "f", "parameters": {}}],
    "function_call": "auto",
    "moderation": {"enabled": True},
    "prompt_embeds": "AAAA",
}


def test_openais_fields_that_ask_nothing_are_accepted_as_vllm_accepts_them():
    fe = make_frontend()
    r = chat(fe, "hi", max_tokens=2, **UNUSED_OPENAI_FIELDS, **NO_OP_VLLM_FIELDS, media_io_kwargs={})
    assert r.status_code == 200, r.text
    r = post(fe, "/v1/completions", {"model": MODEL, "prompt": "a b", "max_tokens": 2, **NO_OP_VLLM_FIELDS})
    assert r.status_code == 200, r.text


def test_every_refused_field_is_covered_here():
    assert set(ASKING) == {*NOT_SERVED_FIELDS, *NOT_SERVED_CHAT_FIELDS, *NOT_SERVED_COMPLETION_FIELDS}


@pytest.mark.parametrize("field", sorted({*NOT_SERVED_FIELDS, *NOT_SERVED_CHAT_FIELDS}))
def test_a_chat_field_asking_for_what_is_not_here_is_a_400_naming_it(field):
    fe = make_frontend()
    r = chat(fe, "hi", max_tokens=2, **{field: ASKING[field]})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == field and error["code"] == "unsupported"
    reason = {**NOT_SERVED_FIELDS, **NOT_SERVED_CHAT_FIELDS}[field].reason
    assert error["message"] == f"{field}: {reason}"
    assert fe.decode.generates == []  # no engine saw it
    assert chat(fe, "hi", max_tokens=2).status_code == 200  # and the server keeps serving


@pytest.mark.parametrize("field", sorted({*NOT_SERVED_FIELDS, *NOT_SERVED_COMPLETION_FIELDS}))
def test_a_completion_field_asking_for_what_is_not_here_is_a_400_naming_it(field):
    fe = make_frontend()
    r = post(fe, "/v1/completions", {"model": MODEL, "prompt": "a b", "max_tokens": 2, field: ASKING[field]})
    assert r.status_code == 400 and r.json()["error"]["param"] == field
    assert fe.decode.generates == []


def test_a_field_no_api_defines_is_a_400_naming_it():
    fe = make_frontend()
    r = chat(fe, "hi", max_tokens=2, temprature=0.2)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "temprature"
    assert "Extra inputs are not permitted" in r.json()["error"]["message"]


def _vllm_field_values(model: type) -> list[tuple[str, Any]]:
    """Each field of vLLM's request model at its default, and at null where vLLM takes null: what a client
    that writes every field (as vLLM's own Python models serialise) sends."""
    from pydantic import TypeAdapter
    from pydantic_core import PydanticUndefined

    values = []
    for key, info in model.model_fields.items():
        name = info.alias or key
        if info.default is not PydanticUndefined or info.default_factory is not None:
            values.append((name, info.get_default(call_default_factory=True)))
        try:
            TypeAdapter(info.annotation).validate_python(None)
            values.append((name, None))
        except ValueError:
            pass
    return values


def _vllm_models() -> dict[str, type]:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    return {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest}


BASE_BODIES = {
    "/v1/chat/completions": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/completions": {"model": MODEL, "prompt": "a b", "max_tokens": 2},
}


@pytest.mark.parametrize("path", sorted(BASE_BODIES))
def test_every_field_of_vllms_request_is_accepted_at_its_default_and_at_null(path):
    """What vLLM's server takes at a value that asks for nothing, this server answers (200), field by field;
    a field vLLM adds in a later release fails here until it is read or refused with a reason."""
    vllm_model = _vllm_models()[path]
    fe = make_frontend(engine_kind="vllm")
    refused, sent = {}, set()
    for name, value in _vllm_field_values(vllm_model):
        body = {**BASE_BODIES[path], name: json.loads(json.dumps(value))}
        if name in BASE_BODIES[path] or not _vllm_takes(vllm_model, body):
            continue
        sent.add(name)
        r = post(fe, path, body)
        if r.status_code != 200:
            refused[f"{name}={value!r}"] = r.json()["error"]["message"]
    assert refused == {}
    assert len(sent) > len(vllm_model.model_fields) * 3 // 4  # nearly every field was sent, not skipped


def _vllm_takes(model: type, body: dict[str, Any]) -> bool:
    try:
        model.model_validate(body)
    except ValueError:
        return False
    return True


HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
# Keys that the objects inside a request do not define, as clients send them: vLLM's server ignores them.
NESTED_EXTRAS = {
    "a message's provider annotation": {"messages": [{"role": "user", "content": "hi", "cache_control": {}}]},
    "a streamed call's index in the history": {
        "messages": [
            *HI,
            {
                "role": "assistant",
                "tool_calls": [
                    {"index": 0, "id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c", "content": "ok"},
        ]
    },
    "a tool's provider annotation": {"tools": [{**TOOL, "cache_control": {}}], "tool_choice": "none"},
    "a function's examples": {"tools": [{"type": "function", "function": {"name": "f", "examples": []}}]},
    "a named choice's extra": {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "f", "x": 1}}},
    "stream options' extra": {"stream": True, "stream_options": {"include_usage": True, "x": 1}},
    "a response format's extra": {"response_format": {"type": "json_object", "x": 1}},
    "a JSON schema format's extra": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {}, "x": 1}}
    },
}


@pytest.mark.parametrize("case", sorted(NESTED_EXTRAS))
def test_keys_the_objects_inside_a_request_do_not_define_are_ignored_as_vllm_ignores_them(case):
    vllm_model = _vllm_models()["/v1/chat/completions"]
    body = {"model": MODEL, "messages": HI, "max_tokens": 2, **NESTED_EXTRAS[case]}
    if "tools" in body and "tool_choice" not in body:
        body["tool_choice"] = "none"
    assert _vllm_takes(vllm_model, body)
    r = post(make_frontend(engine_kind="vllm"), "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
