"""vLLM's KV event wire format (vLLM 0.32, `vllm.distributed.kv_events`),
decoded into the index's own event types without importing vLLM.

A ZMQ message is (topic, 8-byte big-endian sequence number, msgpack payload);
the payload is a `KVEventBatch` encoded array-like as [ts, events, dp_rank],
each event a map tagged by its class name under "type" (SGLang 0.5.23 sends
the same shape: sglang_kv_events.py).

Contract: the index holds the blocks a prefix hit can use, those in the
engine's device KV cache. Events of another storage tier (`medium` other
than "GPU", vLLM's name for the device tier on every platform, its CPU build
included: host copies are "CPU", storage "STORAGE") and events for KV groups
other than the first are skipped. A payload that does not decode, or that
holds an event of a kind this module does not know, raises `MalformedEvents`
as a whole: the subscriber counts it, and the sequence gap it leaves makes
the index drop that replica's entries (locality lost, never a wrong hit)
rather than apply a batch it only partly understood.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from orchestrator.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventBatch

# The `medium` of the device tier; an engine that sends none means it too.
DEVICE_MEDIUM = "GPU"


class MalformedEvents(ValueError):
    pass


class _BlockStored(msgspec.Struct, tag="BlockStored", omit_defaults=True):
    block_hashes: tuple[int | bytes, ...]
    parent_block_hash: int | bytes | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = None
    group_idx: int | None = None
    lora_name: str | None = None
    # One entry per block, untagged: the LoRA name (when lora_name is set), (mm id, offset) pairs, the
    # cache_salt (the prompt's first block only), prompt-embeds digests (vLLM's `to_event_extra_keys`).
    extra_keys: list[tuple[Any, ...] | None] | None = None


class _BlockRemoved(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: tuple[int | bytes, ...]
    medium: str | None = None
    group_idx: int | None = None


class _AllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


_Event = _BlockStored | _BlockRemoved | _AllBlocksCleared


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_Event]
    data_parallel_rank: int | None = None


_batch_decoder = msgspec.msgpack.Decoder(_Batch)

B = TypeVar("B")


def on_device(medium: str | None) -> bool:
    """Whether an event's blocks are in the device KV cache (see the contract)."""
    return medium is None or medium == DEVICE_MEDIUM


def decode_frames(seq_bytes: bytes, payload: bytes, decoder: msgspec.msgpack.Decoder[B]) -> tuple[int, B]:
    """(sequence frame, payload frame) -> (seq, the payload as `decoder`
    types it); `MalformedEvents` if it does not decode."""
    try:
        return int.from_bytes(seq_bytes, "big", signed=True), decoder.decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError) as e:
        raise MalformedEvents(f"undecodable KV event batch: {e}") from e


def _translate(event: Any) -> KVEvent | None:
    if type(event) is _AllBlocksCleared:
        return AllBlocksCleared()
    if event.group_idx or not on_device(event.medium):
        return None  # a KV group other than the first, or another storage tier
    if type(event) is _BlockStored:
        salt = _first_block_salt(event) if event.extra_keys else None
        return BlockStored(
            event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size, salt, event.lora_name
        )
    return BlockRemoved(event.block_hashes)


def _first_block_salt(event: _BlockStored) -> str | None:
    """The cache_salt a prompt's first block was hashed with: the one string among its extra keys once the
    LoRA name is set aside (mm keys are pairs, embeds digests bytes)."""
    if event.parent_block_hash is not None or not event.extra_keys[0]:
        return None
    strings = [key for key in event.extra_keys[0] if isinstance(key, str)]
    if event.lora_name is not None:
        strings = strings[1:]
    return strings[0] if strings else None


def decode_batch(seq_bytes: bytes, payload: bytes) -> KVEventBatch:
    seq, batch = decode_frames(seq_bytes, payload, _batch_decoder)
    return KVEventBatch(seq=seq, ts=batch.ts, events=tuple(e for e in map(_translate, batch.events) if e is not None))


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
        return _BlockStored(
            tuple(event.engine_hashes),
            event.parent_engine_hash,
            tuple(event.token_ids),
            event.block_size,
            DEVICE_MEDIUM,
            lora_name=event.lora_name,
            extra_keys=_extra_keys(event),
        )
    if isinstance(event, BlockRemoved):
        return _BlockRemoved(tuple(event.engine_hashes), DEVICE_MEDIUM)
    return _AllBlocksCleared()


def _extra_keys(event: BlockStored) -> list[tuple[Any, ...] | None] | None:
    """vLLM's per-block extra keys: the adapter's name on every block, the salt on the prompt's first."""
    lora = (event.lora_name,) if event.lora_name is not None else ()
    salt = (event.cache_salt,) if event.cache_salt is not None and event.parent_engine_hash is None else ()
    if not lora and not salt:
        return None
    return [(lora + salt) or None] + [lora or None] * (len(event.engine_hashes) - 1)


def encode_batch(batch: KVEventBatch) -> tuple[bytes, bytes]:
    """(sequence frame, payload frame) exactly as vLLM's ZMQ publisher sends a
    batch; `decode_batch` inverts it. Lets a non-vLLM engine (the simulated
    one) feed the same subscriber and index."""
    payload = _encoder.encode(_Batch(batch.ts, [_wire(e) for e in batch.events]))
    return batch.seq.to_bytes(8, "big", signed=True), payload
