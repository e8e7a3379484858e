"""The cluster simulator: the real scheduler in front of simulated replicas on
a virtual clock, driven through its public API with plain request lists."""

from __future__ import annotations

import random
from dataclasses import dataclass

from orchestrator.config import RoutingConfig
from orchestrator.sim.cluster import ClusterSim, ClusterSpec
from orchestrator.sim.link import LINKS
from orchestrator.sim.perf_model import roofline

PERF = roofline("H100", "llama-3.1-8b")


@dataclass(frozen=True)
class Req:
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival_s: float | None = None


def prefix_workload(n: int, prefixes: int, prefix_len: int, suffix_len: int, rate: float, seed: int = 0) -> list[Req]:
    rng = random.Random(seed)
    shared = [tuple(rng.randrange(100, 30000) for _ in range(prefix_len)) for _ in range(prefixes)]
    out, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        suffix = tuple(rng.randrange(100, 30000) for _ in range(suffix_len))
        out.append(Req(shared[rng.randrange(prefixes)] + suffix, 32, t))
    return out


def simulate(requests, prefill=0, decode=4, policy="kv_aware", seed=0, num_blocks=4000, **spec):
    cluster = ClusterSpec(prefill, decode, num_blocks=num_blocks, routing=RoutingConfig(policy=policy), **spec)
    return ClusterSim(cluster, PERF, LINKS["nvlink"], seed=seed).run(requests)


def hit_rate(outcomes) -> float:
    return sum(o.cached_tokens for o in outcomes) / sum(o.prompt_tokens for o in outcomes)


def test_every_request_finishes_with_its_tokens_in_order():
    outcomes = simulate(prefix_workload(60, prefixes=4, prefix_len=1024, suffix_len=64, rate=20))
    assert len(outcomes) == 60 and all(o.finished for o in outcomes)
    for o in outcomes:
        assert o.token_times == sorted(o.token_times) and o.token_times[0] > o.arrival_s
        assert o.ttft_s > 0 and len(o.itl_s) == 31


def test_the_same_seed_gives_the_same_run():
    requests = prefix_workload(40, prefixes=4, prefix_len=512, suffix_len=64, rate=30)
    first = simulate(requests, prefill=2, decode=2, seed=3)
    second = simulate(requests, prefill=2, decode=2, seed=3)
    assert [(o.token_times, o.route) for o in first] == [(o.token_times, o.route) for o in second]


def test_kv_aware_routing_finds_more_of_the_cache_than_round_robin():
    # 8 prefixes x 2048 tokens = 1024 blocks: every replica could hold them all,
    # but round robin makes every replica compute every prefix once. (At light
    # load; under heavy load the cost function trades cache hits for balance.)
    requests = prefix_workload(200, prefixes=8, prefix_len=2048, suffix_len=64, rate=2, seed=1)
    kv = hit_rate(simulate(requests, policy="kv_aware"))
    rr = hit_rate(simulate(requests, policy="round_robin"))
    assert kv > rr + 0.05, (kv, rr)


def test_long_prompts_are_disaggregated_and_their_kv_reaches_decode():
    requests = prefix_workload(30, prefixes=1, prefix_len=0, suffix_len=2112, rate=10)  # nothing shared
    sim = ClusterSim(ClusterSpec(2, 2, num_blocks=4000), PERF, LINKS["infiniband"])
    outcomes = sim.run(requests)
    assert all(o.finished and o.route.remote_prefill for o in outcomes)
    assert sum(r.core.prompt_tokens_transferred for r in sim.decode) == sum(o.prompt_tokens - 1 for o in outcomes)
    assert sum(r.core.prompt_tokens_computed for r in sim.prefill) == sum(o.prompt_tokens for o in outcomes)
    # Every prefill replica freed its held blocks once the transfers were over.
    assert all(r.core.blocks.free_blocks == 4000 for r in sim.prefill + sim.decode)


def test_short_prompts_are_prefilled_on_the_decode_replica():
    requests = prefix_workload(20, prefixes=1, prefix_len=0, suffix_len=192, rate=10)
    sim = ClusterSim(ClusterSpec(2, 2, num_blocks=4000), PERF, LINKS["infiniband"])
    outcomes = sim.run(requests)
    assert not any(o.route.remote_prefill for o in outcomes)
    assert sum(r.core.prompt_tokens_computed for r in sim.prefill) == 0


def test_a_closed_loop_keeps_the_given_number_of_requests_in_flight():
    requests = [Req(tuple(range(100 + i, 400 + i)), 16) for i in range(24)]
    sim = ClusterSim(ClusterSpec(0, 2, num_blocks=4000), PERF, LINKS["nvlink"])
    outcomes = sim.run_closed(requests, concurrency=4)
    assert len(outcomes) == 24 and all(o.finished for o in outcomes)
    arrivals = sorted(o.arrival_s for o in outcomes)
    assert arrivals[:4] == [0.0] * 4 and arrivals[4] > 0.0
    # At any arrival, at most 4 requests are unfinished.
    for t in arrivals:
        assert sum(1 for o in outcomes if o.arrival_s <= t < o.token_times[-1]) <= 4
