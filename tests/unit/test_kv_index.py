"""KV index lifecycles: events in, overlaps out."""

from __future__ import annotations

import random

from orchestrator.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from orchestrator.kv.hashing import block_hashes
from orchestrator.kv.index import KVIndex

BS = 4


def tokens(n, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(1000) for _ in range(n)]


def stored(engine_hashes, tokens_, parent=None):
    return BlockStored(tuple(engine_hashes), parent, tuple(tokens_), BS)


def test_hashes_cover_full_blocks_and_chain_prefixes():
    t = tokens(10)
    hs = block_hashes(t, BS)
    assert len(hs) == 2  # the 2 tokens of the partial block never count
    assert block_hashes(t[:8], BS) == hs
    other = t[:4] + [t[4] + 1] + t[5:]
    assert block_hashes(other, BS)[0] == hs[0] and block_hashes(other, BS)[1] != hs[1]
    # Same block content after a different prefix hashes differently.
    assert block_hashes([9, 9, 9, 9] + t[4:8], BS)[1] != hs[1]
    assert block_hashes(t[4:8], BS, parent=hs[0]) == hs[1:]
    assert block_hashes([], BS) == [] and block_hashes(t[:3], BS) == []


def test_hashes_are_the_same_in_every_process():
    import subprocess
    import sys

    t = [0, 1, 2**31 - 1, 2**40, 150_000] * 8
    code = f"from orchestrator.kv.hashing import block_hashes; print(block_hashes({t!r}, {BS}))"
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", "PATH": ""},
        cwd=str(__import__("pathlib").Path(__file__).parents[2]),
    )
    assert other.stdout.strip() == str(block_hashes(t, BS)) == str(block_hashes(tuple(t), BS))
    assert len(set(block_hashes(list(range(4000)), 32))) == 125


def test_stored_blocks_match_prompts_by_leading_blocks():
    idx = KVIndex()
    t = tokens(16)
    idx.apply("a", [stored(["e1", "e2", "e3"], t[:12])])
    idx.apply("b", [stored(["x1"], t[:4])])
    prompt = block_hashes(t, BS)  # 4 blocks
    assert idx.overlaps(prompt) == {"a": 3, "b": 1}
    assert idx.overlaps(block_hashes(tokens(16, seed=9), BS)) == {}
    assert idx.num_blocks() == 3


def test_a_block_stored_after_its_parent_extends_the_chain():
    idx = KVIndex()
    t = tokens(12)
    idx.apply("a", [stored(["e1"], t[:4]), stored(["e2", "e3"], t[4:12], parent="e1")])
    assert idx.overlaps(block_hashes(t, BS)) == {"a": 3}


def test_an_unknown_parent_is_reported_as_orphaned_not_guessed():
    idx = KVIndex()
    result = idx.apply("a", [stored(["e2"], tokens(4), parent="never-seen")])
    assert result.orphaned == 1 and result.stored == 0
    assert idx.num_blocks() == 0


def test_removed_blocks_and_cleared_caches_leave_the_index():
    idx = KVIndex()
    t = tokens(12)
    idx.apply("a", [stored(["e1", "e2", "e3"], t)])
    r = idx.apply("a", [BlockRemoved(("e3", "unknown"))])
    assert r.removed == 1 and idx.overlaps(block_hashes(t, BS)) == {"a": 2}
    idx.apply("b", [stored(["f1"], t[:4])])
    idx.apply("a", [AllBlocksCleared()])
    assert idx.overlaps(block_hashes(t, BS)) == {"b": 1}
    assert idx.replica_blocks("a") == 0 and idx.num_blocks() == 1


def test_a_removed_replica_takes_its_blocks_and_its_slot_is_reused():
    idx = KVIndex()
    t = tokens(8)
    idx.apply("a", [stored(["e1", "e2"], t)])
    idx.apply("b", [stored(["f1", "f2"], t)])
    idx.remove_replica("a")
    assert idx.overlaps(block_hashes(t, BS)) == {"b": 2}
    idx.apply("c", [stored(["g1"], t[:4])])  # takes a's old slot
    assert idx.overlaps(block_hashes(t, BS)) == {"b": 2, "c": 1}
    idx.sync_replicas(["c", "d"])
    assert idx.replicas == ["c", "d"] and idx.overlaps(block_hashes(t, BS)) == {"c": 1}


def test_duplicate_stores_are_counted_once_and_routing_hashes_are_refcounted():
    idx = KVIndex()
    t = tokens(4)
    idx.apply("a", [stored(["e1"], t), stored(["e1"], t)])
    assert idx.replica_blocks("a") == 1
    idx.apply("a", [BlockRemoved(("e1",))])
    assert idx.num_blocks() == 0
    h = block_hashes(t, BS)
    idx.store_hashes("b", h)
    idx.store_hashes("b", h)
    idx.remove_hashes("b", h)
    assert idx.holds("b", h[0])
    idx.remove_hashes("b", h)
    assert not idx.holds("b", h[0])


def test_many_replicas_longest_prefix():
    idx = KVIndex()
    t = tokens(40)
    for r in range(100):
        depth = r % 11
        idx.apply(f"r{r}", [stored([f"r{r}-{i}" for i in range(depth)], t[: depth * BS])] if depth else [])
    got = idx.overlaps(block_hashes(t, BS))
    assert got == {f"r{r}": r % 11 for r in range(100) if r % 11}
