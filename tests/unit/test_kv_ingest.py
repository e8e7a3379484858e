"""Event streams with gaps, restarts, duplicates and lost parents."""

from __future__ import annotations

from orchestrator.kv.events import BlockStored, KVEventBatch
from orchestrator.kv.hashing import block_hashes
from orchestrator.kv.index import KVIndex
from orchestrator.kv.ingest import Action, KVEventIngest, ResyncReason

BS = 4
T = tuple(range(100, 132))


def batch(seq, *events):
    return KVEventBatch(seq=seq, ts=0.0, events=events)


def store(names, start, parent=None):
    return BlockStored(tuple(names), parent, T[start * BS : (start + len(names)) * BS], BS)


def held(ingest, replica):
    return ingest.index.overlaps(block_hashes(T, BS)).get(replica, 0)


def test_in_order_batches_build_the_chain():
    ing = KVEventIngest(KVIndex())
    assert ing.on_batch("a", batch(0, store(["e0", "e1"], 0))).action is Action.APPLIED
    assert ing.on_batch("a", batch(1, store(["e2"], 2, parent="e1"))).stored == 1
    assert held(ing, "a") == 3 and ing.last_seq("a") == 1


def test_listening_late_asks_for_the_history_first():
    ing = KVEventIngest(KVIndex())
    late = batch(5, store(["e5"], 5, parent="e4"))
    out = ing.on_batch("a", late)
    assert out.action is Action.REPLAY and out.replay_from == 0
    for seq in range(5):  # what the replay returns
        parent = f"e{seq - 1}" if seq else None
        assert (
            ing.on_batch("a", batch(seq, store([f"e{seq}"], seq, parent=parent)), can_replay=False).action
            is Action.APPLIED
        )
    assert ing.on_batch("a", late, can_replay=False).action is Action.APPLIED
    assert held(ing, "a") == 6


def test_an_unreplayable_gap_forgets_the_replica_and_carries_on():
    ing = KVEventIngest(KVIndex())
    ing.on_batch("a", batch(0, store(["e0", "e1"], 0)))
    assert ing.on_batch("a", batch(3, store(["x"], 0))).action is Action.REPLAY
    out = ing.on_batch("a", batch(3, store(["x"], 0)), can_replay=False)
    assert out.action is Action.RESYNCED and out.resync is ResyncReason.GAP
    assert held(ing, "a") == 1


def test_a_restarted_publisher_starts_from_an_empty_cache():
    ing = KVEventIngest(KVIndex())
    ing.on_batch("a", batch(0, store(["e0", "e1", "e2"], 0)))
    ing.on_batch("a", batch(1))
    out = ing.on_batch("a", batch(0, store(["n0"], 0)))
    assert out.resync is ResyncReason.RESTART and held(ing, "a") == 1


def test_duplicates_are_ignored_and_lost_parents_force_a_resync():
    ing = KVEventIngest(KVIndex())
    ing.on_batch("a", batch(0, store(["e0"], 0)))
    assert ing.on_batch("a", batch(0, store(["e0"], 0))).action is Action.DUPLICATE
    out = ing.on_batch("a", batch(1, store(["e9"], 3, parent="missing")))
    assert out.resync is ResyncReason.ORPHANED and held(ing, "a") == 0


def test_a_departed_replica_is_forgotten_with_its_blocks():
    ing = KVEventIngest(KVIndex())
    ing.on_batch("a", batch(0, store(["e0"], 0)))
    ing.forget("a")
    assert ing.index.num_blocks() == 0 and ing.last_seq("a") is None
