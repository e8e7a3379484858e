"""Our decoder reads what vLLM's own event classes encode."""

from __future__ import annotations

import msgspec
import pytest
import vllm.distributed.kv_events as kv_events

from orchestrator.engines.vllm_kv_events import MalformedEvents, decode_batch
from orchestrator.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from orchestrator.kv.hashing import block_hashes, prefix_root
from orchestrator.kv.index import KVIndex


def _encode(events, ts=1.5):
    return msgspec.msgpack.Encoder().encode(kv_events.KVEventBatch(ts=ts, events=events))


def _stored(hashes, parent, tokens, medium=kv_events.MEDIUM_GPU):
    return kv_events.BlockStored(
        block_hashes=hashes,
        parent_block_hash=parent,
        token_ids=list(tokens),
        block_size=32,
        lora_id=None,
        medium=medium,
        lora_name=None,
    )


def test_vllm_encoded_batches_decode_into_index_events():
    payload = _encode(
        [
            _stored([11, 12], None, range(64)),
            _stored([b"\x01" * 32], 12, range(32)),
            kv_events.BlockRemoved(block_hashes=[11], medium=kv_events.MEDIUM_GPU),
            kv_events.AllBlocksCleared(),
        ]
    )
    batch = decode_batch((7).to_bytes(8, "big"), payload)
    assert batch.seq == 7 and batch.ts == 1.5
    assert batch.events == (
        BlockStored((11, 12), None, tuple(range(64)), 32),
        BlockStored((b"\x01" * 32,), 12, tuple(range(32)), 32),
        BlockRemoved((11,)),
        AllBlocksCleared(),
    )


def test_a_salted_prompts_first_block_carries_its_salt_into_the_index():
    """vLLM publishes the cache_salt among the first block's extra keys (after the LoRA name, if any)."""
    from vllm.v1.core.kv_cache_utils import to_event_extra_keys

    def salted(hashes, parent, lora_name=None):
        first = ([("lora", lora_name)] if lora_name else []) + ([("cache_salt", "s1")] if parent is None else [])
        keys = [tuple(first) or None] + [None] * (len(hashes) - 1)
        return kv_events.BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=list(range(32 * len(hashes))),
            block_size=32,
            lora_id=None,
            medium=kv_events.MEDIUM_GPU,
            lora_name=lora_name,
            extra_keys=to_event_extra_keys(keys),
        )

    events = decode_batch(bytes(8), _encode([salted([11, 12], None), salted([21], None, "adapter")])).events
    assert [e.cache_salt for e in events] == ["s1", "s1"]
    index = KVIndex()
    index.apply("d0", events[:1])
    assert index.overlaps(block_hashes(list(range(64)), 32, prefix_root("s1"))) == {"d0": 2}
    assert index.overlaps(block_hashes(list(range(64)), 32)) == {}


def test_a_block_held_only_in_host_memory_is_no_hit():
    """vLLM's offloading connector reports host copies as medium CPU."""
    index = KVIndex()
    prompt = block_hashes(list(range(64)), 32)
    index.apply("d0", decode_batch(bytes(8), _encode([_stored([11, 12], None, range(64))])).events)
    offloaded_then_evicted = decode_batch(
        bytes(8),
        _encode(
            [
                _stored([11, 12], None, range(64), medium=kv_events.MEDIUM_CPU),
                kv_events.BlockRemoved(block_hashes=[12], medium=kv_events.MEDIUM_GPU),
                kv_events.BlockRemoved(block_hashes=[11], medium=kv_events.MEDIUM_CPU),  # its device copy stays
                _stored([21], None, range(100, 132), medium=kv_events.MEDIUM_STORAGE),
            ]
        ),
    )
    assert offloaded_then_evicted.events == (BlockRemoved((12,)),)
    index.apply("d0", offloaded_then_evicted.events)
    assert index.overlaps(prompt) == {"d0": 1}
    assert index.overlaps(block_hashes(list(range(100, 132)), 32)) == {}


def test_other_kv_groups_are_skipped():
    payload = _encode([kv_events.BlockRemoved(block_hashes=[1], medium=kv_events.MEDIUM_GPU, group_idx=1)])
    assert decode_batch((0).to_bytes(8, "big"), payload).events == ()


def test_garbage_is_reported_not_crashed_on():
    with pytest.raises(MalformedEvents):
        decode_batch((0).to_bytes(8, "big"), b"\xc1not msgpack")
    with pytest.raises(MalformedEvents):
        decode_batch((0).to_bytes(8, "big"), msgspec.msgpack.encode({"a": 1}))


def test_a_batch_with_an_unknown_event_kind_is_malformed_as_a_whole():
    """Applying only the known events could leave blocks the engine no longer
    holds; the subscriber counts the batch and the index resyncs the replica
    over the gap (test_sglang_adapter.py follows that through)."""

    class BlockPinned(kv_events.KVCacheEvent):
        block_hashes: list[int]

    payload = _encode([BlockPinned(block_hashes=[1]), kv_events.BlockRemoved(block_hashes=[3], medium="GPU")])
    with pytest.raises(MalformedEvents, match="BlockPinned"):
        decode_batch((1).to_bytes(8, "big"), payload)
