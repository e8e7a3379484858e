"""The planner as Serve's autoscaling policy: two pool policies of one app
share one planner; contexts in, replica counts out (Serve's context faked)."""

from __future__ import annotations

from types import SimpleNamespace

from deployments.planner_policy import SlaPlannerPolicy


def app_args(mode: str = "act", app_name: str = "a") -> dict:
    engine = {"kind": "sim", "gpu": "H100", "model": "llama-3.1-8b"}
    return {"model": {"name": "m", "source": "/models/m", "max_model_len": 32768},
            "prefill_pool": {"replicas": 1, "engine": engine}, "decode_pool": {"replicas": 1, "engine": engine},
            "sla": {"ttft_p99_ms": 500, "itl_p50_ms": 30},
            "planner": {"mode": mode, "interval_s": 10, "predictor": "constant",
                        "prefill": {"max_replicas": 8}, "decode": {"max_replicas": 8}}}


def ctx(app: str, now: float, metrics: dict, replicas: int = 1):
    return SimpleNamespace(app_name=app, current_time=now, aggregated_metrics=metrics,
                           current_num_replicas=replicas, target_num_replicas=replicas)


def replica_metrics(**values) -> dict:
    return {k: {"r1": v} for k, v in values.items()}


DECODE = replica_metrics(arrival_rate=20.0, mean_isl=4000.0, mean_osl=50.0, prompt_tokens=80000.0, cached_tokens=0.0,
                         first_token_p99_s=0.02, itl_p50_s=0.01, waiting=0.0)
PREFILL = replica_metrics(arrival_rate=20.0, mean_isl=4000.0, mean_osl=0.0, prompt_tokens=80000.0, cached_tokens=0.0,
                          first_token_p99_s=0.2, itl_p50_s=-1.0, waiting=3.0)


def run(args: dict, app: str) -> list[tuple[int, int]]:
    prefill = SlaPlannerPolicy(app=args, pool="prefill_pool")
    decode = SlaPlannerPolicy(app=args, pool="decode_pool")
    out = []
    for now in (0.0, 5.0, 10.0, 15.0):
        out.append((prefill(ctx(app, now, PREFILL))[0], decode(ctx(app, now, DECODE))[0]))
    return out


def test_both_pools_are_sized_together_once_an_interval_has_passed():
    counts = run(app_args("act"), "act-app")
    # 20 req/s x 4000 uncached tokens needs several prefill H100s within 500 ms p99; 1000 output tokens/s one decode.
    assert counts[0] == (1, 1) and counts[1] == (1, 1)
    assert counts[2][0] > 1 and counts[2][1] == 1
    assert counts[3] == counts[2]  # nothing new until the next interval


def test_advisory_mode_decides_but_changes_nothing():
    assert run(app_args("advisory"), "advisory-app") == [(1, 1)] * 4

