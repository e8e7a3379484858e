"""The direct data plane over real loopback sockets: a frontend's
`ReplicaStreams` against a replica's `StreamServer`, whose handler is a
scripted engine (the far side of the boundary)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest

from orchestrator.engines.base import EngineError, EngineRequestRejected
from orchestrator.messages import (
    EngineChunk,
    EngineRequest,
    FinishReason,
    KVTransfer,
    PositionLogprobs,
    PrefillResult,
    SamplingSpec,
    TokenLogprob,
)
from orchestrator.wire import liveness
from orchestrator.wire.client import ReplicaDraining, ReplicaStreams
from orchestrator.wire.frames import HEADER, ErrorKind, FrameReader, Op, ProtocolError, encode
from orchestrator.wire.server import StreamServer

SECRET = b"the application's data-plane secret"


class ScriptedEngine:
    """Emits one chunk per `step()` call, so a test decides when tokens exist."""

    def __init__(self, error: Exception | None = None) -> None:
        self.steps = asyncio.Queue()
        self.started: list[EngineRequest] = []
        self.aborted: list[str] = []
        self.error = error

    def step(self, n: int = 1) -> None:
        for _ in range(n):
            self.steps.put_nowait(None)

    async def generate(self, request: EngineRequest):
        self.started.append(request)
        try:
            for i in range(request.sampling.max_tokens):
                await self.steps.get()
                if self.error is not None:
                    raise self.error
                last = i == request.sampling.max_tokens - 1
                yield EngineChunk(
                    token_ids=(100 + i,),
                    text=f"t{i} ",
                    finish_reason=FinishReason.LENGTH if last else None,
                    num_prompt_tokens=len(request.prompt_token_ids) if i == 0 else 0,
                    num_cached_tokens=2 if i == 0 else 0,
                )
        except asyncio.CancelledError:
            self.aborted.append(request.request_id)
            raise

    async def prefill(self, request: EngineRequest) -> PrefillResult:
        self.started.append(request)
        await self.steps.get()
        if self.error is not None:
            raise self.error
        kv = KVTransfer("engine-p", 1, len(request.prompt_token_ids), {"remote_block_ids": [[3]], "host": "h"})
        return PrefillResult(kv, len(request.prompt_token_ids), 0, replica_id="p0")


def request(rid: str = "r", max_tokens: int = 3) -> EngineRequest:
    return EngineRequest(rid, (1, 2, 3, 4), SamplingSpec(max_tokens=max_tokens, stop=("x",)), target_replica="d0")


@contextlib.asynccontextmanager
async def served(engine: ScriptedEngine):
    server = StreamServer(engine, SECRET)
    port = await server.start("127.0.0.1", 0)
    streams = ReplicaStreams(SECRET)
    try:
        yield server, streams, ("127.0.0.1", port)
    finally:
        streams.close()
        server.close()


async def settle() -> None:
    """Let frames cross the loopback and the loops handle them."""
    for _ in range(20):
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)


def test_frames_round_trip_split_anywhere():
    req = request()
    data = encode(Op.GENERATE, 7, req) + encode(Op.ERROR, 7, (ErrorKind.REJECTED, "bad"))
    got = []
    reader = FrameReader(lambda *frame: got.append(frame))
    for i in range(len(data)):  # one byte at a time
        reader.feed(data[i : i + 1])
    assert got == [(Op.GENERATE, 7, req), (Op.ERROR, 7, (ErrorKind.REJECTED, "bad"))]


def test_frames_refuse_what_the_protocol_does_not_define():
    for bad in (
        HEADER.pack(3) + b"\x93\x63\x01\xc0",  # op 99
        HEADER.pack(2**31),  # oversize
        encode(Op.GENERATE, 1, {"request_id": 5}),
    ):  # not an EngineRequest
        with pytest.raises(ProtocolError):
            FrameReader(lambda *f: None).feed(bad)


def test_chunks_merge_without_losing_tokens():
    a = EngineChunk((1,), "a", None, None, 5, 2)
    b = EngineChunk((2, 3), "bc", FinishReason.STOP, "x")
    assert EngineChunk.merged([a, b]) == EngineChunk((1, 2, 3), "abc", FinishReason.STOP, "x", 5, 2)


def test_merged_chunks_keep_their_log_probabilities():
    # Chunks merge when the frontend reads slower than the engine writes: the
    # prompt's scores ride on the first chunk and must survive the merge.
    def scored(token_id: int) -> PositionLogprobs:
        lp = TokenLogprob(token_id, -0.5, f"t{token_id}", 1)
        return PositionLogprobs(sampled=lp, candidates=(lp,))

    prompt = (None, scored(8), scored(9))
    a = EngineChunk((1,), "a", None, None, 3, 0, logprobs=(scored(1),), prompt_logprobs=prompt)
    b = EngineChunk((2, 3), "bc", FinishReason.STOP, "x", logprobs=(scored(2), scored(3)))
    merged = EngineChunk.merged([a, b])
    assert merged.logprobs == (scored(1), scored(2), scored(3))
    assert merged.prompt_logprobs == prompt
    assert EngineChunk.merged([EngineChunk((1,), "a"), EngineChunk((2,), "b")]).logprobs is None


def test_a_stream_arrives_whole_and_in_order():
    async def main():
        engine = ScriptedEngine()
        async with served(engine) as (_, streams, address):
            engine.step(3)
            chunks = [c async for c in streams.generate(address, request(max_tokens=3))]
            tokens = [t for c in chunks for t in c.token_ids]
            assert tokens == [100, 101, 102]
            assert chunks[0].num_prompt_tokens == 4 and chunks[0].num_cached_tokens == 2
            assert chunks[-1].finish_reason is FinishReason.LENGTH
            assert engine.started[0] == request(max_tokens=3)  # every field crossed

    asyncio.run(main())


def test_chunks_queued_behind_a_slow_consumer_come_as_one():
    async def main():
        engine = ScriptedEngine()
        async with served(engine) as (_, streams, address):
            stream = streams.generate(address, request(max_tokens=4))
            engine.step(1)
            first = await anext(stream)
            engine.step(3)  # three tokens arrive while the consumer is away
            await settle()
            rest = await anext(stream)
            assert (first.token_ids, rest.token_ids) == ((100,), (101, 102, 103))
            assert rest.text == "t1 t2 t3 " and rest.finish_reason is FinishReason.LENGTH
            with pytest.raises(StopAsyncIteration):
                await anext(stream)

    asyncio.run(main())


def test_closing_a_stream_early_aborts_it_in_the_engine():
    async def main():
        engine = ScriptedEngine()
        async with served(engine) as (server, streams, address):
            stream = streams.generate(address, request("gone", max_tokens=10))
            engine.step(1)
            await anext(stream)
            await stream.aclose()
            await settle()
            assert engine.aborted == ["gone"] and server.running() == 0

    asyncio.run(main())


def test_concurrent_streams_share_one_connection():
    async def main():
        engine = ScriptedEngine()
        async with served(engine) as (server, streams, address):

            async def collect(rid):
                return [t async for c in streams.generate(address, request(rid, 2)) for t in c.token_ids]

            tasks = [asyncio.ensure_future(collect(f"r{i}")) for i in range(5)]
            await settle()
            engine.step(10)
            assert await asyncio.gather(*tasks) == [[100, 101]] * 5
            assert len(server.connections) == 1

    asyncio.run(main())


def test_both_ends_probe_a_silent_peer_and_bound_unacknowledged_data():
    """Keepalive and the user timeout on the frontend's and the replica's socket (wire/liveness.py): a host
    that vanishes is found dead in liveness.DEAD_PEER_S (proved on a lost host: benchmarks/host_loss.py)."""

    def settings(sock: socket.socket) -> tuple[int, ...]:
        tcp = socket.IPPROTO_TCP
        options = (socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT, socket.TCP_USER_TIMEOUT)
        return (sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE), *(sock.getsockopt(tcp, o) for o in options))

    async def main():
        engine = ScriptedEngine()
        async with served(engine) as (server, streams, address):
            stream = streams.generate(address, request("r", 1))
            task = asyncio.ensure_future(anext(stream))
            await settle()
            (replica_end,) = server.connections
            ends = [streams._connections[address].transport, replica_end._transport]
            got = [settings(t.get_extra_info("socket")) for t in ends]
            engine.step(1)
            await task
            await stream.aclose()
            return got

    expected = (1, liveness.IDLE_S, liveness.INTERVAL_S, liveness.PROBES, liveness.DEAD_PEER_S * 1000)
    assert asyncio.run(main()) == [expected, expected]


def test_prefill_returns_its_result_and_cancels_on_the_replica():
    async def main():
        engine = ScriptedEngine()
        async with served(engine) as (server, streams, address):
            engine.step(1)
            result = await streams.prefill(address, request("p"))
            assert result.kv_transfer.engine_params == {"remote_block_ids": [[3]], "host": "h"}
            assert result.replica_id == "p0"
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(streams.prefill(address, request("slow")), 0.05)
            await settle()
            assert len(engine.started) == 2 and server.running() == 0  # the CANCEL reached the replica

    asyncio.run(main())


def test_engine_errors_keep_their_kind():
    async def main():
        for error, expected in (
            (EngineRequestRejected("prompt too long"), EngineRequestRejected),
            (RuntimeError("engine died"), EngineError),
        ):
            engine = ScriptedEngine(error=error)
            async with served(engine) as (_, streams, address):
                engine.step(1)
                with pytest.raises(expected, match="prompt too long|engine died"):
                    [c async for c in streams.generate(address, request())]
                engine.step(1)
                with pytest.raises(expected):
                    await streams.prefill(address, request())

    asyncio.run(main())


def test_a_replica_that_goes_away_fails_its_streams_and_a_new_one_is_reached():
    async def main():
        engine = ScriptedEngine()
        async with served(engine) as (server, streams, address):
            stream = streams.generate(address, request(max_tokens=5))
            engine.step(1)
            await anext(stream)
            server.close()  # the replica process dies: its connections drop
            with pytest.raises(EngineError, match="connection lost"):
                await anext(stream)
            # The same address serving again (a restarted replica) is reconnected to.
            again = StreamServer(engine, SECRET)
            await again.start(*address)
            engine.step(1)
            assert [t async for c in streams.generate(address, request(max_tokens=1)) for t in c.token_ids] == [100]
            again.close()

    asyncio.run(main())


def test_an_unreachable_replica_is_an_engine_error():
    async def main():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]  # bound, not listening: refused
            with pytest.raises(EngineError, match="cannot reach"):
                await ReplicaStreams(SECRET).prefill(("127.0.0.1", port), request())

    asyncio.run(main())


def test_a_draining_replica_finishes_running_streams_and_refuses_new_ones():
    async def main():
        engine = ScriptedEngine()
        async with served(engine) as (server, streams, address):
            stream = streams.generate(address, request(max_tokens=2))
            engine.step(1)
            await anext(stream)
            drained = asyncio.ensure_future(server.drain(timeout_s=5, poll_s=0.001))
            await settle()
            with pytest.raises(ReplicaDraining):
                [c async for c in streams.generate(address, request("late"))]
            assert not drained.done()
            engine.step(1)
            assert [t for c in [c async for c in stream] for t in c.token_ids] == [101]
            assert await drained == 0

    asyncio.run(main())


def test_garbage_from_a_peer_closes_only_its_connection():
    async def main():
        engine = ScriptedEngine()
        async with served(engine) as (server, streams, address):
            reader, writer = await asyncio.open_connection(*address)
            (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
            await reader.readexactly(size)  # the server's CHALLENGE
            writer.write(HEADER.pack(2) + b"\xff\xff")
            await writer.drain()
            refusal = encode(Op.ERROR, 0, (ErrorKind.REFUSED, "data-plane proof refused"))
            assert await reader.read() == refusal  # told why, then closed by the server
            writer.close()
            engine.step(1)
            assert [t async for c in streams.generate(address, request(max_tokens=1)) for t in c.token_ids] == [100]

    asyncio.run(main())
