"""A stream whose client stops reading is parked, then continued: the request path over the real data plane
(a frontend's `ReplicaStreams` and a replica's `StreamServer` on loopback sockets), the engine scripted on the
far side. Parked, the replica's engine request is aborted; when the consumer asks for more, the prompt plus
the tokens it got continue on a replica and the client sees one unbroken stream."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from orchestrator.messages import (
    EngineChunk,
    EngineRequest,
    FinishReason,
    SamplingSpec,
    StructuredKind,
    StructuredOutput,
)
from orchestrator.metrics import FrontendMetrics
from orchestrator.pools import ReplicaView, StreamParked
from orchestrator.request_path import RequestPath, RequestTrace
from orchestrator.routing.round_robin import RoundRobinScheduler
from orchestrator.wire.client import Parking, ReplicaStreams
from orchestrator.wire.server import StreamServer
from tests.unit.test_wire import settle

SECRET = b"the application's data-plane secret"
OUT = 5000
PROMPT = (1, 2, 3, 4)


class GreedyEngine:
    """Token k of a prompt's output is OUT + k, one chunk per `step()`: a continuation (prompt plus k
    output tokens) picks up at OUT + k, as greedy decoding does."""

    def __init__(self) -> None:
        self.steps: asyncio.Queue[None] = asyncio.Queue()
        self.started: list[EngineRequest] = []
        self.aborted: list[str] = []

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            self.steps.put_nowait(None)

    async def generate(self, request: EngineRequest):
        self.started.append(request)
        already = sum(1 for t in request.prompt_token_ids if t >= OUT)
        n = request.sampling.max_tokens
        try:
            for i in range(n):
                await self.steps.get()
                yield EngineChunk(
                    token_ids=(OUT + already + i,),
                    text=f"w{OUT + already + i} ",
                    finish_reason=FinishReason.LENGTH if i == n - 1 else None,
                    num_prompt_tokens=len(request.prompt_token_ids) if i == 0 else 0,
                )
        except asyncio.CancelledError:
            self.aborted.append(request.request_id)
            raise

    async def prefill(self, request: EngineRequest):
        raise NotImplementedError


class WirePool:
    """A decode pool of one replica, reached over the data plane as the frontend reaches it."""

    name = "decode_pool"

    def __init__(self, streams: ReplicaStreams, address: tuple[str, int]) -> None:
        self.streams, self.address = streams, address

    def replicas(self) -> list[ReplicaView]:
        return [ReplicaView("d0")]

    async def prefill(self, request, view=None):
        raise NotImplementedError

    def generate(self, request: EngineRequest, view: ReplicaView | None = None):
        return self.streams.generate(self.address, request)


@contextlib.asynccontextmanager
async def served(parking: Parking | None, now: list[float]):
    engine = GreedyEngine()
    server = StreamServer(engine, SECRET)
    port = await server.start("127.0.0.1", 0)
    streams = ReplicaStreams(SECRET, parking=parking, clock=lambda: now[0])
    try:
        yield engine, server, streams, ("127.0.0.1", port)
    finally:
        streams.close()
        server.close()


def request(max_tokens: int, structured: StructuredOutput | None = None) -> EngineRequest:
    return EngineRequest("req", PROMPT, SamplingSpec(max_tokens=max_tokens, structured=structured), target_replica="d0")


def tokens(chunks: list[EngineChunk]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def test_a_stalled_stream_is_parked_and_continued_whole():
    async def main():
        now = [0.0]
        async with served(Parking(after_s=2.0, after_tokens=100), now) as (engine, server, streams, address):
            path = RequestPath(WirePool(streams, address), None, RoundRobinScheduler(), FrontendMetrics(), 5)
            trace = RequestTrace()
            stream = path.stream(request(max_tokens=10), trace)
            engine.step()
            first = await anext(stream)
            # The client stops reading: three tokens arrive within 2 s of its last take, a fourth after.
            engine.step(3)
            await settle()
            assert engine.aborted == [] and server.running() == 1
            now[0] = 2.5
            engine.step()
            await settle()
            assert engine.aborted == ["req"] and server.running() == 0  # the replica holds nothing for it
            # The client reads again: what arrived, then the rest from a continuation of prompt + 5 tokens.
            engine.step(20)
            rest = [c async for c in stream]
            assert tokens([first, *rest]) == [OUT + k for k in range(10)]  # none lost, none repeated
            assert rest[-1].finish_reason is FinishReason.LENGTH
            continued = engine.started[1]
            assert continued.prompt_token_ids == PROMPT + tuple(OUT + k for k in range(5))
            assert continued.sampling.max_tokens == 5 and continued.request_id == "req-m1"
            assert (trace.parks, trace.migrations) == (1, 0)
            assert path.metrics.parked_streams._value.get() == 1
            assert path.metrics.migrations._value.get() == 0
            assert path.metrics.decode_replicas_set_aside._value.get() == 0  # no replica was at fault

    asyncio.run(main())


def test_unread_tokens_past_the_bound_park_the_stream_at_once():
    async def main():
        now = [0.0]
        async with served(Parking(after_s=60.0, after_tokens=3), now) as (engine, _, streams, address):
            stream = streams.generate(address, request(max_tokens=10))
            engine.step()
            await anext(stream)
            engine.step(2)
            await settle()
            assert engine.aborted == []
            engine.step()  # the third unread token, with no time gone by
            await settle()
            assert engine.aborted == ["req"]
            assert tokens([await anext(stream)]) == [OUT + 1, OUT + 2, OUT + 3]
            with pytest.raises(StreamParked):
                await anext(stream)

    asyncio.run(main())


def test_a_consumer_waiting_for_a_slow_first_token_is_not_parked():
    async def main():
        now = [0.0]
        async with served(Parking(after_s=2.0, after_tokens=100), now) as (engine, _, streams, address):
            stream = streams.generate(address, request(max_tokens=4))
            waiting = asyncio.ensure_future(anext(stream))
            await settle()
            now[0] = 60.0  # a long prefill: the consumer waits for its first token all along
            engine.step(4)
            chunks = [await waiting] + [c async for c in stream]
            assert tokens(chunks) == [OUT + k for k in range(4)] and engine.aborted == []

    asyncio.run(main())


def test_a_stream_whose_end_has_arrived_is_not_parked():
    async def main():
        now = [0.0]
        async with served(Parking(after_s=2.0, after_tokens=100), now) as (engine, _, streams, address):
            stream = streams.generate(address, request(max_tokens=3))
            engine.step()
            await anext(stream)
            engine.step()  # the consumer is away
            await settle()
            now[0] = 30.0
            engine.step()  # its last token arrives long after the consumer's last take: nothing left to spare
            await settle()
            assert tokens([c async for c in stream]) == [OUT + 1, OUT + 2] and engine.aborted == []

    asyncio.run(main())


def test_a_constrained_answer_is_never_parked():
    # Its grammar cannot resume mid-output on another engine request: it runs to its end, unread.
    async def main():
        now = [0.0]
        schema = StructuredOutput(StructuredKind.JSON_OBJECT)
        async with served(Parking(after_s=2.0, after_tokens=2), now) as (engine, _, streams, address):
            stream = streams.generate(address, request(max_tokens=6, structured=schema))
            engine.step()
            await anext(stream)
            now[0] = 10.0
            engine.step(5)
            await settle()
            assert engine.aborted == []
            assert tokens([c async for c in stream]) == [OUT + k for k in range(1, 6)]

    asyncio.run(main())


def test_without_parking_a_stalled_stream_runs_to_its_end():
    async def main():
        now = [0.0]
        async with served(None, now) as (engine, _, streams, address):  # `stalled_readers.park: false`
            stream = streams.generate(address, request(max_tokens=5))
            engine.step()
            await anext(stream)
            now[0] = 30.0
            engine.step(4)  # arriving long after the consumer's last take
            await settle()
            assert engine.aborted == [] and tokens([c async for c in stream]) == [OUT + k for k in range(1, 5)]

    asyncio.run(main())
