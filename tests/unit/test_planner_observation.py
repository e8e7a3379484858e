"""One observation path: simulated replicas report what Serve replicas report
(`ReplicaReport`), and the Serve policy and the cluster simulator turn the
same reports into the same Observation (orchestrator/planner/observation.py)."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from deployments.planner_policy import SlaPlannerPolicy
from deployments.registries import coordinator
from orchestrator.config import RoutingConfig
from orchestrator.planner.observation import observe_pools
from orchestrator.planner.observer import ReplicaReport
from orchestrator.sim.cluster import ClusterSim, ClusterSpec
from orchestrator.sim.link import LINKS
from orchestrator.sim.perf_model import roofline
from tests.unit.test_planner_policy import app_args
from tools.workloads import RequestSpec

INTERVAL_S = 10.0


def _requests(n: int, seed: int = 0) -> list[RequestSpec]:
    rng = random.Random(seed)
    specs = []
    for i in range(n):
        isl = rng.choice([64, 3000])  # short ones prefilled on the decode replica, long ones remotely
        specs.append(
            RequestSpec(
                tuple(rng.randrange(100, 30000) for _ in range(isl)), rng.randrange(5, 60), arrival_s=i * 9.0 / n
            )
        )
    return specs


def _simulated_interval():
    spec = ClusterSpec(
        1, 2, num_blocks=20_000, routing=RoutingConfig(local_prefill_max_tokens=512), report_span_s=INTERVAL_S
    )
    sim = ClusterSim(spec, roofline("H100", "llama-3.1-8b"), LINKS["infiniband"])
    seen = {}

    def at_interval_end(sim: ClusterSim) -> None:
        seen.update(
            prefill=sim.reports("prefill"), decode=sim.reports("decode"), observation=sim.observation(INTERVAL_S)
        )

    sim.every(INTERVAL_S, at_interval_end, INTERVAL_S)
    sim.run(_requests(40))
    return seen


def test_simulated_replicas_report_what_their_requests_did():
    seen = _simulated_interval()
    prefill, decode = seen["prefill"], seen["decode"]
    assert len(prefill) == 1 and len(decode) == 2
    assert sum(r.arrival_rate for r in decode) * INTERVAL_S == 40  # every request reaches a decode replica
    assert prefill[0].arrival_rate * INTERVAL_S == pytest.approx(
        sum(1 for r in _requests(40) if len(r.prompt_token_ids) > 512)
    )
    assert all(r.first_token_p99_s is not None and r.itl_p50_s is not None for r in decode)
    assert prefill[0].itl_p50_s is None and prefill[0].mean_osl == 0  # a prefill replica streams no tokens


def _ctx(pool_reports: list[ReplicaReport], now: float):
    metrics = {}
    for i, report in enumerate(pool_reports):
        for name, value in report.to_metrics().items():
            metrics.setdefault(name, {})[f"replica-{i}"] = value
    return SimpleNamespace(
        app_name="same-reports",
        current_time=now,
        aggregated_metrics=metrics,
        current_num_replicas=len(pool_reports),
        target_num_replicas=len(pool_reports),
    )


def test_the_serve_policy_and_the_simulator_build_the_same_observation_from_the_same_reports():
    seen = _simulated_interval()
    args = app_args("advisory", "same-reports")
    policies = {pool: SlaPlannerPolicy(app=args, pool=pool) for pool in ("prefill_pool", "decode_pool")}
    for now in (0.0, INTERVAL_S):
        policies["prefill_pool"](_ctx(seen["prefill"], now))
        policies["decode_pool"](_ctx(seen["decode"], now))
    served = coordinator("same-reports").observation(INTERVAL_S)
    assert served == seen["observation"]
    assert served.requests == 40 and served.prefill_replicas == 1 and served.decode_replicas == 2


def test_a_report_survives_serves_flat_metrics():
    report = ReplicaReport(
        arrival_rate=2.5,
        mean_isl=100.0,
        first_token_p99_s=None,
        itl_p50_s=0.01,
        peak_window_s=2.0,
        peak_prompt_tps=50.0,
        bucket_now=7.0,
        buckets=(100.0, 0.0, 30.0),
    )
    assert ReplicaReport.from_metrics(report.to_metrics()) == report
    assert report.to_metrics()["first_token_p99_s"] == -1.0


def test_the_pool_mean_osl_is_of_finished_requests_and_none_when_none_finished():
    # A replica whose requests are all still decoding says nothing about their outputs.
    busy = ReplicaReport(arrival_rate=1.0, mean_isl=400.0, mean_osl=0.0, finished=0.0)
    done = ReplicaReport(arrival_rate=0.1, mean_isl=400.0, mean_osl=220.0, finished=3.0)
    other = ReplicaReport(arrival_rate=0.1, mean_isl=400.0, mean_osl=20.0, finished=1.0)
    assert observe_pools(3.0, None, [busy], 0, 1).mean_osl is None
    assert observe_pools(3.0, None, [busy, done, other], 0, 3).mean_osl == pytest.approx((3 * 220 + 20) / 4)
    assert ReplicaReport.from_metrics(done.to_metrics()) == done


def test_the_recent_prompt_rate_is_the_pools_newest_buckets_summed_over_its_replicas():
    # Buckets of 2 s, newest first (j = 1 the last complete one), both replicas on the same clock.
    a = ReplicaReport(arrival_rate=1.0, peak_window_s=2.0, bucket_now=10.0, buckets=(400.0, 200.0, 0.0, 100.0, 50.0))
    b = ReplicaReport(arrival_rate=1.0, peak_window_s=2.0, bucket_now=10.0, buckets=(0.0, 200.0, 600.0, 100.0, 0.0))
    assert observe_pools(10.0, None, [a, b], 0, 2).recent_prompt_tps == pytest.approx((400 + 400 + 600) / 6)
    assert observe_pools(10.0, None, [ReplicaReport(arrival_rate=1.0)], 0, 1).recent_prompt_tps is None
