"""The planner by SLO class: the classes' priority levels, each replica's load per priority, the pools'
observation per level, and the pools sized so that every SLO level meets its own targets, with best
effort within its share. Hand-checked against the capacity formulas of test_planner's profile."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from orchestrator.config import PlannerConfig, PoolBounds, RoutingConfig, SlaConfig, SloClassConfig
from orchestrator.planner.capacity import PromptLevel, prefill_capacity, priority_prefill_need
from orchestrator.planner.levels import LevelObservation, PriorityLevel, priority_levels
from orchestrator.planner.observation import observe_pools
from orchestrator.planner.observer import ReplicaLoadWindow, ReplicaReport
from orchestrator.planner.planner import Observation, SlaPlanner
from orchestrator.sim.cluster import ClusterSim, ClusterSpec
from orchestrator.sim.link import LINKS
from orchestrator.sim.perf_model import ProfileModel, roofline

# test_planner's profile: prefill 1 ms per 10 tokens; a decode step 10 ms + 1 ms per sequence.
PROFILE = ProfileModel(
    prefill_points=[(100, 0.01), (10_000, 1.0)],
    decode_points={1: [(100, 0.011), (10_000, 0.011)], 101: [(100, 0.111), (10_000, 0.111)]},
    kv_bytes=1,
)
STRICT = SlaConfig(ttft_p99_ms=600, itl_p50_ms=30)
INTERACTIVE = SloClassConfig(name="interactive", priority=0, ttft_p99_ms=600, itl_p50_ms=30)
BATCH = SloClassConfig(name="batch", priority=1, ttft_p99_ms=30_000, itl_p50_ms=100)
BEST_EFFORT = SloClassConfig(name="batch", priority=1)


def planner(classes=(), sla=STRICT, **cfg) -> SlaPlanner:
    config = PlannerConfig(
        mode="advisory",
        predictor="constant",
        decode_utilization=1.0,
        prefill=PoolBounds(min_replicas=1, max_replicas=20),
        decode=PoolBounds(min_replicas=1, max_replicas=20),
        **cfg,
    )
    return SlaPlanner(config, sla, PROFILE, kv_capacity_tokens=None, levels=priority_levels(classes))


def mixed(ttft=(0.3, 10.0), itl=(0.02, 0.02), replicas=1) -> Observation:
    """10 s: interactive 10 req/s (ISL 1000, OSL 200) and batch 10 req/s (ISL 3000, OSL 20); the pool's
    p99 is the batch's."""
    return Observation(
        interval_s=10,
        requests=200,
        mean_isl=2000,
        mean_osl=110,
        ttft_p99_s=max(ttft),
        itl_p50_s=max(itl),
        prefill_replicas=replicas,
        decode_replicas=replicas,
        levels=(
            LevelObservation(0, 10.0, 1000, 200, ttft[0], itl[0]),
            LevelObservation(1, 10.0, 3000, 20, ttft[1], itl[1]),
        ),
    )


def test_classes_at_one_priority_are_one_level_held_to_the_strictest_targets():
    looser = SloClassConfig(name="chat", priority=0, ttft_p99_ms=900, itl_p50_ms=20)
    levels = priority_levels([BEST_EFFORT, looser, INTERACTIVE])
    assert levels == (PriorityLevel(0, 0.6, 0.02), PriorityLevel(1))
    assert levels[1].best_effort and not levels[0].best_effort


def test_a_replica_reports_each_priority_and_the_pools_add_them_up_through_the_metrics():
    now = [0.0]
    windows = [ReplicaLoadWindow(span_s=10, clock=lambda: now[0], levels=(0, 1, 5)) for _ in range(2)]
    prefill, decode = windows
    for i in range(4):  # 2 interactive prompts of 100 tokens, 2 batch of 1000
        priority, tokens = (0, 100) if i % 2 == 0 else (1, 1000)
        now[0] = 1.0 + i
        key = prefill.arrived(tokens, priority=priority)
        prefill.closed(key)
        prefill.finished(0, 0, 0.05 if priority == 0 else 2.0, priority=priority)
        key = decode.arrived(tokens, 50 if priority == 0 else 10, priority)
        decode.prompt_done(key)
        decode.token_gap(0.02 if priority == 0 else 0.04, priority)
        decode.finished(5, 0, 0.1 if priority == 0 else 3.0, 50 if priority == 0 else 10, priority)
        decode.closed(key)
    now[0] = 9.0
    # What Serve carries (flat floats) reads back as it was sent.
    reports = [ReplicaReport.from_metrics(w.snapshot()) for w in windows]
    assert reports[1] == decode.report()
    assert [(lv.priority, lv.arrival_rate, lv.mean_isl, lv.mean_max_tokens) for lv in reports[1].levels] == [
        (0, 0.2, 100, 50),
        (1, 0.2, 1000, 10),
        (5, 0.0, 0.0, 0.0),  # every report carries every level: no key of an older report outlives it
    ]
    obs = observe_pools(10, [reports[0]], [reports[1]], 1, 1)
    # A client's first token waits for both pools: the prefill replica's p99 plus the decode replica's.
    assert [(lv.priority, lv.request_rate, lv.mean_osl) for lv in obs.levels] == [
        (0, 0.2, 50),
        (1, 0.2, 10),
        (5, 0.0, None),
    ]
    assert obs.levels[0].ttft_p99_s == pytest.approx(0.15) and obs.levels[1].ttft_p99_s == pytest.approx(5.0)
    assert obs.levels[0].itl_p50_s == pytest.approx(0.02) and obs.levels[1].itl_p50_s == pytest.approx(0.04)
    # A request at a priority no class has counts in the level that runs before it; without levels nothing per
    # level is sent.
    window = ReplicaLoadWindow(span_s=10, clock=lambda: now[0], levels=(0, 5))
    window.arrived(10, 0, priority=3)
    assert [lv.arrival_rate for lv in window.report().levels] == [0.1, 0.0]
    assert ReplicaLoadWindow(span_s=10).report().levels == ()


def test_batch_prompts_are_sized_at_their_own_target_and_decode_at_the_strictest_itl():
    # One target for all (600 ms): 20 req/s at ISL 2000, s = 200 ms, rho_max = 2(0.4) / (0.8 + 4 x 0.2) = 0.5,
    # 5000 tokens/s a replica for 40k tokens/s -> 8.
    # By class: interactive's own prompts, 10k tokens/s at ISL 1000 within 600 ms (s = 100 ms, rho_max =
    # 1 / 1.4: 7143 a replica) -> 1.4, plus the replicas batch prompts keep busy (10/s x 300 ms) -> 4.4; batch
    # with what runs before it, 40k tokens/s at ISL 2000 within 30 s (rho_max = 59.6 / 60.4) -> 4.05. 4.4 -> 5.
    # Decode, both: 2200 output tokens/s over 20 / 30 ms = 666.7 a replica -> 3.3 -> 4 (the ITL is shared).
    one = planner().step(mixed())
    by_class = planner([INTERACTIVE, BATCH]).step(mixed())
    assert (one.prefill, one.decode) == (8, 4)
    assert (by_class.prefill, by_class.decode) == (5, 4)
    assert by_class.proposed_prefill == pytest.approx(1.4 + 3.0)


def test_best_effort_adds_replicas_only_within_its_share_of_the_budget():
    # Share 0: what interactive needs beside the best-effort prompts being computed (4.4, as above), decode
    # 2000 / 666.7 = 3. The whole load with best effort held to interactive's 600 ms: 8 (the one target's),
    # decode 3.3. A share of 0.25 x 20 replicas lets best effort add up to 5: it adds 3.6 and 0.3.
    alone = planner([INTERACTIVE, BEST_EFFORT]).step(mixed())
    assert (alone.prefill, alone.decode) == (5, 3)
    shared = planner([INTERACTIVE, BEST_EFFORT], best_effort_share=0.25).step(mixed())
    assert shared.proposed_prefill == pytest.approx(8.0)
    assert (shared.prefill, shared.decode) == (8, 4)
    capped = planner([INTERACTIVE, BEST_EFFORT], best_effort_share=0.1).step(mixed())
    assert capped.proposed_prefill == pytest.approx(4.4 + 2.0)  # 0.1 x 20


def test_prompts_by_priority_with_one_level_are_the_one_target_rule():
    # One level: Cobham's wait is M/D/1's, the `wait` rule's capacity (test_planner's hand-checked 7143
    # tokens/s a replica at ISL 1000 within 600 ms).
    need = priority_prefill_need(PROFILE, [PromptLevel(20, 1000, 0.6)], queueing_factor=4.0)
    assert need == pytest.approx(20 * 1000 / prefill_capacity(PROFILE, 1000, 0.6, 4.0, factor_on_wait_only=True))
    assert priority_prefill_need(PROFILE, [PromptLevel(20, 7000, 0.6)], 4.0) == float("inf")  # 700 ms alone
    assert priority_prefill_need(PROFILE, [PromptLevel(20, 1000, None)], 4.0) == 0.0  # nothing held to a target


def test_best_effort_streams_running_count_only_within_their_share():
    # 100 streams running, a batch of 20 within 30 ms: 5 replicas' worth. Best effort's share of the output
    # load is 200 / 2200 of it: 0.45 replica, dropped with a share of 0 (4.55 -> 5 replicas, not 5 -> 5 + more).
    obs = mixed()
    obs = Observation(**{**obs.__dict__, "decode_running": 100})
    d = planner([INTERACTIVE, BEST_EFFORT]).step(obs)
    assert d.running_decode == pytest.approx(5 * 2000 / 2200)


def test_corrections_learn_from_each_slo_level_against_its_own_target():
    # The batch level's 10 s first tokens are within its 30 s: no reason to distrust the model. One target
    # for every request reads them as a miss of 600 ms, interval after interval, and corrects upwards.
    one, by_class = planner(), planner([INTERACTIVE, BATCH])
    for _ in range(4):
        one_decision = one.step(mixed(replicas=10))
        class_decision = by_class.step(mixed(replicas=10))
    assert one_decision.prefill_correction > 1.0
    assert class_decision.prefill_correction == 1.0
    # The interactive level over its own target, sized throughout: the model is wrong for it.
    for _ in range(4):
        class_decision = by_class.step(mixed(ttft=(1.2, 10.0), replicas=10))
    assert class_decision.prefill_correction > 1.0


def test_a_planner_needs_targets_from_the_sla_or_a_class():
    with pytest.raises(ValueError, match="SLO class with targets"):
        planner([BEST_EFFORT], sla=SlaConfig())
    assert planner([INTERACTIVE, BEST_EFFORT], sla=SlaConfig()).step(mixed()).prefill == 5


@dataclass(frozen=True)
class Req:
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival_s: float
    priority: int = 0


def test_the_simulator_carries_each_request_priority_to_its_engines_and_reports():
    # A prefill replica flooded with batch prompts: the interactive prompts that arrive later still
    # go first (the engines schedule by priority), and the pools report both levels to the planner.
    requests = [Req(tuple(range(1000 + i, 3000 + i)), 4, 0.0, priority=1) for i in range(40)]
    requests += [Req(tuple(range(50_000 + i, 50_500 + i)), 4, 0.01, priority=0) for i in range(5)]
    spec = ClusterSpec(1, 1, num_blocks=20_000, routing=RoutingConfig(), report_span_s=30, report_priorities=(0, 1))
    sim = ClusterSim(spec, roofline("H100", "llama-3.1-8b"), LINKS["nvlink"])
    outcomes = sim.run(requests)
    assert all(o.finished for o in outcomes)
    firsts = {p: sorted(o.token_times[0] for o in outcomes if o.priority == p) for p in (0, 1)}
    assert firsts[0][-1] < firsts[1][-1]  # every interactive first token before the last batch one
    obs = sim.observation(30)
    assert [(lv.priority, round(lv.request_rate * 30)) for lv in obs.levels] == [(0, 5), (1, 40)]
    assert obs.levels[0].ttft_p99_s < obs.levels[1].ttft_p99_s
