"""A streamed response whose reader stops taking data is cut after `limits.stalled_stream_s`: its engine
call closed, its admission slot given back, counted; a reader that comes back gets an error event and the
end. A slow engine with an attentive reader is never cut. On the event loop's virtual clock."""

from __future__ import annotations

import asyncio
import json

from orchestrator.api import sse
from orchestrator.api.responses import Endpoint
from orchestrator.api.stall_guard import cut_when_stalled
from orchestrator.config import LimitsConfig
from tests.factories import MODEL, FakePool, make_frontend
from tests.virtual_time import loop_time, run_virtual

STALL_S = 300.0


def _body(max_tokens: int) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "a", "max_tokens": max_tokens, "stream": True}).encode()


def test_a_reader_that_stops_reading_is_cut_and_its_engine_call_closed():
    fe = make_frontend(
        max_model_len=100_000,
        decode=FakePool("decode_pool", chunk_delay_s=0.01),
        limits=LimitsConfig(stalled_stream_s=STALL_S),
        max_in_flight=1,
    )

    async def go():
        stream = await fe.service.handle(Endpoint.COMPLETIONS, _body(50_000))
        got = [await anext(stream) for _ in range(3)]
        stopped = loop_time()
        await asyncio.sleep(STALL_S - 1)
        assert fe.decode.closed == [] and not fe.service.gate.try_enter()  # not yet: the slot still held
        await asyncio.sleep(2)
        closed_after = loop_time() - stopped
        assert fe.decode.closed == [fe.decode.generates[0].request_id]
        assert fe.service.gate.try_enter()  # the slot came back (taken here: the gate admits one)
        fe.service.gate.leave()
        rest = [event async for event in stream]  # the reader comes back
        return got, closed_after, rest

    got, closed_after, rest = run_virtual(go())
    assert len(got) == 3 and STALL_S <= closed_after <= STALL_S + 1
    assert len(rest) == 1 and "stream cut" in json.loads(rest[0].removeprefix("data: "))["error"]["message"]
    assert fe.metric("orchestrator_stalled_client_streams_total") == 1


def test_a_slow_engine_with_an_attentive_reader_is_not_cut():
    async def slow_source():
        for i in range(3):
            await asyncio.sleep(2 * STALL_S)  # the engine takes its time; the reader waits for it
            yield sse.event({"i": i})

    cuts = []

    async def go():
        return [e async for e in cut_when_stalled(slow_source(), STALL_S, lambda: cuts.append(1))]

    assert len(run_virtual(go())) == 3 and cuts == []


def test_a_reader_that_pauses_under_the_limit_gets_everything():
    fe = make_frontend(max_model_len=4096, limits=LimitsConfig(stalled_stream_s=STALL_S))

    async def go():
        stream = await fe.service.handle(Endpoint.COMPLETIONS, _body(5))
        events = []
        async for event in stream:
            events.append(event)
            await asyncio.sleep(STALL_S - 1)  # a slow reader, never quite stalled
        return events

    events = run_virtual(go())
    assert events[-1] == sse.DONE
    assert sum(len(json.loads(e.removeprefix("data: "))["choices"]) for e in events[:-1]) == 5  # every token
    assert fe.metric("orchestrator_stalled_client_streams_total") == 0


def test_closing_a_stream_closes_its_source_once():
    closed = []

    async def source():
        try:
            yield "a"
            yield "b"
        finally:
            closed.append(1)

    async def go():
        stream = cut_when_stalled(source(), STALL_S, lambda: None)
        first = await anext(stream)
        await stream.aclose()
        return first

    assert run_virtual(go()) == "a" and closed == [1]
