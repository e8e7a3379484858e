"""The replica's end of the direct data plane.

    connection:  GENERATE id req -> task: for chunk in handler.generate(req): CHUNKS id [chunk]; END id
                 PREFILL  id req -> task: RESULT id handler.prefill(req)
                 CANCEL   id     -> cancel that task (the engine aborts the request)
                 failure         -> ERROR id (rejected | failed, message)
                 connection lost -> cancel every task of the connection
    drain():     new requests get ERROR draining; wait for the running ones

A frame that does not decode closes its connection and cancels its streams.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

from orchestrator.engines.base import EngineRequestRejected
from orchestrator.messages import EngineChunk, EngineRequest, PrefillResult
from orchestrator.wire.frames import ErrorKind, FrameReader, Op, ProtocolError, encode

log = logging.getLogger(__name__)


class StreamHandler(Protocol):
    def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]: ...

    async def prefill(self, request: EngineRequest) -> PrefillResult: ...


class _Connection(asyncio.Protocol):
    def __init__(self, server: StreamServer) -> None:
        self._server = server
        self._reader = FrameReader(self._on_frame)
        self._tasks: dict[int, asyncio.Task] = {}
        self._transport: asyncio.Transport | None = None

    # -- asyncio.Protocol -----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            self._reader.feed(data)
        except ProtocolError as e:
            log.warning("dropping a data-plane connection: %s", e)
            assert self._transport is not None
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        for task in self._tasks.values():
            task.cancel()

    # -- frames ---------------------------------------------------------------

    def _on_frame(self, op: Op, stream_id: int, payload: Any) -> None:
        if op is Op.CANCEL:
            task = self._tasks.get(stream_id)
            if task is not None:
                task.cancel()
            return
        if op not in (Op.GENERATE, Op.PREFILL):
            raise ProtocolError(f"a client does not send {op.name}")
        if self._server.draining:
            self._send(encode(Op.ERROR, stream_id, (ErrorKind.DRAINING, "replica is draining")))
            return
        run = self._generate if op is Op.GENERATE else self._prefill
        task = asyncio.ensure_future(run(stream_id, payload))
        self._tasks[stream_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(stream_id, None))

    def _send(self, frame: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(frame)

    async def _generate(self, stream_id: int, request: EngineRequest) -> None:
        async def run() -> None:
            async for chunk in self._server.handler.generate(request):
                self._send(encode(Op.CHUNKS, stream_id, (chunk,)))
            self._send(encode(Op.END, stream_id))

        await self._guarded(stream_id, run())

    async def _prefill(self, stream_id: int, request: EngineRequest) -> None:
        async def run() -> None:
            self._send(encode(Op.RESULT, stream_id, await self._server.handler.prefill(request)))

        await self._guarded(stream_id, run())

    async def _guarded(self, stream_id: int, work) -> None:
        try:
            await work
        except asyncio.CancelledError:
            pass  # the client cancelled or left; the engine aborted the request
        except EngineRequestRejected as e:
            self._send(encode(Op.ERROR, stream_id, (ErrorKind.REJECTED, str(e))))
        except Exception as e:
            self._send(encode(Op.ERROR, stream_id, (ErrorKind.FAILED, f"{type(e).__name__}: {e}")))

    def running(self) -> int:
        return len(self._tasks)


class StreamServer:
    def __init__(self, handler: StreamHandler) -> None:
        self.handler = handler
        self.connections: set[_Connection] = set()
        self.draining = False
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: any free port); returns the port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(lambda: _Connection(self), host, port)
        return self._server.sockets[0].getsockname()[1]

    def running(self) -> int:
        """Requests in flight over every connection."""
        return sum(c.running() for c in self.connections)

    async def drain(self, timeout_s: float, poll_s: float = 0.1) -> int:
        """Refuse new requests and wait up to `timeout_s` for the running ones;
        returns how many were still running at the deadline."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.running() and loop.time() < deadline:
            await asyncio.sleep(poll_s)
        return self.running()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            if connection._transport is not None:
                connection._transport.close()
