"""Follows every live replica's KV event stream (ZMQ) into the frontend's index.

Once a second it compares the pools' live replicas with what it follows:
a new replica gets a subscriber task, a departed one is forgotten with its
blocks. A stream that cannot be decoded, or a publisher that cannot be
reached, leaves that replica routed on load alone (its index entry stays
empty); both are counted in metrics and logged, and nothing here can crash
the frontend. The publisher's twin (orchestrator/kv/publisher.py); zmq is
imported when a subscriber is made, so the core loads no network library.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from orchestrator.engines import kv_event_decoder
from orchestrator.kv.events import KVEventBatch
from orchestrator.kv.ingest import Action, KVEventIngest
from orchestrator.metrics import FrontendMetrics
from orchestrator.pools import PoolClient, ReplicaView

log = logging.getLogger("ray.serve")

REPLAY_END_SEQ = -1
REPLAY_TIMEOUT_S = 2.0
# Batches one replica's stream may queue unread: ZMQ drops beyond them, and the loss shows as a gap in the
# batches' sequence numbers, which the ingest answers with a replay or a resync, as for any lost batch.
RECEIVE_QUEUE_BATCHES = 10_000
# The largest replayed batch taken (a replay socket lives for one replay; over it, the replay times out and the
# ingest resyncs). Not set on the live subscription: libzmq drops a SUB's connection over it and does not
# reconnect (checked with pyzmq here), which would silence the replica's stream for good.
MAX_MESSAGE_BYTES = 16 * 2**20


class KVEventSubscriber:
    def __init__(
        self,
        pools: Sequence[PoolClient],
        ingest: KVEventIngest,
        metrics: FrontendMetrics,
        subscribe: bool,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._pools = pools
        self._ingest = ingest
        self._metrics = metrics
        self._subscribe = subscribe
        self._poll_s = poll_s
        self._clock = clock
        self._tasks: dict[str, asyncio.Task] = {}
        self._zmq: Any = None
        self._context: Any = None
        if subscribe:
            import zmq
            import zmq.asyncio

            self._zmq = zmq
            self._context = zmq.asyncio.Context()

    async def run(self) -> None:
        try:
            while True:
                self._sync()
                await asyncio.sleep(self._poll_s)
        finally:
            for task in self._tasks.values():
                task.cancel()
            if self._context is not None:
                self._context.destroy(linger=0)

    def _sync(self) -> None:
        live: dict[str, ReplicaView] = {v.replica_id: v for pool in self._pools for v in pool.replicas()}
        for replica_id in [r for r in self._tasks if r not in live]:
            self._tasks.pop(replica_id).cancel()
        for replica_id in set(self._ingest.index.replicas) - set(live):
            self._ingest.forget(replica_id)
        if not self._subscribe:
            return
        for replica_id, view in live.items():
            endpoint = view.info.kv_events_endpoint if view.info else None
            task = self._tasks.get(replica_id)
            if endpoint and (task is None or task.done()):
                self._tasks[replica_id] = asyncio.create_task(self._follow(view))

    async def _follow(self, view: ReplicaView) -> None:
        assert view.info is not None and view.info.kv_events_endpoint
        replica_id = view.replica_id
        decode = kv_event_decoder(view.info.engine_kind)
        zmq = self._zmq
        sub = bounded_subscription(self._context, zmq, view.info.kv_events_endpoint)
        log.info("following KV events of %s at %s", replica_id, view.info.kv_events_endpoint)
        try:
            while True:
                frames = await sub.recv_multipart()
                batch = self._decode(replica_id, decode, frames)
                if batch is not None:
                    await self._ingest_batch(view, decode, batch)
        except asyncio.CancelledError:
            raise
        except Exception:  # never let one replica's stream take the frontend down
            log.exception("KV event stream of %s failed; routing it on load only until it is back", replica_id)
            self._metrics.kv_event_stream_failures.inc()
        finally:
            sub.close(linger=0)

    def _decode(self, replica_id: str, decode, frames: list[bytes]) -> KVEventBatch | None:
        try:
            if len(frames) != 3:
                raise ValueError(f"expected 3 frames, got {len(frames)}")
            return decode(frames[1], frames[2])
        except ValueError as e:
            self._metrics.kv_events_malformed.inc()
            log.warning("dropped a malformed KV event batch from %s: %s", replica_id, e)
            return None

    async def _ingest_batch(self, view: ReplicaView, decode, batch: KVEventBatch) -> None:
        outcome = self._ingest.on_batch(view.replica_id, batch)
        if outcome.action is Action.REPLAY:
            for missed in await self._replay(view, decode, outcome.replay_from):
                self._record(self._ingest.on_batch(view.replica_id, missed, can_replay=False), missed)
            outcome = self._ingest.on_batch(view.replica_id, batch, can_replay=False)
        self._record(outcome, batch)

    def _record(self, outcome, batch: KVEventBatch) -> None:
        m = self._metrics
        m.kv_event_batches.inc()
        m.kv_event_blocks.labels("stored").inc(outcome.stored)
        m.kv_event_blocks.labels("removed").inc(outcome.removed)
        m.kv_event_delay.observe(max(self._clock() - batch.ts, 0.0))
        if outcome.resync is not None:
            m.kv_event_resyncs.labels(outcome.resync.value).inc()

    async def _replay(self, view: ReplicaView, decode, from_seq: int) -> list[KVEventBatch]:
        """Batches from `from_seq` on, as the publisher still buffers them."""
        endpoint = view.info.kv_events_replay_endpoint if view.info else None
        if not endpoint:
            return []
        sock = self._context.socket(self._zmq.DEALER)
        sock.setsockopt(self._zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sock.connect(endpoint)
        batches = []
        try:
            await sock.send_multipart([b"", from_seq.to_bytes(8, "big")])
            while True:
                frames = await asyncio.wait_for(sock.recv_multipart(), REPLAY_TIMEOUT_S)
                # (empty delimiter, topic, seq, payload); seq -1 ends the replay.
                if len(frames) != 4 or int.from_bytes(frames[2], "big", signed=True) == REPLAY_END_SEQ:
                    break
                batch = self._decode(view.replica_id, decode, frames[1:])
                if batch is not None:
                    batches.append(batch)
        except TimeoutError:
            log.warning("KV event replay from %s timed out", view.replica_id)
        finally:
            sock.close(linger=0)
        return sorted(batches, key=lambda b: b.seq)

    def following(self) -> list[str]:
        return sorted(r for r, t in self._tasks.items() if not t.done())

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)


def bounded_subscription(context, zmq, endpoint: str):
    """A SUB socket on `endpoint` that queues at most RECEIVE_QUEUE_BATCHES batches unread."""
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE_BATCHES)
    sub.connect(endpoint)
    return sub
