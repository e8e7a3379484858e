"""A KV event publisher speaking vLLM's ZMQ protocol, for engines that are not
vLLM (the simulated engine): a PUB socket sending (topic, seq, payload) per
batch and a ROUTER socket that replays buffered batches from a sequence
number on, ending with seq -1, as `vllm.distributed.kv_events.ZmqEventPublisher`
does. Both bind to the node's address on ports the OS picks. (zmq is imported
when a publisher is made: the core imports no network library at load.)

Contract: `seq` starts at 0 with each publisher and grows by one per batch,
so a subscriber sees a restart as a sequence going back to 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque

from orchestrator.engines.vllm_kv_events import encode_batch
from orchestrator.kv.events import KVEvent, KVEventBatch

log = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class ZmqKVEventPublisher:
    def __init__(self, host: str, topic: str, buffer_batches: int = 10_000) -> None:
        import zmq
        import zmq.asyncio

        self._last_endpoint = zmq.LAST_ENDPOINT
        self._context = zmq.asyncio.Context()
        self._pub = self._context.socket(zmq.PUB)
        self._pub.setsockopt(zmq.SNDHWM, 0)
        self._pub.bind(f"tcp://{host}:0")
        self._replay = self._context.socket(zmq.ROUTER)
        self._replay.bind(f"tcp://{host}:0")
        self._topic = topic.encode()
        self._buffer: deque[tuple[bytes, bytes]] = deque(maxlen=buffer_batches)
        self._seq = 0
        self._replay_task: asyncio.Task | None = None

    @property
    def endpoint(self) -> str:
        return self._pub.getsockopt_string(self._last_endpoint)

    @property
    def replay_endpoint(self) -> str:
        return self._replay.getsockopt_string(self._last_endpoint)

    def start(self) -> None:
        self._replay_task = asyncio.create_task(self._serve_replays())

    async def publish(self, events: list[KVEvent], ts: float) -> None:
        if not events:
            return
        frames = encode_batch(KVEventBatch(self._seq, ts, tuple(events)))
        self._seq += 1
        self._buffer.append(frames)
        await self._pub.send_multipart((self._topic, *frames))

    async def _serve_replays(self) -> None:
        while True:
            client, _, start = await self._replay.recv_multipart()
            first = int.from_bytes(start, "big", signed=True)
            for seq_bytes, payload in list(self._buffer):
                if int.from_bytes(seq_bytes, "big", signed=True) >= first:
                    await self._replay.send_multipart((client, b"", self._topic, seq_bytes, payload))
            await self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def close(self) -> None:
        if self._replay_task is not None:
            self._replay_task.cancel()
        with contextlib.suppress(Exception):
            self._context.destroy(linger=0)
