"""Anthropic's Messages API through the app over fake pools, with Anthropic's own SDK: a message whole and
streamed, tool use both ways, stop sequences, the same engine request the chat endpoint makes of the same
conversation, and bad input in Anthropic's error shape."""

from __future__ import annotations

import json

import anthropic
import httpx2
import pytest

from tests.factories import MODEL, FakePool, make_frontend, post, run


def _client(fe, api_key: str = "unused") -> anthropic.AsyncAnthropic:
    """Anthropic's SDK on the app itself (its HTTP client is httpx2's)."""
    transport = httpx2.ASGITransport(app=fe.app)
    return anthropic.AsyncAnthropic(
        api_key=api_key, base_url="http://frontend", http_client=httpx2.AsyncClient(transport=transport)
    )


WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_a_message_whole_and_streamed_with_the_sdk():
    fe = make_frontend(decode=FakePool("decode_pool", script=("Hello", " there")))

    async def go():
        client = _client(fe)
        whole = await client.messages.create(
            model=MODEL,
            max_tokens=8,
            system="Be brief.",
            messages=[{"role": "user", "content": "hi"}],
            service_tier="auto",  # accepted, unused
            metadata={"user_id": "u1"},
        )
        async with client.messages.stream(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_message()
        return whole, kinds, final

    whole, kinds, final = run(go())
    assert whole.id.startswith("msg_") and whole.role == "assistant" and whole.model == MODEL
    assert [b.type for b in whole.content] == ["text"] and whole.content[0].text == "Hello there"
    assert whole.stop_reason == "end_turn" and whole.usage.output_tokens == 2
    # Anthropic counts cached prompt tokens apart (the fake decode pool reports a transferred prompt as cached).
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == 7
    assert final.content[0].text == "Hello there" and final.stop_reason == "end_turn"
    assert final.usage.output_tokens == 2
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    # Both went the disaggregated way, as a chat request does: a remote prefill, then decode.
    assert len(fe.prefill.prefills) == 2 and len(fe.decode.generates) == 2


def test_a_conversation_reaches_the_engine_as_the_same_conversation_in_chat_does():
    fe = make_frontend(decode=FakePool("decode_pool", script=("ok",)), tool_call_parser="hermes")
    conversation = [
        {"role": "user", "content": [{"type": "text", "text": "weather in Oslo?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Oslo"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_1", "content": "sunny"},
                {"type": "text", "text": "and tomorrow?"},
            ],
        },
    ]
    r = post(fe, "/v1/messages", {"model": MODEL, "max_tokens": 1, "system": "Be brief.", "messages": conversation})
    assert r.status_code == 200, r.text
    chat_messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather in Oslo?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "user", "content": "and tomorrow?"},
    ]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER["input_schema"]}}]
    assert post(fe, "/v1/chat/completions", {"model": MODEL, "max_tokens": 1, "messages": chat_messages}).status_code
    messages_request, chat_request = fe.decode.generates
    assert messages_request.prompt_token_ids == chat_request.prompt_token_ids
    with_tools = post(
        fe, "/v1/messages", {"model": MODEL, "max_tokens": 1, "messages": conversation, "tools": [WEATHER]}
    )
    assert with_tools.status_code == 200
    chat_with_tools = {"model": MODEL, "max_tokens": 1, "messages": chat_messages[1:], "tools": tools}
    assert post(fe, "/v1/chat/completions", chat_with_tools).status_code == 200
    assert fe.decode.generates[2].prompt_token_ids == fe.decode.generates[3].prompt_token_ids


def test_tool_use_whole_and_streamed_with_the_sdk():
    script = ('[{"name": "get_weather", ', '"parameters": {"city": "Rome"}}]')
    fe = make_frontend(decode=FakePool("decode_pool", script=script))

    async def go():
        client = _client(fe)
        asked = dict(model=MODEL, max_tokens=16, tools=[WEATHER], tool_choice={"type": "any"})
        whole = await client.messages.create(**asked, messages=[{"role": "user", "content": "weather?"}])
        async with client.messages.stream(**asked, messages=[{"role": "user", "content": "weather?"}]) as stream:
            final = await stream.get_final_message()
        return whole, final

    whole, final = run(go())
    for message in (whole, final):
        (use,) = message.content
        assert use.type == "tool_use" and use.name == "get_weather" and use.input == {"city": "Rome"}
        assert message.stop_reason == "tool_use"
    # tool_choice "any" is chat's "required": the output held to a list of calls.
    schema = json.loads(fe.decode.generates[0].sampling.structured.value)
    assert schema["type"] == "array"


def test_a_stop_sequence_and_max_tokens_as_anthropic_reports_them():
    fe = make_frontend(decode=FakePool("decode_pool", script=("a", "b", "c")))
    stopped = post(
        fe,
        "/v1/messages",
        {"model": MODEL, "max_tokens": 8, "stop_sequences": ["END"], "messages": [{"role": "user", "content": "hi"}]},
    ).json()
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "END")
    assert fe.decode.generates[0].sampling.stop == ("END",)
    cut = post(fe, "/v1/messages", {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert cut.json()["stop_reason"] == "max_tokens" and cut.json()["usage"]["output_tokens"] == 2


@pytest.mark.parametrize(
    ("body", "status", "kind", "field"),
    [
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "bogus": 1},
            400,
            "invalid_request_error",
            "bogus",
        ),
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "invalid_request_error", "max_tokens"),
        (
            {"max_tokens": "many", "messages": [{"role": "user", "content": "hi"}]},
            400,
            "invalid_request_error",
            "max_tokens",
        ),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            400,
            "invalid_request_error",
            "messages.0.content.0.type",
        ),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "thinking": {"type": "enabled"}},
            400,
            "invalid_request_error",
            "thinking",
        ),
        (
            {"model": "nope", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            404,
            "not_found_error",
            "model",
        ),
    ],
)
def test_bad_input_gets_anthropics_error_shape_and_the_server_keeps_serving(body, status, kind, field):
    fe = make_frontend(decode=FakePool("decode_pool", script=("ok",)))
    r = post(fe, "/v1/messages", {"model": MODEL, **body})
    assert r.status_code == status
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == kind and field in error["error"]["message"]
    assert (
        post(
            fe, "/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        ).status_code
        == 200
    )


def test_a_body_that_is_no_json_is_anthropics_400():
    fe = make_frontend()

    async def go():
        async with fe.client() as c:
            return await c.post("/v1/messages", content=b"{not json", headers={"content-type": "application/json"})

    r = run(go())
    assert r.status_code == 400 and r.json()["error"] == {
        "type": "invalid_request_error",
        "message": r.json()["error"]["message"],
    }
    assert "JSON" in r.json()["error"]["message"]


def test_the_api_key_may_come_as_x_api_key_and_a_missing_one_is_anthropics_401():
    fe = make_frontend(api_key="secret", decode=FakePool("decode_pool", script=("ok",)))

    async def go():
        ok = await _client(fe, "secret").messages.create(
            model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
        with pytest.raises(anthropic.AuthenticationError) as refused:
            await _client(fe, "wrong").messages.create(
                model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
            )
        return ok, refused.value

    ok, refused = run(go())
    assert ok.content[0].text == "ok"
    assert refused.status_code == 401 and refused.body["error"]["type"] == "authentication_error"
