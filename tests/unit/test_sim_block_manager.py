"""Block manager invariants: no leak, refcounts, eviction order, and an index
that follows its events always agrees with its cache."""

from __future__ import annotations

import random

from orchestrator.kv.hashing import block_hashes
from orchestrator.kv.index import KVIndex
from orchestrator.sim.block_manager import BlockManager

BS = 4


def prompt(n, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(1000) for _ in range(n)]


def run_prefill(bm, tokens):
    seq = bm.allocate(tokens)
    assert seq is not None
    bm.mark_computed(seq, len(tokens) - seq.computed_tokens)
    return seq


def index_of(bm, index=None):
    index = index or KVIndex()
    index.apply("r", bm.drain_events())
    return index


def test_a_second_sequence_reuses_the_cached_prefix_and_refcounts_release_it():
    bm = BlockManager(16, BS)
    a = run_prefill(bm, prompt(10))
    assert a.cached_tokens == 0 and len(a.blocks) == 3 and bm.free_blocks == 13
    b = run_prefill(bm, prompt(10)[:8] + [1, 2, 3])
    assert b.cached_tokens == 8 and b.blocks[:2] == a.blocks[:2] and bm.free_blocks == 12
    bm.free(a)
    bm.free(b)
    assert bm.free_blocks == 16  # nothing leaked
    again = bm.allocate(prompt(10))
    assert again.cached_tokens == 8  # still cached after being freed


def test_a_fully_cached_prompt_still_computes_its_last_token():
    bm = BlockManager(16, BS)
    bm.free(run_prefill(bm, prompt(8)))
    assert bm.allocate(prompt(8)).cached_tokens == 4


def test_eviction_takes_uncached_then_least_recently_used_and_reports_it():
    bm = BlockManager(4, BS)
    old = run_prefill(bm, prompt(8, seed=1))
    new = run_prefill(bm, prompt(8, seed=2))
    bm.free(old)
    bm.free(new)
    index = index_of(bm)
    assert index.num_blocks() == 4
    third = run_prefill(bm, prompt(8, seed=3))  # needs 2 blocks: evicts the older prompt's
    index_of(bm, index)
    assert index.overlaps(block_hashes(prompt(8, seed=1), BS)) == {}
    assert index.overlaps(block_hashes(prompt(8, seed=2), BS)) == {"r": 2}
    fourth = bm.allocate(prompt(8, seed=4))  # evicts the other two cached blocks
    assert fourth is not None and bm.free_blocks == 0
    assert bm.allocate(prompt(8, seed=5)) is None  # every block held: no room
    bm.free(third)
    bm.free(fourth)
    assert bm.free_blocks == 4


def test_generated_tokens_fill_blocks_that_get_cached():
    bm = BlockManager(8, BS)
    seq = run_prefill(bm, prompt(3))
    for t in range(6):
        assert bm.append_slot(seq, 900 + t)
        bm.mark_computed(seq, 1)
    assert len(seq.blocks) == 3 and len(seq.chain) == 2
    assert index_of(bm).num_blocks() == 2


def test_random_workload_keeps_the_event_index_equal_to_the_cache_and_leaks_nothing():
    rng = random.Random(7)
    bm = BlockManager(64, BS)
    index = KVIndex()
    prefixes = [prompt(12, seed=s) for s in range(5)]
    live = []
    for step in range(400):
        if live and (rng.random() < 0.4 or bm.free_blocks < 8):
            bm.free(live.pop(rng.randrange(len(live))))
        else:
            tokens = rng.choice(prefixes)[: rng.randrange(4, 12)] + prompt(rng.randrange(1, 9), seed=step + 100)
            seq = bm.allocate(tokens)
            if seq is not None:
                bm.mark_computed(seq, len(tokens) - seq.computed_tokens)
                for _ in range(rng.randrange(0, 6)):
                    if not bm.append_slot(seq, rng.randrange(1000)):
                        break
                    bm.mark_computed(seq, 1)
                live.append(seq)
        index.apply("r", bm.drain_events())
        cached = {h for h in bm._cached}
        held = {h for h in cached if index.holds("r", h)}
        assert held == cached and index.replica_blocks("r") == len(cached)
    for seq in live:
        bm.free(seq)
    assert bm.free_blocks == 64
