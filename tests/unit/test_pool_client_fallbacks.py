"""The Serve pool client's choice of transport: the direct data plane to the replica a request was routed
on, or Serve's handle. Every call through the handle while the data plane is on is counted, with its
reason: a request's calls go through a real wire server, or through a scripted handle (the far side of
Serve's boundary) that counts them, and the two counts must agree."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, replace

from deployments.pool_client import ServePoolClient
from deployments.registries import register
from orchestrator.engines.base import EngineInfo, EngineRole
from orchestrator.metrics import DirectPathFallbacks
from orchestrator.pools import DirectPathFallback, ReplicaView
from orchestrator.wire.client import ReplicaStreams
from orchestrator.wire.server import StreamServer
from tests.unit.test_wire import ScriptedEngine, request


class _ScriptedHandle:
    """Serve's deployment handle as the pool client uses it: `generate` streams two chunks, `prefill` answers."""

    deployment_name = "decode_pool"
    app_name = "fallback-test"

    def __init__(self, engine: ScriptedEngine) -> None:
        self.engine = engine
        self.calls = 0
        self.generate = self.prefill = self

    def options(self, stream: bool = False) -> _ScriptedHandle:
        return self

    def remote(self, req):
        self.calls += 1
        self.engine.step(req.sampling.max_tokens)
        return self.engine.generate(req)


def _info(port: int | None) -> EngineInfo:
    return EngineInfo(EngineRole.DECODE, "sim", "1", "e", "m", 32, 1024, "127.0.0.1", stream_port=port)


def _counted(fallbacks: DirectPathFallbacks) -> dict[str, float]:
    """The exported counter, by reason."""
    return {s.labels["reason"]: s.value for m in fallbacks.collect() for s in m.samples}


@dataclass
class _Setup:
    engine: ScriptedEngine  # behind the replica's data-plane server
    server: StreamServer
    handle: _ScriptedHandle
    fallbacks: DirectPathFallbacks
    client: ServePoolClient
    live: ReplicaView  # the replica, as routed on: live, with its data-plane port


@contextlib.asynccontextmanager
async def _pool(server_secret: bytes = b"secret", client_secret: bytes = b"secret"):
    """A replica's data-plane server and a scripted handle to its pool, and the pool client over both."""
    engine = ScriptedEngine()
    server = StreamServer(engine, server_secret)
    port = await server.start("127.0.0.1", 0)
    handle = _ScriptedHandle(ScriptedEngine())
    register(handle.app_name, handle.deployment_name, None)
    fallbacks = DirectPathFallbacks()
    streams = ReplicaStreams(client_secret)
    try:
        client = ServePoolClient(handle, streams, fallbacks)
        yield _Setup(engine, server, handle, fallbacks, client, ReplicaView("d0", _info(port)))
    finally:
        streams.close()
        server.close()


async def _drain(client: ServePoolClient, req, view) -> tuple[int, ...]:
    """The tokens of the stream (the data plane merges chunks that queue)."""
    return tuple([t async for c in client.generate(req, view) for t in c.token_ids])


def test_every_call_off_the_data_plane_is_counted_with_its_reason():
    async def scenario():
        async with _pool() as t:
            engine, handle, fallbacks, client, live = t.engine, t.handle, t.fallbacks, t.client, t.live
            port = live.info.stream_port
            engine.step(3)
            assert await _drain(client, request(), live) == (100, 101, 102)  # routed on a live view with a port: direct
            assert (handle.calls, fallbacks.total()) == (0, 0)
            cases = [
                (replace(request(), target_replica=None), None, DirectPathFallback.NO_REPLICA_NAMED),
                (request(), None, DirectPathFallback.REPLICA_NOT_LIVE),
                (request(), ReplicaView("d1", _info(port)), DirectPathFallback.REPLICA_NOT_LIVE),
                (request(), ReplicaView("d0", _info(None)), DirectPathFallback.NO_STREAM_PORT),
                (request(), ReplicaView("d0"), DirectPathFallback.NO_STREAM_PORT),
            ]
            for k, (req, view, reason) in enumerate(cases, start=1):
                assert await _drain(client, req, view) == (100, 101, 102)  # slower, still answered
                assert handle.calls == fallbacks.total() == k
                assert _counted(fallbacks)[reason.value] >= 1
            exposition = "".join(
                f"{s.name}{s.labels}{s.value}" for m in fallbacks.collect() for s in m.samples if s.value
            )
            assert "no_stream_port" in exposition and "replica_not_live" in exposition
            uncounted = DirectPathFallbacks()
            serve_only = ServePoolClient(handle, None, uncounted)
            await _drain(serve_only, request(), live)  # the data plane off: the handle is the path, not a fallback
            assert handle.calls == len(cases) + 1 and uncounted.total() == 0

    asyncio.run(scenario())


def test_a_replica_of_another_deploy_refusing_the_proof_is_reached_through_the_handle_and_counted():
    """During a rolling update a frontend may hold the old deploy's secret: the new replica refuses its proof
    (ERROR refused, before any token), and the call takes Serve's handle instead: a slower answer, counted."""

    async def scenario():
        async with _pool(server_secret=b"the new deploy's secret", client_secret=b"the old deploy's secret") as t:
            for k in (1, 2):
                assert await _drain(t.client, request(), t.live) == (100, 101, 102)
                assert t.handle.calls == k and _counted(t.fallbacks) == {DirectPathFallback.REFUSED.value: float(k)}
            assert t.engine.started == [] and t.server.refused["auth"] == 2

    asyncio.run(scenario())
