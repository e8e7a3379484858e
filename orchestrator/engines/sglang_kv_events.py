"""SGLang's KV event wire format (`sglang.srt.disaggregation.kv_events`),
decoded into the index's own event types without importing SGLang.

The ZMQ message is the same three frames as vLLM's (topic, 8-byte big-endian
sequence number, msgpack payload), with the same replay socket protocol, but
the payload is NOT vLLM's: SGLang's events are msgspec structs with
`array_like=True, tag=True`, so each event is an array led by its class name
(`["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
lora_id, (medium)]`, `["BlockRemoved", block_hashes, (medium)]`,
`["AllBlocksCleared"]`) where vLLM 0.32 sends maps. The batch is
`[ts, events, attn_dp_rank?]` as in vLLM.

SGLang's radix cache publishes one BlockStored per page (`page_size` tokens,
the parent being the previous page), which is what the index chains. (Some
releases publish the first page of a radix node that is not the root's child
without its parent: the index takes such a page for a prompt start that no
prompt matches — locality lost, never a wrong hit.) Events
for another storage tier (a `medium` other than GPU: HiCache's host copies)
and events of kinds this index does not use are skipped; a payload that does
not decode raises `MalformedEvents`. Fixtures: tests/fixtures/sglang/.
"""

from __future__ import annotations

from typing import Any

import msgspec

from orchestrator.engines.vllm_kv_events import MalformedEvents
from orchestrator.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventBatch

__all__ = ["MalformedEvents", "decode_batch", "events_config"]

# The tier whose blocks a prefix hit can use; older SGLang sends no medium at all.
_GPU_MEDIUM = "GPU"


class _BlockStored(msgspec.Struct, array_like=True, tag="BlockStored"):
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: Any = None


class _BlockRemoved(msgspec.Struct, array_like=True, tag="BlockRemoved"):
    block_hashes: tuple[int, ...]
    medium: Any = None


class _AllBlocksCleared(msgspec.Struct, array_like=True, tag="AllBlocksCleared"):
    pass


_Event = _BlockStored | _BlockRemoved | _AllBlocksCleared


class _RawBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[msgspec.Raw]
    attn_dp_rank: int | None = None


_raw_batch_decoder = msgspec.msgpack.Decoder(_RawBatch)
_event_decoder = msgspec.msgpack.Decoder(_Event)


def _on_gpu(medium: Any) -> bool:
    return medium is None or not isinstance(medium, str) or medium.upper() == _GPU_MEDIUM


def _translate(event: _Event) -> KVEvent | None:
    if isinstance(event, _AllBlocksCleared):
        return AllBlocksCleared()
    if not _on_gpu(event.medium):
        return None
    if isinstance(event, _BlockStored):
        return BlockStored(event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size)
    return BlockRemoved(event.block_hashes)


def _decode_event(raw: msgspec.Raw) -> _Event | None:
    try:
        return _event_decoder.decode(raw)
    except msgspec.DecodeError:
        return None  # a kind this index does not use (or a newer shape of one)


def decode_batch(seq_bytes: bytes, payload: bytes) -> KVEventBatch:
    """(sequence frame, payload frame) -> batch, as `vllm_kv_events.decode_batch`."""
    try:
        seq = int.from_bytes(seq_bytes, "big", signed=True)
        batch = _raw_batch_decoder.decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError) as e:
        raise MalformedEvents(f"undecodable KV event batch: {e}") from e
    events = (_decode_event(raw) for raw in batch.events)
    return KVEventBatch(seq=seq, ts=batch.ts,
                        events=tuple(t for t in (_translate(e) for e in events if e is not None) if t is not None))


def events_config(topic: str, pub_port: int, replay_port: int) -> dict[str, Any]:
    """SGLang `kv_events_config` (ServerArgs takes it as a JSON string).

    SGLang's publisher binds only an endpoint holding `*` (any other address
    it connects to), and reports no bound port: so the ports are chosen here,
    and the sockets listen on every interface of the node."""
    return {
        "publisher": "zmq",
        "endpoint": f"tcp://*:{pub_port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": topic,
    }
