"""The KV event subscription is bounded (real ZMQ sockets): at most RECEIVE_QUEUE_BATCHES batches wait unread
(ZMQ drops beyond them; the lost batches show as a sequence gap, which the ingest answers with a replay or a
resync: the ingest's own tests), and the stream flows as before."""

from __future__ import annotations

import asyncio

import zmq
import zmq.asyncio

from orchestrator.kv.subscriber import RECEIVE_QUEUE_BATCHES, bounded_subscription


async def _heard(pub, sub, payload: bytes) -> list[bytes]:
    """What `sub` receives while `pub` keeps sending `payload` (a PUB drops what no live subscription hears),
    up to the first `payload` received; empty if it never arrives."""
    heard: list[bytes] = []
    for _ in range(200):
        await pub.send_multipart([b"kv", payload])
        try:
            while True:
                frames = await asyncio.wait_for(sub.recv_multipart(), 0.05)
                heard.append(frames[1])
                if frames[1] == payload:
                    return heard
        except TimeoutError:
            continue
    return heard


def test_the_subscription_queues_a_bounded_number_of_batches_and_flows():
    async def main():
        context = zmq.asyncio.Context()
        pub = context.socket(zmq.PUB)
        pub.bind("tcp://127.0.0.1:0")
        sub = bounded_subscription(context, zmq, pub.getsockopt_string(zmq.LAST_ENDPOINT))
        try:
            assert 0 < sub.getsockopt(zmq.RCVHWM) == RECEIVE_QUEUE_BATCHES  # 0 would be unbounded
            assert (await _heard(pub, sub, b"batch"))[-1:] == [b"batch"]
        finally:
            sub.close(linger=0)
            pub.close(linger=0)
            context.destroy(linger=0)

    asyncio.run(main())
