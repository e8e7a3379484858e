"""The replica's end of the direct data plane.

    connection:  past `max_connections` -> closed at once (counted)
                 CHALLENGE 0 nonce; AUTH 0 proof -> the connection serves, or gets ERROR 0 refused and is
                 closed (counted) on a wrong proof, on any other frame first, or with none within
                 `auth_timeout_s`
                 GENERATE id req -> task: for chunk in handler.generate(req): CHUNKS id [chunk]; END id
                 PREFILL  id req -> task: RESULT id handler.prefill(req)
                 CANCEL   id     -> cancel that task (the engine aborts the request)
                 past `max_streams` running -> ERROR id (failed: the frontend routes it elsewhere)
                 failure         -> ERROR id (rejected | failed, message)
                 connection lost -> cancel every task of the connection
    writing:     while the transport's buffer is past `write_buffer_bytes`, streams wait before their next
                 chunk (the engine's own output merges meanwhile): a stalled reader holds at most that;
                 a stream kept waiting `stalled_stream_s` is cut (the engine aborts it)
    drain():     new requests get ERROR draining; wait for the running ones

A frame that does not decode, a stream id not above every earlier one of the connection, or a frame a client
does not send closes its connection and cancels its streams (counted as a protocol error).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from orchestrator.engines.base import EngineRequestRejected
from orchestrator.messages import EngineChunk, EngineRequest, PrefillResult
from orchestrator.wire.frames import NONCE_BYTES, ErrorKind, FrameReader, Op, ProtocolError, encode, proves
from orchestrator.wire.liveness import watch_liveness

log = logging.getLogger(__name__)


class StreamHandler(Protocol):
    def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]: ...

    async def prefill(self, request: EngineRequest) -> PrefillResult: ...


@dataclass(frozen=True)
class WireLimits:
    max_connections: int = 256
    max_streams: int = 1024  # running on one connection
    write_buffer_bytes: int = 1 << 20  # a connection's unsent bytes past which its streams wait
    auth_timeout_s: float = 5.0
    stalled_stream_s: float = 300.0  # a stream kept waiting this long for its reader is cut (the engine aborts)


class Refusal:
    """Why a connection was closed: the keys of `StreamServer.refused`."""

    CONNECTIONS = "connections"  # past max_connections
    AUTH = "auth"  # wrong, missing or late proof
    PROTOCOL = "protocol"  # a frame that breaks the protocol after authentication


class _Connection(asyncio.Protocol):
    def __init__(self, server: StreamServer) -> None:
        self._server = server
        self._reader = FrameReader(self._on_frame)
        self._tasks: dict[int, asyncio.Task] = {}
        self._transport: asyncio.Transport | None = None
        self._nonce = os.urandom(NONCE_BYTES)
        self._authenticated = False
        self._last_stream_id = 0
        self._writable = asyncio.Event()
        self._writable.set()
        self._auth_deadline: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol -----------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        if len(self._server.connections) >= self._server.limits.max_connections:
            self._refuse(Refusal.CONNECTIONS, "too many connections")
            return
        self._server.connections.add(self)
        self._transport.set_write_buffer_limits(high=self._server.limits.write_buffer_bytes)
        watch_liveness(transport.get_extra_info("socket"))
        self._auth_deadline = asyncio.get_running_loop().call_later(
            self._server.limits.auth_timeout_s, self._refuse_proof, "no proof in time"
        )
        self._transport.write(encode(Op.CHALLENGE, 0, self._nonce))

    def data_received(self, data: bytes) -> None:
        try:
            self._reader.feed(data)
        except ProtocolError as e:
            if self._authenticated:
                self._refuse(Refusal.PROTOCOL, str(e))
            else:
                self._refuse_proof(str(e))

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.connections.discard(self)
        if self._auth_deadline is not None:
            self._auth_deadline.cancel()
        self._writable.set()
        for task in self._tasks.values():
            task.cancel()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _refuse_proof(self, detail: str) -> None:
        """A peer without a valid proof learns that much (ERROR 0 refused) before the connection closes: a
        frontend of another deploy (another secret) then takes Serve's handle instead."""
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(encode(Op.ERROR, 0, (ErrorKind.REFUSED, "data-plane proof refused")))
        self._refuse(Refusal.AUTH, detail)

    def _refuse(self, reason: str, detail: str) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        self._server.refused[reason] += 1
        log.warning("closing a data-plane connection (%s): %s", reason, detail)
        self._transport.close()

    # -- frames ---------------------------------------------------------------

    def _on_frame(self, op: Op, stream_id: int, payload: Any) -> None:
        if not self._authenticated:
            self._authenticate(op, payload)
            return
        if op is Op.CANCEL:
            task = self._tasks.get(stream_id)
            if task is not None:
                task.cancel()
            return
        if op not in (Op.GENERATE, Op.PREFILL):
            raise ProtocolError(f"a client does not send {op.name} here")
        if stream_id <= self._last_stream_id:
            raise ProtocolError(f"stream id {stream_id} is not above the last one, {self._last_stream_id}")
        self._last_stream_id = stream_id
        if self._server.draining:
            self._send(encode(Op.ERROR, stream_id, (ErrorKind.DRAINING, "replica is draining")))
            return
        if len(self._tasks) >= self._server.limits.max_streams:
            self._send(encode(Op.ERROR, stream_id, (ErrorKind.FAILED, "too many streams on this connection")))
            return
        run = self._generate if op is Op.GENERATE else self._prefill
        task = asyncio.ensure_future(run(stream_id, payload))
        self._tasks[stream_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(stream_id, None))

    def _authenticate(self, op: Op, payload: Any) -> None:
        if op is not Op.AUTH:
            raise ProtocolError(f"{op.name} before the proof")
        if not proves(self._server.secret, self._nonce, payload):
            raise ProtocolError("wrong proof")
        self._authenticated = True
        if self._auth_deadline is not None:
            self._auth_deadline.cancel()

    def _send(self, frame: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(frame)

    async def _generate(self, stream_id: int, request: EngineRequest) -> None:
        async def run() -> None:
            async with contextlib.aclosing(self._server.handler.generate(request)) as chunks:
                async for chunk in chunks:
                    if not await self._reader_caught_up():
                        self._server.stalled_streams += 1
                        log.warning("cut stream %d: its reader took no data for %.0f s", stream_id, self._stall_s)
                        return  # leaving the engine's stream closes it: the engine aborts the request
                    self._send(encode(Op.CHUNKS, stream_id, (chunk,)))
            self._send(encode(Op.END, stream_id))

        await self._guarded(stream_id, run())

    async def _reader_caught_up(self) -> bool:
        """True once the connection takes data again; False if it took none for `stalled_stream_s`."""
        if self._writable.is_set():
            return True
        try:
            await asyncio.wait_for(self._writable.wait(), self._stall_s)
        except TimeoutError:
            return False
        return True

    @property
    def _stall_s(self) -> float:
        return self._server.limits.stalled_stream_s

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
    """Serves `handler` to clients that prove `secret` (the application's data-plane secret)."""

    def __init__(self, handler: StreamHandler, secret: bytes, limits: WireLimits = WireLimits()) -> None:
        if not secret:
            raise ValueError("the data plane needs the application's secret")
        self.handler = handler
        self.secret = secret
        self.limits = limits
        self.connections: set[_Connection] = set()
        self.refused: collections.Counter[str] = collections.Counter()
        self.stalled_streams = 0  # streams cut because their reader took no data for `stalled_stream_s`
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
