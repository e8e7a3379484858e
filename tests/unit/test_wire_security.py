"""The data plane's doors and bounds, over real loopback sockets: only peers proving the application's secret
are served (a wrong, absent, late or replayed proof closes the connection and is counted), stream ids are
never reused, connections and streams per connection are capped, and a reader that stops reading holds the
replica to a bounded write buffer while the engine's stream waits."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from orchestrator.engines.base import EngineError
from orchestrator.messages import EngineChunk
from orchestrator.wire.client import DataPlaneRefused, ReplicaStreams
from orchestrator.wire.frames import HEADER, ErrorKind, FrameReader, Op, encode, proof
from orchestrator.wire.server import Refusal, StreamServer, WireLimits

from .test_wire import SECRET, ScriptedEngine, request, settle


@contextlib.asynccontextmanager
async def serving(engine, limits: WireLimits = WireLimits()):
    server = StreamServer(engine, SECRET, limits)
    port = await server.start("127.0.0.1", 0)
    try:
        yield server, ("127.0.0.1", port)
    finally:
        server.close()


class RawPeer:
    """A client speaking frames by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def connect(cls, address) -> RawPeer:
        return cls(*await asyncio.open_connection(*address))

    async def frame(self):
        (size,) = HEADER.unpack(await self.reader.readexactly(HEADER.size))
        body = await self.reader.readexactly(size)
        got = []
        FrameReader(lambda *f: got.append(f)).feed(HEADER.pack(size) + body)
        return got[0]

    async def send(self, *frames: bytes) -> None:
        self.writer.write(b"".join(frames))
        await self.writer.drain()

    async def closed_by_server(self) -> bool:
        """Whether the server closed the connection, having sent nothing before but, to a peer without a valid
        proof, its refusal (ERROR 0 refused)."""
        rest = await asyncio.wait_for(self.reader.read(), 5)  # up to the server's close
        frames = []
        FrameReader(lambda *f: frames.append(f)).feed(rest)
        return all(f[0] is Op.ERROR and f[1] == 0 and f[2][0] is ErrorKind.REFUSED for f in frames)

    def close(self) -> None:
        self.writer.close()


async def authenticated(address) -> RawPeer:
    peer = await RawPeer.connect(address)
    op, _, nonce = await peer.frame()
    assert op is Op.CHALLENGE
    await peer.send(encode(Op.AUTH, 0, proof(SECRET, nonce)))
    return peer


def test_only_a_client_proving_the_secret_is_served_and_a_wrong_one_is_counted():
    async def main():
        engine = ScriptedEngine()
        async with serving(engine) as (server, address):
            wrong = ReplicaStreams(b"another application's secret")
            with pytest.raises(DataPlaneRefused):
                await wrong.prefill(address, request())
            wrong.close()
            assert server.refused == {Refusal.AUTH: 1} and engine.started == []
            right = ReplicaStreams(SECRET)
            engine.step(1)
            assert [t async for c in right.generate(address, request(max_tokens=1)) for t in c.token_ids] == [100]
            right.close()

    asyncio.run(main())


def test_a_request_before_the_proof_closes_the_connection_unserved():
    async def main():
        engine = ScriptedEngine()
        async with serving(engine) as (server, address):
            peer = await RawPeer.connect(address)
            await peer.frame()  # CHALLENGE, left unanswered
            await peer.send(encode(Op.GENERATE, 1, request()))
            assert await peer.closed_by_server()
            peer.close()
            assert server.refused == {Refusal.AUTH: 1} and engine.started == []

    asyncio.run(main())


def test_a_proof_replayed_on_another_connection_is_refused():
    async def main():
        async with serving(ScriptedEngine()) as (server, address):
            first = await RawPeer.connect(address)
            _, _, nonce = await first.frame()
            seen = encode(Op.AUTH, 0, proof(SECRET, nonce))  # what an eavesdropper saw
            await first.send(seen)
            second = await RawPeer.connect(address)
            _, _, other_nonce = await second.frame()
            assert other_nonce != nonce
            await second.send(seen)
            assert await second.closed_by_server()
            first.close(), second.close()
            assert server.refused == {Refusal.AUTH: 1}

    asyncio.run(main())


def test_a_connection_that_never_proves_anything_is_closed_at_the_deadline():
    async def main():
        async with serving(ScriptedEngine(), WireLimits(auth_timeout_s=0.05)) as (server, address):
            peer = await RawPeer.connect(address)
            await peer.frame()
            assert await peer.closed_by_server()
            peer.close()
            assert server.refused == {Refusal.AUTH: 1}

    asyncio.run(main())


def test_a_reused_stream_id_is_a_protocol_error():
    async def main():
        engine = ScriptedEngine()
        async with serving(engine) as (server, address):
            peer = await authenticated(address)
            await peer.send(encode(Op.GENERATE, 5, request("a", max_tokens=9)))
            await settle()
            await peer.send(encode(Op.PREFILL, 5, request("b")))  # the running stream's id again
            assert await peer.closed_by_server()
            peer.close()
            await settle()
            assert server.refused == {Refusal.PROTOCOL: 1}
            assert engine.aborted == ["a"]  # the connection's stream ended with it

    asyncio.run(main())


def test_connections_past_the_limit_are_closed_and_counted():
    async def main():
        async with serving(ScriptedEngine(), WireLimits(max_connections=1)) as (server, address):
            first = await authenticated(address)
            second = await RawPeer.connect(address)
            assert await second.closed_by_server()
            first.close(), second.close()
            assert server.refused == {Refusal.CONNECTIONS: 1}

    asyncio.run(main())


def test_streams_past_the_limit_fail_alone_and_the_connection_serves_on():
    async def main():
        engine = ScriptedEngine()
        async with serving(engine, WireLimits(max_streams=1)) as (server, address):
            streams = ReplicaStreams(SECRET)
            running = streams.generate(address, request("a", max_tokens=2))
            engine.step(1)
            await anext(running)
            with pytest.raises(EngineError, match="too many streams"):
                await streams.prefill(address, request("b"))
            engine.step(1)
            assert [t async for c in running for t in c.token_ids] == [101]
            engine.step(1)
            assert (await streams.prefill(address, request("c"))).num_prompt_tokens == 4
            streams.close()
            assert server.refused == {}

    asyncio.run(main())


class EndlessEngine:
    """Yields 64 KiB chunks for as long as it is asked; counts them, and the streams closed."""

    def __init__(self) -> None:
        self.produced = 0
        self.closed = 0

    async def generate(self, request):
        try:
            while True:
                self.produced += 1
                yield EngineChunk(token_ids=(1,), text="x" * 65536, finish_reason=None)
                await asyncio.sleep(0)
        finally:
            self.closed += 1

    async def prefill(self, request):
        raise NotImplementedError


def test_a_reader_that_stops_reading_bounds_the_replicas_buffer_and_pauses_its_stream():
    async def main():
        engine = EndlessEngine()
        limit = 256 * 1024
        async with serving(engine, WireLimits(write_buffer_bytes=limit)) as (server, address):
            peer = await authenticated(address)
            await peer.send(encode(Op.GENERATE, 1, request(max_tokens=10**6)))
            # The kernel's socket buffers fill first; then the transport's own, to the limit; then the stream
            # waits: the engine is asked for nothing more.
            previous = -1
            for _ in range(500):
                await asyncio.sleep(0.01)
                if engine.produced == previous:
                    break
                previous = engine.produced
            (connection,) = server.connections
            assert engine.produced == previous, "the stream kept pulling from the engine"
            assert connection._transport.get_write_buffer_size() <= limit + 70_000
            peer.close()

    asyncio.run(main())


def test_a_stream_whose_reader_stays_stalled_is_cut_and_its_engine_stream_closed():
    async def main():
        engine = EndlessEngine()
        limits = WireLimits(write_buffer_bytes=64 * 1024, stalled_stream_s=0.2)
        async with serving(engine, limits) as (server, address):
            peer = await authenticated(address)
            await peer.send(encode(Op.GENERATE, 1, request(max_tokens=10**6)))
            for _ in range(500):
                await asyncio.sleep(0.01)
                if server.stalled_streams:
                    break
            await settle()
            assert server.stalled_streams == 1 and engine.closed == 1
            assert server.running() == 0
            peer.close()

    asyncio.run(main())
