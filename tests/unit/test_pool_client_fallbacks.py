"""The Serve pool client's choice of transport: the direct data plane to the replica a request was routed
on, or Serve's handle. Every call through the handle while the data plane is on is counted, with its
reason: a request's calls go through a real wire server, or through a scripted handle (the far side of
Serve's boundary) that counts them, and the two counts must agree."""

from __future__ import annotations

import asyncio
from dataclasses import replace

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


async def _drain(client: ServePoolClient, req, view) -> tuple[int, ...]:
    """The tokens of the stream (the data plane merges chunks that queue)."""
    return tuple([t async for c in client.generate(req, view) for t in c.token_ids])


def test_every_call_off_the_data_plane_is_counted_with_its_reason():
    async def scenario():
        engine = ScriptedEngine()
        server = StreamServer(engine, b"secret")
        port = await server.start("127.0.0.1", 0)
        handle = _ScriptedHandle(ScriptedEngine())
        register(handle.app_name, handle.deployment_name, None)
        fallbacks = DirectPathFallbacks()
        streams = ReplicaStreams(b"secret")
        client = ServePoolClient(handle, streams, fallbacks)
        live = ReplicaView("d0", _info(port))
        try:
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
        finally:
            streams.close()
            server.close()

    asyncio.run(scenario())
