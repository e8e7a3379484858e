"""Fuzzing the data plane (hypothesis): the frame decoder takes any bytes, split anywhere, and either decodes
frames or raises ProtocolError; a live replica server fed random frame sequences, authenticated or not, lets
nothing escape to its event loop, and the next honest client is served."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.messages import EngineRequest, SamplingSpec
from orchestrator.wire.client import ReplicaStreams
from orchestrator.wire.frames import HEADER, MAX_FRAME_BYTES, ErrorKind, FrameReader, Op, ProtocolError, encode, proof
from orchestrator.wire.server import StreamServer

from .test_wire import SECRET, ScriptedEngine

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _requests() -> st.SearchStrategy[EngineRequest]:
    return st.builds(
        EngineRequest,
        request_id=st.text(min_size=1, max_size=8),
        prompt_token_ids=st.lists(st.integers(0, 1000), min_size=1, max_size=8).map(tuple),
        sampling=st.builds(SamplingSpec, max_tokens=st.integers(1, 3)),
    )


def _frames() -> st.SearchStrategy[bytes]:
    """Frames a peer might send: well-formed ones of every op (a client's and a server's), with any stream id
    and any payload that encodes, and garbage."""
    stream_id = st.integers(0, 2**31)
    error = st.tuples(st.sampled_from(ErrorKind), st.text())
    payload = st.one_of(st.none(), st.binary(max_size=40), _requests(), error)
    well_formed = st.builds(lambda op, sid, p: encode(op, sid, p), st.sampled_from(Op), stream_id, payload)
    garbage = st.binary(min_size=1, max_size=64)
    oversize = st.just(HEADER.pack(MAX_FRAME_BYTES + 1))
    return st.one_of(well_formed, garbage, oversize)


@FUZZ
@given(data=st.binary(max_size=512), cuts=st.lists(st.integers(0, 512), max_size=8))
def test_the_decoder_takes_any_bytes_split_anywhere(data, cuts):
    reader = FrameReader(lambda *frame: None)
    points = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    try:
        for a, b in zip(points, points[1:]):
            reader.feed(data[a:b])
    except ProtocolError:
        pass


@FUZZ
@given(frames=st.lists(_frames(), min_size=1, max_size=6), prove=st.booleans())
def test_a_live_server_survives_any_frame_sequence_and_serves_the_next_client(frames, prove):
    async def main():
        unhandled: list[dict] = []  # what reached the event loop uncaught (a protocol method that raised)
        asyncio.get_running_loop().set_exception_handler(lambda _, context: unhandled.append(context))
        engine = ScriptedEngine()
        server = StreamServer(engine, SECRET)
        port = await server.start("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
            challenge = []
            FrameReader(lambda *f: challenge.append(f)).feed(HEADER.pack(size) + await reader.readexactly(size))
            if prove:
                writer.write(encode(Op.AUTH, 0, proof(SECRET, challenge[0][2])))
            for frame in frames:
                writer.write(frame)
            await writer.drain()
            engine.step(10)
            for _ in range(5):
                await asyncio.sleep(0)
            writer.close()
            honest = ReplicaStreams(SECRET)
            request = EngineRequest("honest", (1, 2), SamplingSpec(max_tokens=1))
            engine.step(1)
            chunks = [c async for c in honest.generate(("127.0.0.1", port), request)]
            assert [t for c in chunks for t in c.token_ids] == [100]
            honest.close()
            assert unhandled == []
        finally:
            server.close()

    asyncio.run(main())
