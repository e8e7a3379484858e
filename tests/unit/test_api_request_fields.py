"""Request fields beyond sampling that vLLM's server accepts: OpenAI's fields that ask
nothing of the answer are taken and unused (as vLLM), fields that ask for what this
server does not do are a 400 naming the field unless at a value that asks nothing,
and a field neither OpenAI nor vLLM defines is a 400 (vLLM's server would ignore it)."""

from __future__ import annotations

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
