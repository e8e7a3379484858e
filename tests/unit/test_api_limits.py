"""Admission control, request limits and API keys, over fake pools."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import pytest

from orchestrator.api.fan_out import CHUNKS_QUEUED_PER_CHOICE
from orchestrator.api.responses import Endpoint
from orchestrator.config import LimitsConfig
from tests.factories import MODEL, FakePool, make_frontend, run


def _body(**kw) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "a b", "max_tokens": 2, **kw}).encode()


async def _post(fe, body: bytes, headers=None):
    async with fe.client() as c:
        return await c.post(
            "/v1/completions", content=body, headers={"content-type": "application/json", **(headers or {})}
        )


def test_beyond_the_in_flight_limit_requests_get_429_with_retry_after_and_slots_come_back():
    fe = make_frontend(max_in_flight=2, decode=FakePool("decode_pool", chunk_delay_s=0.05))

    async def go():
        slow = [asyncio.create_task(_post(fe, _body(max_tokens=10))) for _ in range(2)]
        await asyncio.sleep(0.05)
        rejected = await _post(fe, _body())
        done = await asyncio.gather(*slow)
        after = await _post(fe, _body())
        return rejected, done, after

    rejected, done, after = run(go())
    assert rejected.status_code == 429 and rejected.headers["retry-after"] == "2"
    assert rejected.json()["error"]["code"] == "rate_limit_exceeded"
    assert [r.status_code for r in done] == [200, 200] and after.status_code == 200
    assert fe.service.gate.in_flight == 0
    assert fe.metric("orchestrator_requests_total", {"endpoint": "completions", "outcome": "rejected"}) == 1


def test_admission_counts_engine_streams_prompts_times_n_not_requests():
    """A request holds one stream a prompt and choice: at a limit of 4, one request of 2 prompts × n=2 fills the
    gate, the next single prompt gets a 429, and a request larger than the limit still runs when it is alone."""
    fe = make_frontend(max_in_flight=4, decode=FakePool("decode_pool", chunk_delay_s=0.01))

    async def go():
        wide = await fe.service.handle(Endpoint.COMPLETIONS, _body(stream=True, prompt=["a b", "c d"], n=2))
        held = fe.service.gate.in_flight
        single = await _post(fe, _body())
        await anext(wide)
        await wide.aclose()
        huge = await _post(fe, _body(prompt=["a", "b", "c"], n=3))  # 9 streams, alone: runs, holding all 4
        return held, single, fe.service.gate.in_flight, huge

    held, single, after, huge = run(go())
    assert held == 4 and single.status_code == 429 and after == 0
    assert huge.status_code == 200 and len(huge.json()["choices"]) == 9


@dataclass
class _CountingPool(FakePool):
    """A FakePool counting the chunks its engines have produced."""

    produced: int = 0

    async def generate(self, request, view=None):
        async for chunk in super().generate(request, view):
            self.produced += 1
            yield chunk


def test_a_reader_that_falls_behind_holds_every_choice_at_a_bounded_queue():
    """n=4 choices of 50 tokens, streamed to a reader that takes one event and stops: the choices' pumps wait at
    a bounded queue instead of draining the engines into memory."""
    pool = _CountingPool("decode_pool")
    fe = make_frontend(decode=pool)

    async def go():
        stream = await fe.service.handle(Endpoint.COMPLETIONS, _body(stream=True, n=4, max_tokens=50))
        await anext(stream)
        for _ in range(200):
            await asyncio.sleep(0)
        produced = pool.produced
        await stream.aclose()
        return produced

    assert run(go()) <= 4 * (CHUNKS_QUEUED_PER_CHOICE + 2)


def test_streams_hold_their_slot_until_closed_even_if_never_read():
    fe = make_frontend(max_in_flight=1, decode=FakePool("decode_pool", chunk_delay_s=0.01))

    async def go():
        stream = await fe.service.handle(Endpoint.COMPLETIONS, _body(stream=True, max_tokens=50))
        assert fe.service.gate.in_flight == 1
        await anext(stream)
        await stream.aclose()
        assert fe.service.gate.in_flight == 0
        unread = await fe.service.handle(Endpoint.COMPLETIONS, _body(stream=True))
        del unread  # dropped without iteration: the slot must not leak
        import gc

        gc.collect()
        return fe.service.gate.in_flight

    assert run(go()) == 0


def test_client_errors_and_engine_errors_release_their_slot():
    fe = make_frontend(max_in_flight=1, decode=FakePool("decode_pool", generate_error_after=0))
    for body in (b"{bad", _body(model="nope"), _body()):
        run(_post(fe, body))
    assert fe.service.gate.in_flight == 0


@pytest.mark.parametrize(
    "limits, body, status, param",
    [
        (LimitsConfig(max_request_bytes=100), _body(prompt="x " * 200), 413, None),
        (LimitsConfig(max_prompt_tokens=3), _body(prompt="a b c d"), 400, "prompt"),
        (LimitsConfig(max_output_tokens=5), _body(max_tokens=6), 400, "max_tokens"),
        (LimitsConfig(max_stop_strings=2), _body(stop=["a", "b", "c"]), 400, "stop"),
        (LimitsConfig(max_stop_string_chars=4), _body(stop=["abcde"]), 400, "stop"),
    ],
)
def test_limits_are_enforced_before_any_engine_sees_the_request(limits, body, status, param):
    fe = make_frontend(limits=limits)
    r = run(_post(fe, body))
    assert r.status_code == status and r.json()["error"]["param"] == param
    assert not fe.decode.generates and not fe.prefill.prefills


def test_a_chunked_body_is_cut_off_at_the_limit():
    fe = make_frontend(limits=LimitsConfig(max_request_bytes=64))

    async def chunks():
        for _ in range(100):
            yield b'{"model": "xxxxxxxxxxxxxxxx", '

    async def go():
        async with fe.client() as c:
            return await c.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})

    assert run(go()).status_code == 413


def test_the_default_output_limit_caps_an_open_ended_chat():
    fe = make_frontend(max_model_len=100, limits=LimitsConfig(max_output_tokens=7))

    async def go():
        async with fe.client() as c:
            return await c.post(
                "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            )

    assert run(go()).status_code == 200 and fe.decode.generates[0].sampling.max_tokens == 7


def test_an_api_key_guards_the_api_but_not_health():
    fe = make_frontend(api_key="s3cret")

    async def go():
        async with fe.client() as c:
            return (
                await c.post("/v1/completions", content=_body()),
                await c.post("/v1/completions", content=_body(), headers={"authorization": "Bearer wrong"}),
                await c.post("/v1/completions", content=_body(), headers={"authorization": "Bearer s3cret"}),
                await c.get("/v1/models"),
                await c.get("/health"),
                await c.get("/pools"),
            )

    missing, wrong, good, models, health, pools = run(go())
    assert missing.status_code == wrong.status_code == 401 == models.status_code
    assert pools.status_code == 403  # the admin surface: no admin key configured, closed to every user key
    assert missing.json()["error"]["code"] == "invalid_api_key"
    assert good.status_code == 200 and health.status_code == 200


def test_a_body_nested_too_deeply_is_a_400_and_the_server_keeps_serving():
    """200 KB of nested arrays fit the size limit; their depth must not
    become a 500 (json's RecursionError)."""
    fe = make_frontend()
    deep = b'{"model": "' + MODEL.encode() + b'", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = run(_post(fe, deep))
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
    assert run(_post(fe, _body())).status_code == 200


def test_a_schema_nested_past_the_configured_depth_never_reaches_the_engine():
    """Within json's recursion limit, yet past `max_json_depth`: the grammar
    compiler would pay for it, so the frontend refuses it."""
    fe = make_frontend(limits=LimitsConfig(max_json_depth=20))

    def schema(depth: int) -> dict:
        inner: dict = {"type": "string"}
        for _ in range(depth):
            inner = {"type": "object", "properties": {"a": inner}}
        return inner

    def body(depth: int) -> bytes:
        fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema(depth)}}
        return json.dumps({"model": MODEL, "prompt": "a", "max_tokens": 1, "response_format": fmt}).encode()

    r = run(_post(fe, body(12)))  # 4 levels around the schema, 2 a nesting step: depth 28
    assert r.status_code == 400 and "deeper than 20" in r.json()["error"]["message"]
    assert fe.decode.generates == [] and fe.prefill.prefills == []
    assert run(_post(fe, body(6))).status_code == 200  # depth 16
