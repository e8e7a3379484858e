"""The frontend's end of the direct data plane.

`ReplicaStreams` holds one connection per replica address, opened on first
use and again after it breaks, and usable once it has answered the replica's
CHALLENGE with the proof of the application's secret. Each call is one stream
on it:

    generate(req):  GENERATE; yield chunks as they arrive, merged into one
                    while the consumer lags (no token lost, fewer events);
                    closed early -> CANCEL (the replica aborts the request)
                    parked (`Parking`, a request resumable mid-output): its
                    consumer has not come back for what arrived within
                    `after_s` of its last take, or holds `after_tokens` unread
                    -> CANCEL, later frames dropped; the consumer gets what
                    arrived, then StreamParked (the caller continues it)
    prefill(req):   PREFILL; await RESULT; cancelled -> CANCEL
    ERROR rejected -> EngineRequestRejected; refused (the proof, another
    deploy's secret) -> DataPlaneRefused (the caller takes Serve's handle);
    failed, draining, connection lost -> EngineError (the request path falls
    back or migrates)
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.engines.base import EngineError, EngineRequestRejected
from orchestrator.messages import EngineChunk, EngineRequest, PrefillResult
from orchestrator.pools import StreamParked
from orchestrator.wire.frames import ErrorKind, FrameReader, Op, ProtocolError, encode, proof
from orchestrator.wire.liveness import watch_liveness

_END = object()
_PARKED = object()


@dataclass(frozen=True)
class Parking:
    """When a generate stream whose consumer stopped taking chunks is parked: a chunk arrives
    `after_s` or more after the consumer's last take while it has not come back, or its unread
    chunks hold `after_tokens` tokens."""

    after_s: float
    after_tokens: int

    def due(self, unread_tokens: int, since_take_s: float) -> bool:
        return unread_tokens >= self.after_tokens or since_take_s >= self.after_s


class ReplicaDraining(EngineError):
    """The replica is shutting down and took no part of the request."""


class DataPlaneRefused(EngineError):
    """The replica refused this frontend's proof (a frontend of another deploy, with another secret) and took
    no part of the request: Serve's handle still reaches it."""


def _error(kind: ErrorKind, message: str) -> Exception:
    if kind is ErrorKind.REJECTED:
        return EngineRequestRejected(message)
    if kind is ErrorKind.DRAINING:
        return ReplicaDraining(message)
    return EngineError(message)


class _Stream:
    """What arrived for one stream and not yet consumed; `parking` None: never parked."""

    __slots__ = ("items", "waiter", "parking", "clock", "taken_at", "unread_tokens")

    def __init__(self, parking: Parking | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.items: collections.deque[Any] = collections.deque()
        self.waiter: asyncio.Future | None = None
        self.parking = parking
        self.clock = clock
        # When the consumer last took what had arrived (parking only; opening the stream counts as one).
        self.taken_at = clock() if parking is not None else 0.0
        self.unread_tokens = 0  # in the chunks it has not taken (parking only)

    def put(self, *items: Any) -> None:
        self.items.extend(items)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)
            if self.parking is not None:
                self.taken_at = self.clock()  # a waiting consumer takes it now

    def put_chunks(self, chunks: tuple[EngineChunk, ...]) -> bool:
        """Queue `chunks`; True when the stream is due to be parked."""
        lagging = self.parking is not None and (self.waiter is None or self.waiter.done())
        self.put(*chunks)
        if self.parking is None:
            return False
        if any(c.finished for c in chunks):
            self.parking = None  # its end has arrived: nothing left to spare the replica
            return False
        self.unread_tokens += sum(len(c.token_ids) for c in chunks)
        return lagging and self.parking.due(self.unread_tokens, self.clock() - self.taken_at)

    def took(self) -> None:
        if self.parking is not None:
            self.taken_at, self.unread_tokens = self.clock(), 0

    async def wait(self) -> None:
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter


class _Connection(asyncio.Protocol):
    def __init__(self, secret: bytes) -> None:
        self.streams: dict[int, _Stream] = {}
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.failure: Exception | None = None  # why it closed, once it has
        # Done once the proof is sent (the connection serves from then), or failed with why it cannot.
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._secret = secret
        self._reader = FrameReader(self._on_frame)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        watch_liveness(transport.get_extra_info("socket"))

    def data_received(self, data: bytes) -> None:
        try:
            self._reader.feed(data)
        except ProtocolError as e:
            self._fail(EngineError(f"data-plane protocol error: {e}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(EngineError(f"data-plane connection lost{f': {exc}' if exc else ''}"))

    def _fail(self, error: Exception) -> None:
        if not self.closed:
            self.failure = error
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        if not self.ready.done():
            self.ready.set_exception(error)
        for stream in self.streams.values():
            stream.put(error)

    def _on_frame(self, op: Op, stream_id: int, payload: Any) -> None:
        if op is Op.ERROR and stream_id == 0 and payload[0] is ErrorKind.REFUSED:
            self._fail(DataPlaneRefused(payload[1]))
            return
        if op is Op.CHALLENGE:
            if self.ready.done():
                raise ProtocolError("a second CHALLENGE")
            assert self.transport is not None
            self.transport.write(encode(Op.AUTH, 0, proof(self._secret, payload)))
            self.ready.set_result(None)
            return
        stream = self.streams.get(stream_id)
        if stream is None:
            return  # a stream this side already closed
        if op is Op.CHUNKS:
            if stream.put_chunks(payload):
                self._park(stream_id, stream)
        elif op is Op.RESULT:
            stream.put(payload)
        elif op is Op.END:
            stream.put(_END)
        elif op is Op.ERROR:
            stream.put(_error(*payload))
        else:
            raise ProtocolError(f"a server does not send {op.name}")

    def _park(self, stream_id: int, stream: _Stream) -> None:
        """The replica aborts the request; what it sent after this is dropped."""
        del self.streams[stream_id]
        assert self.transport is not None
        self.transport.write(encode(Op.CANCEL, stream_id))
        stream.put(_PARKED)

    def send(self, frame: bytes) -> None:
        if self.closed or self.transport is None:
            if self.failure is not None:
                raise type(self.failure)(str(self.failure))
            raise EngineError("data-plane connection is closed")
        self.transport.write(frame)


class ReplicaStreams:
    """Connections to replicas by (host, port), proving `secret` (the application's data-plane secret);
    safe for many concurrent calls."""

    def __init__(
        self,
        secret: bytes,
        connect_timeout_s: float = 5.0,
        parking: Parking | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`parking`: when a stalled consumer's generate stream is parked (None: never)."""
        if not secret:
            raise ValueError("the data plane needs the application's secret")
        self.secret = secret
        self.connect_timeout_s = connect_timeout_s
        self.parking = parking
        self.clock = clock
        self._connections: dict[tuple[str, int], _Connection] = {}
        self._connecting: dict[tuple[str, int], asyncio.Future] = {}
        self._ids = itertools.count(1)

    async def _connection(self, address: tuple[str, int]) -> _Connection:
        conn = self._connections.get(address)
        if conn is not None and not conn.closed:
            return conn
        pending = self._connecting.get(address)
        if pending is None:
            pending = asyncio.ensure_future(self._open(address))
            self._connecting[address] = pending
            pending.add_done_callback(lambda _: self._connecting.pop(address, None))
        return await asyncio.shield(pending)

    async def _open(self, address: tuple[str, int]) -> _Connection:
        loop = asyncio.get_running_loop()
        conn: _Connection | None = None
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(lambda: _Connection(self.secret), *address)
                await conn.ready
        except (TimeoutError, OSError, EngineError) as e:
            if conn is not None and conn.transport is not None:
                conn.transport.close()
            raise EngineError(f"cannot reach replica at {address[0]}:{address[1]}: {e!r}") from e
        self._connections[address] = conn
        return conn

    async def _open_stream(
        self, address: tuple[str, int], op: Op, request: EngineRequest, parking: Parking | None = None
    ) -> tuple[_Connection, int, _Stream]:
        conn = await self._connection(address)
        stream_id, stream = next(self._ids), _Stream(parking, self.clock)
        conn.streams[stream_id] = stream
        conn.send(encode(op, stream_id, request))
        return conn, stream_id, stream

    @staticmethod
    def _close_stream(conn: _Connection, stream_id: int, finished: bool) -> None:
        conn.streams.pop(stream_id, None)
        if not finished and not conn.closed:
            conn.send(encode(Op.CANCEL, stream_id))

    async def generate(self, address: tuple[str, int], request: EngineRequest) -> AsyncIterator[EngineChunk]:
        parking = self.parking if request.resumable_mid_output else None
        conn, stream_id, stream = await self._open_stream(address, Op.GENERATE, request, parking)
        finished = False
        try:
            while True:
                await stream.wait()
                stream.took()
                chunks, end = [], None
                while stream.items:
                    item = stream.items.popleft()
                    if isinstance(item, EngineChunk):
                        chunks.append(item)
                    else:
                        end = item
                        break
                if chunks:
                    yield EngineChunk.merged(chunks)
                if end is _END:
                    finished = True
                    return
                if end is _PARKED:
                    finished = True  # cancelled when parked
                    raise StreamParked(f"stream {stream_id}'s reader stalled")
                if end is not None:
                    finished = True
                    raise end
        finally:
            self._close_stream(conn, stream_id, finished)

    async def prefill(self, address: tuple[str, int], request: EngineRequest) -> PrefillResult:
        conn, stream_id, stream = await self._open_stream(address, Op.PREFILL, request)
        finished = False
        try:
            await stream.wait()
            item = stream.items.popleft()
            finished = True
            if isinstance(item, Exception):
                raise item
            return item
        finally:
            self._close_stream(conn, stream_id, finished)

    def close(self) -> None:
        for conn in self._connections.values():
            if conn.transport is not None:
                conn.transport.close()
        self._connections.clear()
