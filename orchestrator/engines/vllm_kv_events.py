"""vLLM's KV event wire format (vLLM 0.32, `vllm.distributed.kv_events`),
decoded into the index's own event types without importing vLLM.

A ZMQ message is (topic, 8-byte big-endian sequence number, msgpack payload);
the payload is a `KVEventBatch` encoded array-like as [ts, events, dp_rank],
each event a map tagged by its class name under "type". Events of kinds this
index does not use, or for KV groups other than the first, are skipped; a
payload that does not decode raises `MalformedEvents`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from orchestrator.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventBatch


class MalformedEvents(ValueError):
    pass


class _BlockStored(msgspec.Struct, tag="BlockStored"):
    block_hashes: tuple[int | bytes, ...]
    parent_block_hash: int | bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    group_idx: int | None = None


class _BlockRemoved(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: tuple[int | bytes, ...]
    group_idx: int | None = None


class _AllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


_Event = _BlockStored | _BlockRemoved | _AllBlocksCleared


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_Event]
    data_parallel_rank: int | None = None


class _RawBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]
    data_parallel_rank: int | None = None


_batch_decoder = msgspec.msgpack.Decoder(_Batch)
_raw_batch_decoder = msgspec.msgpack.Decoder(_RawBatch)
_event_decoder = msgspec.msgpack.Decoder(_Event)


def _translate(event: Any) -> KVEvent | None:
    if event.group_idx if type(event) is not _AllBlocksCleared else None:
        return None  # a KV group other than the first
    if type(event) is _BlockStored:
        return BlockStored(event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size)
    if type(event) is _BlockRemoved:
        return BlockRemoved(event.block_hashes)
    return AllBlocksCleared()


def _decode_event_by_event(payload: bytes) -> tuple[float, list[Any]]:
    """Slow path for a batch holding an event kind we do not know: skip those."""
    batch = _raw_batch_decoder.decode(payload)
    events = []
    for raw in batch.events:
        try:
            events.append(_event_decoder.decode(raw))
        except msgspec.DecodeError:
            continue
    return batch.ts, events


def decode_batch(seq_bytes: bytes, payload: bytes) -> KVEventBatch:
    try:
        seq = int.from_bytes(seq_bytes, "big", signed=True)
        try:
            batch = _batch_decoder.decode(payload)
            ts, raw_events = batch.ts, batch.events
        except msgspec.ValidationError:
            ts, raw_events = _decode_event_by_event(payload)
    except (msgspec.DecodeError, ValueError, TypeError) as e:
        raise MalformedEvents(f"undecodable KV event batch: {e}") from e
    events = tuple(e for e in map(_translate, raw_events) if e is not None)
    return KVEventBatch(seq=seq, ts=ts, events=events)


# vLLM binds `tcp://*:0` to its node address (VLLM_HOST_IP), not to every
# interface, on a port the OS picks; `AsyncLLM.get_kv_event_sources()` then
# reports the endpoints it bound. (A host:port without `*` would make vLLM's
# PUB socket *connect* there instead of binding.)
BIND_NODE_ADDRESS = "tcp://*:0"


def events_config(topic: str) -> dict[str, Any]:
    """vLLM `kv_events_config` for a publisher and a replay socket on the node address."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": BIND_NODE_ADDRESS,
        "replay_endpoint": BIND_NODE_ADDRESS,
        "topic": topic,
    }


_encoder = msgspec.msgpack.Encoder()


def _wire(event: KVEvent) -> _Event:
    if isinstance(event, BlockStored):
        return _BlockStored(tuple(event.engine_hashes), event.parent_engine_hash, tuple(event.token_ids),
                            event.block_size)
    if isinstance(event, BlockRemoved):
        return _BlockRemoved(tuple(event.engine_hashes))
    return _AllBlocksCleared()


def encode_batch(batch: KVEventBatch) -> tuple[bytes, bytes]:
    """(sequence frame, payload frame) exactly as vLLM's ZMQ publisher sends a
    batch; `decode_batch` inverts it. Lets a non-vLLM engine (the simulated
    one) feed the same subscriber and index."""
    payload = _encoder.encode(_Batch(batch.ts, [_wire(e) for e in batch.events]))
    return batch.seq.to_bytes(8, "big", signed=True), payload
