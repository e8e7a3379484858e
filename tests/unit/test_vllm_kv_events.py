"""Our decoder reads what vLLM's own event classes encode."""

from __future__ import annotations

import msgspec
import pytest

from orchestrator.engines.vllm_kv_events import MalformedEvents, decode_batch
from orchestrator.kv.events import AllBlocksCleared, BlockRemoved, BlockStored

kv_events = pytest.importorskip("vllm.distributed.kv_events")


def _encode(events, ts=1.5):
    return msgspec.msgpack.Encoder().encode(kv_events.KVEventBatch(ts=ts, events=events))


def test_vllm_encoded_batches_decode_into_index_events():
    payload = _encode([
        kv_events.BlockStored(block_hashes=[11, 12], parent_block_hash=None, token_ids=list(range(64)),
                              block_size=32, lora_id=None, medium="GPU", lora_name=None),
        kv_events.BlockStored(block_hashes=[b"\x01" * 32], parent_block_hash=12, token_ids=list(range(32)),
                              block_size=32, lora_id=None, medium="GPU", lora_name=None),
        kv_events.BlockRemoved(block_hashes=[11], medium="GPU"),
        kv_events.AllBlocksCleared(),
    ])
    batch = decode_batch((7).to_bytes(8, "big"), payload)
    assert batch.seq == 7 and batch.ts == 1.5
    assert batch.events == (
        BlockStored((11, 12), None, tuple(range(64)), 32),
        BlockStored((b"\x01" * 32,), 12, tuple(range(32)), 32),
        BlockRemoved((11,)),
        AllBlocksCleared(),
    )


def test_other_kv_groups_are_skipped():
    payload = _encode([kv_events.BlockRemoved(block_hashes=[1], medium="GPU", group_idx=1)])
    assert decode_batch((0).to_bytes(8, "big"), payload).events == ()


def test_garbage_is_reported_not_crashed_on():
    with pytest.raises(MalformedEvents):
        decode_batch((0).to_bytes(8, "big"), b"\xc1not msgpack")
    with pytest.raises(MalformedEvents):
        decode_batch((0).to_bytes(8, "big"), msgspec.msgpack.encode({"a": 1}))


def test_a_batch_with_an_unknown_event_kind_keeps_the_known_ones():
    encoder = msgspec.msgpack.Encoder()
    stored = msgspec.msgpack.decode(encoder.encode(kv_events.BlockRemoved(block_hashes=[3], medium="GPU")))
    payload = encoder.encode([2.0, [{"type": "BlockPinned", "block_hashes": [1]}, stored]])
    assert decode_batch((1).to_bytes(8, "big"), payload).events == (BlockRemoved((3,)),)
