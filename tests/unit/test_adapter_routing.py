"""Routing by LoRA adapter, with plain data: the KV-aware scheduler weighs each replica's adapter slots
(routing/adapter_slots.py) beside KV locality and load, and the simulated engine keeps vLLM's slot rule and
host cache (sim/lora_slots.py). Scripted lifecycles in virtual time."""

from __future__ import annotations

import random

from orchestrator.config import LoraConfig, RoutingConfig
from orchestrator.kv.index import KVIndex
from orchestrator.lora.adapter import LoraAdapter
from orchestrator.messages import EngineRequest, SamplingSpec
from orchestrator.pools import ReplicaView
from orchestrator.routing import make_scheduler
from orchestrator.routing.kv_scheduler import KvAwareScheduler
from orchestrator.sim.core import SimCore, SimRequest
from orchestrator.sim.lora_slots import LoraSpec
from orchestrator.sim.perf_model import roofline

BS = 16
DECODE = [ReplicaView("d0"), ReplicaView("d1")]


def scheduler(max_loras=1, max_cpu_loras=2, **routing) -> KvAwareScheduler:
    config = RoutingConfig(**{"kv_events": False, "local_prefill_max_tokens": 10_000, **routing})
    lora = LoraConfig(max_loras=max_loras, max_cpu_loras=max_cpu_loras)
    sched = make_scheduler(config, BS, KVIndex(), rng=random.Random(0), lora=lora)
    assert isinstance(sched, KvAwareScheduler)
    return sched


def request(rid: str, adapter: str | None, seed: int = 0, n: int = 4 * BS) -> EngineRequest:
    rng = random.Random(seed)
    tokens = tuple(rng.randrange(1, 500) for _ in range(n))
    lora = LoraAdapter(adapter, f"/loras/{adapter}") if adapter else None
    return EngineRequest(rid, tokens, SamplingSpec(max_tokens=8), lora=lora)


def route(sched, rid, adapter, seed=0, prefill=None):
    return sched.route_request(request(rid, adapter, seed), prefill, DECODE)


def test_a_request_goes_where_its_adapter_runs_and_avoids_full_slots():
    sched = scheduler(max_loras=1)
    first = route(sched, "a1", "A", seed=1).decode_replica
    other = ({"d0", "d1"} - {first}).pop()
    # Another prompt (no shared blocks) with the same adapter: its replica, though the other is idle.
    assert route(sched, "a2", "A", seed=2).decode_replica == first
    # Another adapter: `first`'s one slot runs A, so B goes to the other replica.
    assert route(sched, "b1", "B", seed=3).decode_replica == other
    # Base-model requests pay no adapter cost anywhere: they balance on load alone.
    assert route(sched, "base", None, seed=4).decode_replica == other  # two requests on `first`, one here
    # Once A's requests finish, `first` has a free slot again; B still prefers where it runs.
    for rid in ("a1", "a2"):
        sched.on_request_finished(rid)
    assert route(sched, "b2", "B", seed=5).decode_replica == other


def test_a_hot_adapter_spreads_once_its_replica_is_loaded_enough():
    sched = scheduler(max_loras=2, lora_load_blocks=16)
    placed = [route(sched, f"a{i}", "A", seed=10 + i).decode_replica for i in range(8)]
    # A request is 4 prompt blocks to prefill and 5 to decode: the second replica's adapter load (16 blocks)
    # is worth paying once the first holds two requests more; from then on both run A and share it.
    first = placed[0]
    assert placed[:2] == [first, first] and placed[2] != first
    assert sched.adapters.running("d0") == sched.adapters.running("d1") == {"A"}
    assert abs(placed.count("d0") - placed.count("d1")) <= 2


def test_an_adapter_evicted_from_the_host_cache_costs_a_load_again():
    sched = scheduler(max_loras=1, max_cpu_loras=1, lora_load_blocks=40)
    # d0 and d1 each get an adapter, then finish: each replica's cache holds its own.
    assert route(sched, "a", "A", seed=1).decode_replica == "d1"
    assert route(sched, "b", "B", seed=2).decode_replica == "d0"
    for rid in ("a", "b"):
        sched.on_request_finished(rid)
    # A again: cached on d1, a load on d0.
    assert route(sched, "a2", "A", seed=3).decode_replica == "d1"
    sched.on_request_finished("a2")
    # C evicts A from d1's one-entry cache; A then costs a load on both and goes by load (d1 runs C).
    assert route(sched, "c", "C", seed=4).decode_replica in {"d0", "d1"}
    c_on = sched.adapters.running("d0") | sched.adapters.running("d1")
    assert c_on == {"C"}


def test_a_remote_prefill_holds_the_prefill_replicas_slot_until_it_is_done():
    sched = scheduler(max_loras=1, local_prefill_max_tokens=0)
    prefill = [ReplicaView("p0"), ReplicaView("p1")]
    first = route(sched, "a", "A", seed=1, prefill=prefill)
    assert first.remote_prefill
    p = first.prefill_replica
    assert sched.adapters.running(p) == {"A"}
    assert route(sched, "b", "B", seed=2, prefill=prefill).prefill_replica != p
    sched.on_prefill_done("a")
    assert sched.adapters.running(p) == set()
    assert sched.adapters.running(first.decode_replica) == {"A"}  # the decode replica runs it still


def _core(max_loras: int, max_cpu_loras: int, load_s: float = 0.05) -> SimCore:
    perf = roofline("H100", "llama-3.1-8b")
    return SimCore(perf, num_blocks=1000, block_size=BS, lora=LoraSpec(max_loras, max_cpu_loras, load_s))


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 500) for _ in range(2 * BS)]


def test_the_simulated_engine_runs_at_most_max_loras_adapters_a_batch_as_vllm_does():
    core = _core(max_loras=1, max_cpu_loras=2)
    core.add(SimRequest("a1", _prompt(1), 3, lora_name="A"))
    core.add(SimRequest("b1", _prompt(2), 3, lora_name="B"))  # skipped while A runs
    core.add(SimRequest("base", _prompt(3), 3))  # behind it, not blocked by it
    core.add(SimRequest("a2", _prompt(4), 3, lora_name="A"))
    first = core.step()
    assert {e.request_id for e in first.emitted} == {"a1", "base", "a2"}
    assert [r.request_id for r in core.waiting] == ["b1"]
    assert core.loras.loads == 1
    while core.running:
        core.step()
    core.step()  # A has drained: B runs, read from its source
    assert core.loras.loads == 2 and not core.waiting


def test_a_cached_adapter_costs_no_load_time_and_an_evicted_one_does():
    core = _core(max_loras=1, max_cpu_loras=1, load_s=0.5)
    durations = []
    for i, adapter in enumerate(["A", "A", "B", "A"]):
        core.add(SimRequest(f"r{i}", _prompt(10 + i), 1, lora_name=adapter))
        durations.append(core.step().duration_s)
    loaded = [d > 0.5 for d in durations]
    assert loaded == [True, False, True, True]  # A cached after its first read; B evicts it (one entry)
    assert core.loras.loads == 3


def test_the_per_request_cost_table_agrees_with_each_replicas_cost_through_a_random_lifecycle():
    """`costs_of` (what the scheduler reads, linear in the replicas that matter) is `cost` on every replica."""
    from orchestrator.routing.adapter_slots import AdapterCosts, AdapterSlots

    slots = AdapterSlots(AdapterCosts(max_loras=2, max_cpu_loras=3, load_blocks=7.0, slot_wait_blocks=100.0))
    rng = random.Random(5)
    replicas, adapters, live = [f"r{i}" for i in range(6)], [f"a{i}" for i in range(8)], []
    for step in range(2000):
        if live and rng.random() < 0.45:
            slots.finished(live.pop(rng.randrange(len(live))))
        else:
            key = (f"q{step}", rng.choice(["prefill", "decode"]))
            slots.routed(key, rng.choice(adapters), rng.choice(replicas))
            live.append(key)
        adapter = rng.choice(adapters)
        other, named = slots.costs_of(adapter)
        assert [named.get(r, other) for r in replicas] == [slots.cost(r, adapter) for r in replicas]
    for key in live:
        slots.finished(key)
    assert all(not slots.running(r) for r in replicas)
