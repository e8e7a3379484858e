"""OpenAI's Responses API through the app over fake pools, with OpenAI's own SDK: a response whole and streamed
(the event sequence), function calls both ways, `text.format`, a conversation continued by
`previous_response_id`, background responses retrieved and cancelled, the same engine request the chat
endpoint makes of the same conversation as vLLM's server builds it, the store's bounds under a flood, and
bad input in OpenAI's error shape."""

from __future__ import annotations

import asyncio
import gc
import json
import tracemalloc

import httpx
import openai
import pytest

from orchestrator.api.response_store import BoundedResponseStore
from orchestrator.api.responses_service import ResponsesService
from tests.factories import MODEL, FakePool, make_frontend, post, run, tiny_tokenizer


def _client(fe) -> openai.AsyncOpenAI:
    transport = httpx.ASGITransport(app=fe.app)
    return openai.AsyncOpenAI(
        api_key="unused", base_url="http://frontend/v1", http_client=httpx.AsyncClient(transport=transport)
    )


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_a_response_whole_and_streamed_with_the_sdk():
    fe = make_frontend(decode=FakePool("decode_pool", script=("Hello", " there")))

    async def go():
        client = _client(fe)
        whole = await client.responses.create(
            model=MODEL, input="hi", instructions="Be brief.", max_output_tokens=8, metadata={"k": "v"}
        )
        async with client.responses.stream(model=MODEL, input="hi", max_output_tokens=8) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
        return whole, kinds, final

    whole, kinds, final = run(go())
    assert whole.id.startswith("resp_") and whole.status == "completed" and whole.model == MODEL
    assert whole.output_text == "Hello there" and whole.instructions == "Be brief." and whole.metadata == {"k": "v"}
    assert whole.tool_choice == "none" and whole.tools == []  # no tools: "auto" reported as "none", as vLLM
    assert whole.usage.output_tokens == 2 and whole.usage.input_tokens == whole.usage.total_tokens - 2
    assert final.output_text == "Hello there" and final.status == "completed"
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    # Both went the disaggregated way, as a chat request does: a remote prefill, then decode.
    assert len(fe.prefill.prefills) == 2 and len(fe.decode.generates) == 2


def test_the_event_stream_numbers_its_events_and_ends_incomplete_at_max_output_tokens():
    fe = make_frontend(decode=FakePool("decode_pool", script=("a", "b", "c")))

    async def go():
        async with fe.client() as c:
            body = {"model": MODEL, "input": "hi", "max_output_tokens": 2, "stream": True}
            r = await c.post("/v1/responses", json=body)
            return r.text

    events = [json.loads(line[6:]) for line in run(go()).split("\n") if line.startswith("data: ")]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    last = events[-1]
    assert last["type"] == "response.completed" and last["response"]["status"] == "incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["output"][0]["content"][0]["text"] == "ab"


def test_reasoning_is_its_own_item_before_the_message_whole_and_streamed():
    script = ("<think>", "Two and", " two.</th", "ink>Fo", "ur.")
    fe = make_frontend(decode=FakePool("decode_pool", script=script), reasoning_parser="deepseek_r1")

    async def go():
        client = _client(fe)
        asked = dict(model=MODEL, input="2+2?", max_output_tokens=8, reasoning={"effort": "low"})
        whole = await client.responses.create(**asked)
        async with client.responses.stream(**asked) as stream:
            events = [event async for event in stream]
            final = await stream.get_final_response()
        return whole, events, final

    whole, events, final = run(go())
    for response in (whole, final):
        reasoning, message = response.output
        assert reasoning.type == "reasoning" and reasoning.content[0].text == "Two and two."
        assert message.type == "message" and response.output_text == "Four."
    kinds = [e.type for e in events]
    # The reasoning item is closed whole before the message opens.
    done = kinds.index("response.reasoning_text.done")
    assert kinds[done : done + 4] == [
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
    ]
    assert [e.output_index for e in events if e.type == "response.output_item.added"] == [0, 1]
    # reasoning.effort reaches the template as chat's reasoning_effort does.
    assert fe.decode.generates[0].prompt_token_ids == fe.decode.generates[1].prompt_token_ids


def test_a_function_call_whole_and_streamed_and_its_output_sent_back():
    script = ('[{"name": "get_weather", ', '"parameters": {"city": "Rome"}}]')
    fe = make_frontend(decode=FakePool("decode_pool", script=script))

    async def go():
        client = _client(fe)
        asked = dict(model=MODEL, input="weather?", tools=[WEATHER], tool_choice="required", max_output_tokens=16)
        whole = await client.responses.create(**asked)
        async with client.responses.stream(**asked) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
        (call,) = whole.output
        follow = await client.responses.create(
            model=MODEL,
            max_output_tokens=1,
            tools=[WEATHER],
            input=[
                {"role": "user", "content": "weather?"},
                {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
                {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
            ],
        )
        return whole, kinds, final, follow

    whole, kinds, final, follow = run(go())
    for response in (whole, final):
        (call,) = response.output
        assert call.type == "function_call" and call.name == "get_weather"
        assert json.loads(call.arguments) == {"city": "Rome"} and call.call_id
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert follow.status == "incomplete" and follow.output_text == script[0]  # at its one output token
    # tool_choice "required": the output held to a list of calls, as the chat endpoint holds it.
    assert json.loads(fe.decode.generates[0].sampling.structured.value)["type"] == "array"


def test_input_items_reach_the_engine_as_the_same_conversation_in_chat_does():
    fe = make_frontend(decode=FakePool("decode_pool", script=("ok",)), tool_call_parser="hermes")
    items = [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [{"type": "input_text", "text": "weather in Oslo?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"role": "user", "content": "and tomorrow?"},
    ]
    r = post(fe, "/v1/responses", {"model": MODEL, "input": items, "tools": [WEATHER], "max_output_tokens": 1})
    assert r.status_code == 200, r.text
    chat_messages = [
        {"role": "developer", "content": "Use tools."},
        {"role": "user", "content": [{"type": "text", "text": "weather in Oslo?"}]},
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
    tool = {"type": "function", "function": {k: WEATHER[k] for k in ("name", "description", "parameters")}}
    chat = {"model": MODEL, "max_tokens": 1, "messages": chat_messages, "tools": [tool]}
    assert post(fe, "/v1/chat/completions", chat).status_code == 200
    responses_request, chat_request = fe.decode.generates
    assert responses_request.prompt_token_ids == chat_request.prompt_token_ids


def test_the_prompt_is_the_one_vllms_server_renders_from_the_same_items(tmp_path):
    """vLLM's own translation of the same items (`construct_input_messages`), rendered as its server renders a
    conversation, is the prompt both engines are asked for."""
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.openai.responses.utils import construct_input_messages

    from tests.unit.test_api_openai_parity import HERMES_TOKENS, HERMES_TOOL_TEMPLATE

    tokenizer = tiny_tokenizer(tmp_path, HERMES_TOKENS)
    tokenizer.chat_template = HERMES_TOOL_TEMPLATE
    fe = make_frontend(max_model_len=512, tokenizer=tokenizer)
    items = [
        {"role": "system", "content": "Terse."},
        {"role": "user", "content": "weather in Oslo?"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "look it up"}]},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]},
    ]
    body = {"model": MODEL, "input": items, "instructions": "Be kind.", "max_output_tokens": 1}
    assert post(fe, "/v1/responses", body).status_code == 200
    request = ResponsesRequest.model_validate(json.loads(json.dumps(body)))
    theirs = construct_input_messages(request_instructions=request.instructions, request_input=request.input)
    prompt = _prompt_vllms_responses_render(tmp_path, tokenizer, json.loads(json.dumps(theirs, default=_dump)))
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}' in prompt and "thanks" in prompt
    (prefilled,), (decoded,) = fe.prefill.prefills, fe.decode.generates
    assert tokenizer.decode(decoded.prompt_token_ids) == prompt
    assert prefilled.prompt_token_ids == decoded.prompt_token_ids


def _prompt_vllms_responses_render(model_dir, tokenizer, messages) -> str:
    """The prompt vLLM 0.32's Responses path makes of its messages (`render_responses` -> `preprocess_chat`:
    parse_chat_messages in the template's content format, then the template with the generation prompt)."""
    from vllm.config import ModelConfig
    from vllm.renderers.chat_utils import parse_chat_messages
    from vllm.renderers.hf import resolve_chat_template_content_format, safe_apply_chat_template

    config = ModelConfig(model=str(model_dir), tokenizer=str(model_dir))
    template = tokenizer.chat_template
    content_format = resolve_chat_template_content_format(template, None, "auto", tokenizer, model_config=config)
    conversation, _, _ = parse_chat_messages(messages, config, content_format)
    return safe_apply_chat_template(
        config, tokenizer, conversation, chat_template=template, tokenize=False, add_generation_prompt=True
    )


def _dump(value):
    return value.model_dump() if hasattr(value, "model_dump") else dict(value)


def test_previous_response_id_continues_the_stored_conversation_and_instructions_do_not_carry_over():
    fe = make_frontend(decode=FakePool("decode_pool", script=("Oslo",)))

    async def go():
        client = _client(fe)
        first = await client.responses.create(model=MODEL, input="capital of Norway?", instructions="Terse.")
        second = await client.responses.create(
            model=MODEL, input="and Sweden?", previous_response_id=first.id, max_output_tokens=1
        )
        third = await client.responses.create(model=MODEL, input="and Denmark?", previous_response_id=second.id)
        fetched = await client.responses.retrieve(second.id)
        return first, second, third, fetched

    first, second, third, fetched = run(go())
    assert second.previous_response_id == first.id and fetched.id == second.id
    assert fetched.output_text == second.output_text == "Oslo"
    chat = {
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "capital of Norway?"},
            {"role": "assistant", "content": "Oslo"},
            {"role": "user", "content": "and Sweden?"},
            {"role": "assistant", "content": "Oslo"},
            {"role": "user", "content": "and Denmark?"},
        ],
    }
    assert post(fe, "/v1/chat/completions", chat).status_code == 200
    assert fe.decode.generates[2].prompt_token_ids == fe.decode.generates[3].prompt_token_ids


def test_an_unknown_or_unstored_previous_response_is_a_404_and_store_false_keeps_nothing():
    fe = make_frontend(decode=FakePool("decode_pool", script=("ok",)))
    r = post(fe, "/v1/responses", {"model": MODEL, "input": "hi", "previous_response_id": "resp_nope"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "response_id"
    unstored = post(fe, "/v1/responses", {"model": MODEL, "input": "hi", "store": False}).json()
    follow = {"model": MODEL, "input": "x", "previous_response_id": unstored["id"]}
    assert post(fe, "/v1/responses", follow).status_code == 404

    async def get():
        async with fe.client() as c:
            return await c.get(f"/v1/responses/{unstored['id']}")

    assert run(get()).status_code == 404
    assert post(fe, "/v1/responses", {"model": MODEL, "input": "hi"}).status_code == 200


def test_text_format_holds_the_output_to_the_schema_as_chats_response_format_does():
    fe = make_frontend(decode=FakePool("decode_pool", script=('{"ok": true}',)))
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    fmt = {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}
    r = post(fe, "/v1/responses", {"model": MODEL, "input": "ok?", "text": fmt})
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["output"][0]["content"][0]["text"]) == {"ok": True}
    assert r.json()["text"]["format"]["schema"] == schema
    chat_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "ok?"}], "response_format": chat_format}
    assert post(fe, "/v1/chat/completions", chat).status_code == 200
    responses_request, chat_request = fe.decode.generates
    assert responses_request.sampling.structured == chat_request.sampling.structured is not None


def test_a_background_response_is_queued_then_stored_whole_and_a_finished_one_cannot_be_cancelled():
    fe = make_frontend(decode=FakePool("decode_pool", script=("a", "b")))

    async def go():
        async with fe.client() as c:
            queued = (await c.post("/v1/responses", json={"model": MODEL, "input": "hi", "background": True})).json()
            for _ in range(100):
                got = (await c.get(f"/v1/responses/{queued['id']}")).json()
                if got["status"] not in ("queued", "in_progress"):
                    break
                await asyncio.sleep(0.01)
            cancel = await c.post(f"/v1/responses/{queued['id']}/cancel")
            return queued, got, cancel

    queued, got, cancel = run(go())
    assert queued["status"] == "queued" and queued["background"] is True and queued["output"] == []
    assert got["status"] == "completed" and got["output"][0]["content"][0]["text"] == "ab" and got["usage"]
    assert cancel.status_code == 400 and "completed" in cancel.json()["error"]["message"]


def test_cancelling_a_running_background_response_aborts_its_engine_request_and_stays_cancelled():
    fe = make_frontend(decode=FakePool("decode_pool", chunk_delay_s=0.05))

    async def go():
        async with fe.client() as c:
            body = {"model": MODEL, "input": "hi", "background": True, "max_output_tokens": 40}
            queued = (await c.post("/v1/responses", json=body)).json()
            while not fe.decode.generates:
                await asyncio.sleep(0.01)
            cancelled = await c.post(f"/v1/responses/{queued['id']}/cancel")
            await asyncio.sleep(0.2)
            return cancelled, (await c.get(f"/v1/responses/{queued['id']}")).json()

    cancelled, later = run(go())
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert later["status"] == "cancelled"
    assert fe.decode.closed  # the engine request was aborted


def test_a_cancel_made_through_another_frontend_reaches_the_run():
    """Two frontends over one store: the one that runs the response learns of the other's cancel."""
    store = BoundedResponseStore()
    running = make_frontend(decode=FakePool("decode_pool", chunk_delay_s=0.05))
    other = make_frontend(decode=FakePool("decode_pool"))
    for fe in (running, other):
        fe.parts.responses.store = store
        fe.parts.responses.cancel_poll_s = 0.01

    async def go():
        async with running.client() as a, other.client() as b:
            body = {"model": MODEL, "input": "hi", "background": True, "max_output_tokens": 40}
            queued = (await a.post("/v1/responses", json=body)).json()
            while not running.decode.generates:
                await asyncio.sleep(0.01)
            cancelled = await b.post(f"/v1/responses/{queued['id']}/cancel")
            for _ in range(100):
                if running.decode.closed:
                    break
                await asyncio.sleep(0.01)
            return cancelled

    assert run(go()).json()["status"] == "cancelled"
    assert running.decode.closed


def test_the_store_stays_within_its_bounds_under_a_flood_and_memory_stays_flat():
    fe = make_frontend(decode=FakePool("decode_pool", script=("x" * 50,)))
    store = BoundedResponseStore(max_responses=20, max_bytes=40_000)
    fe.parts.responses.store = store

    async def flood(n: int) -> list[str]:
        async with fe.client() as c:
            ids = []
            for _ in range(n):
                r = await c.post("/v1/responses", json={"model": MODEL, "input": "hi " * 20, "max_output_tokens": 1})
                ids.append(r.json()["id"])
                for log in (fe.decode.generates, fe.prefill.prefills, fe.decode.closed):
                    log.clear()  # the fake pools' own record of each request
            return ids

    run(flood(50))
    tracemalloc.start()
    run(flood(50))
    gc.collect()  # what is left is what is held, not cyclic garbage awaiting the collector
    before, _ = tracemalloc.get_traced_memory()
    ids = run(flood(300))
    gc.collect()
    after, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(store) <= 20 and store.bytes <= 40_000
    assert after - before < 200_000, after - before  # flat: nothing grows per stored response

    async def status(i: str) -> int:
        async with fe.client() as c:
            return (await c.get(f"/v1/responses/{i}")).status_code

    assert run(status(ids[0])) == 404 and run(status(ids[-1])) == 200  # the oldest evicted, the newest kept


def test_with_the_store_off_store_is_ignored_and_background_is_refused():
    fe = make_frontend(decode=FakePool("decode_pool", script=("ok",)))
    fe.parts.responses.store = None
    done = post(fe, "/v1/responses", {"model": MODEL, "input": "hi"}).json()
    assert done["status"] == "completed"
    follow = post(fe, "/v1/responses", {"model": MODEL, "input": "hi", "previous_response_id": done["id"]})
    assert follow.status_code == 404
    refused = post(fe, "/v1/responses", {"model": MODEL, "input": "hi", "background": True})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "background"


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": "hi", "bogus": 1}, 400, "bogus"),
        ({}, 400, "input"),
        ({"input": "hi", "max_output_tokens": "many"}, 400, "max_output_tokens"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, 400, "input.0.type"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, 400, "input.0.content"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools.0.type"),
        ({"input": "hi", "tools": [{"type": "function", "parameters": {}}]}, 400, "tools.0.name"),
        ({"input": "hi", "tool_choice": "required"}, 400, "tool_choice"),
        ({"input": "hi", "prompt": {"id": "p"}}, 400, "prompt"),
        ({"input": "hi", "temperature": "hot"}, 400, "temperature"),
        ({"input": "hi", "top_k": "many"}, 400, "top_k"),
        ({"input": "hi", "background": True, "stream": True}, 400, "background"),
        ({"input": "hi", "model": "nope"}, 404, "model"),
    ],
)
def test_bad_input_gets_openais_error_shape_and_the_server_keeps_serving(body, status, param):
    fe = make_frontend(decode=FakePool("decode_pool", script=("ok",)))
    r = post(fe, "/v1/responses", {"model": MODEL, **body})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and param in (error["param"] or "") + error["message"]
    assert post(fe, "/v1/responses", {"model": MODEL, "input": "hi"}).status_code == 200


def test_a_request_naming_no_model_is_answered_by_the_served_one():
    fe = make_frontend(decode=FakePool("decode_pool", script=("ok",)))
    r = post(fe, "/v1/responses", {"input": "hi"})
    assert r.status_code == 200 and r.json()["model"] == MODEL


def test_the_service_needs_no_app():
    """The service alone (as the shell builds it) answers and stores."""
    fe = make_frontend(decode=FakePool("decode_pool", script=("ok",)))
    service = ResponsesService(fe.service, BoundedResponseStore(), new_id=lambda: "1")
    response = run(service.create(json.dumps({"model": MODEL, "input": "hi"}).encode()))
    assert response["id"] == "resp_1" and run(service.retrieve("resp_1"))["output"] == response["output"]


def test_a_stored_response_is_its_tenants_alone():
    """Another tenant's key finds no stored response of this one: not to read, continue or cancel (404, as an
    unknown id)."""
    from tests.unit.test_slo_classes import CLASSES, KEYS

    fe = make_frontend(
        decode=FakePool("decode_pool", script=("ok",)), traffic=CLASSES, tenant_keys=KEYS, disaggregated=True
    )
    chat, jobs = ({"authorization": f"Bearer {KEYS[t]}"} for t in ("chat", "jobs"))

    async def go():
        async with fe.client() as c:
            made = (await c.post("/v1/responses", json={"model": MODEL, "input": "hi"}, headers=chat)).json()
            follow = {"model": MODEL, "input": "more", "previous_response_id": made["id"]}
            return [
                (await c.get(f"/v1/responses/{made['id']}", headers=jobs)).status_code,
                (await c.post("/v1/responses", json=follow, headers=jobs)).status_code,
                (await c.post(f"/v1/responses/{made['id']}/cancel", headers=jobs)).status_code,
                (await c.get(f"/v1/responses/{made['id']}", headers=chat)).status_code,
                (await c.post("/v1/responses", json=follow, headers=chat)).status_code,
            ]

    assert run(go()) == [404, 404, 404, 200, 200]


class _UnreachableStore(BoundedResponseStore):
    """A store whose replica does not answer (the far side of the store's boundary)."""

    async def put(self, record):
        raise ConnectionError("store replica gone")

    async def get(self, response_id):
        raise ConnectionError("store replica gone")


def test_a_store_that_fails_or_refuses_leaves_the_answer_served_and_counted():
    fe = make_frontend(decode=FakePool("decode_pool", script=("ok",)))
    fe.parts.responses.store = _UnreachableStore()
    whole = post(fe, "/v1/responses", {"model": MODEL, "input": "hi"})
    streamed = post(fe, "/v1/responses", {"model": MODEL, "input": "hi", "stream": True})
    assert whole.status_code == 200 and whole.json()["output"][0]["content"][0]["text"] == "ok"
    assert streamed.status_code == 200 and '"type": "response.completed"' in streamed.text
    assert fe.metric("orchestrator_responses_unstored_total", {"reason": "unreachable"}) == 2
    # A previous turn the store cannot give: a 503 in OpenAI's shape, nothing guessed.
    follow = post(fe, "/v1/responses", {"model": MODEL, "input": "more", "previous_response_id": whole.json()["id"]})
    assert follow.status_code == 503 and follow.json()["error"]["code"] == "service_unavailable"
    # A response larger than the store's byte bound alone: answered, not stored, counted.
    fe.parts.responses.store = BoundedResponseStore(max_bytes=100)
    big = post(fe, "/v1/responses", {"model": MODEL, "input": "hi"})
    assert big.status_code == 200 and len(fe.parts.responses.store) == 0
    assert fe.metric("orchestrator_responses_unstored_total", {"reason": "too_large"}) == 1


def test_a_stream_whose_generation_fails_ends_with_an_error_event_and_a_background_one_is_stored_failed():
    fe = make_frontend(decode=FakePool("decode_pool", generate_error_after=1))

    async def go():
        async with fe.client() as c:
            body = {"model": MODEL, "input": "hi", "max_output_tokens": 8}
            streamed = (await c.post("/v1/responses", json={**body, "stream": True})).text
            queued = (await c.post("/v1/responses", json={**body, "background": True})).json()
            for _ in range(200):
                got = (await c.get(f"/v1/responses/{queued['id']}")).json()
                if got["status"] not in ("queued", "in_progress"):
                    return streamed, got
                await asyncio.sleep(0.01)
            return streamed, got

    streamed, background = run(go())
    events = [json.loads(line[6:]) for line in streamed.split("\n") if line.startswith("data: ")]
    assert events[-1]["type"] == "error" and "generation failed" in events[-1]["message"]
    assert "response.completed" not in [e["type"] for e in events]
    assert background["status"] == "failed" and "generation failed" in background["error"]["message"]
