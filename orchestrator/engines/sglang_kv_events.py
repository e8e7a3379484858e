"""SGLang's KV event wire format (sglang 0.5.23,
`sglang.srt.disaggregation.kv_events`), decoded into the index's own event
types without importing SGLang.

The ZMQ message is the same three frames as vLLM's (topic, 8-byte big-endian
sequence number, msgpack payload), with the same replay socket protocol, and
the payload has vLLM's shape too: `[ts, events, attn_dp_rank]`, each event a
map tagged by its class name under "type", optional fields left at None
omitted. `BlockStored`'s `cache_salt` (every page of a salted prompt carries
it; SGLang's own hashes of those pages already differ per salt) starts the
index's chain at the salt's root, as vLLM's first-block extra key does; its
`lora_id`, `session_id` and `lora_name` the index does not use.

SGLang's radix cache records one `BlockStored` per page (`page_size` tokens,
the parent being the previous page) and merges consecutive pages of one
store into one event with several hashes (`KVCacheEventRecorder.enqueue`),
which is what the index chains. A tree built on bigram keys (EAGLE) sends
each page's tokens as `[token, next token]` pairs; the index takes the first
of each pair, the page's own tokens (a prompt that diverges right after a
page is then counted one page too long). The rules on storage tiers and
undecodable events are vLLM's (`vllm_kv_events`): SGLang names the device
tier "GPU" and HiCache's host copies "CPU_PINNED" (`StorageMedium`), a block
only in host memory is no hit, and a batch holding an event this module
cannot decode raises `MalformedEvents`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from orchestrator.engines.vllm_kv_events import MalformedEvents, decode_frames, on_device
from orchestrator.kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, KVEventBatch

__all__ = ["MalformedEvents", "decode_batch", "events_config"]


class _BlockStored(msgspec.Struct, tag="BlockStored"):
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int | tuple[int, int], ...]
    block_size: int
    medium: str | None = None
    cache_salt: str | None = None


class _BlockRemoved(msgspec.Struct, tag="BlockRemoved"):
    block_hashes: tuple[int, ...]
    medium: str | None = None


class _AllBlocksCleared(msgspec.Struct, tag="AllBlocksCleared"):
    pass


_Event = _BlockStored | _BlockRemoved | _AllBlocksCleared


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: list[_Event]
    attn_dp_rank: int | None = None


_batch_decoder = msgspec.msgpack.Decoder(_Batch)


def _translate(event: _Event) -> KVEvent | None:
    if isinstance(event, _AllBlocksCleared):
        return AllBlocksCleared()
    if not on_device(event.medium):
        return None
    if isinstance(event, _BlockStored):
        tokens = tuple(t if isinstance(t, int) else t[0] for t in event.token_ids)
        return BlockStored(event.block_hashes, event.parent_block_hash, tokens, event.block_size, event.cache_salt)
    return BlockRemoved(event.block_hashes)


def decode_batch(seq_bytes: bytes, payload: bytes) -> KVEventBatch:
    """(sequence frame, payload frame) -> batch, as `vllm_kv_events.decode_batch`."""
    seq, batch = decode_frames(seq_bytes, payload, _batch_decoder)
    return KVEventBatch(seq=seq, ts=batch.ts, events=tuple(e for e in map(_translate, batch.events) if e is not None))


def events_config(topic: str, pub_port: int, replay_port: int) -> dict[str, Any]:
    """SGLang `kv_events_config` (ServerArgs takes it as a JSON string).

    SGLang's publisher binds an endpoint whose host is a wildcard (`*`) and
    connects to any other, and reports no bound port: so the ports are chosen
    here, and the sockets listen on every interface of the node."""
    return {
        "publisher": "zmq",
        "endpoint": f"tcp://*:{pub_port}",
        "replay_endpoint": f"tcp://*:{replay_port}",
        "topic": topic,
    }
