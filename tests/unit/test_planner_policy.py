"""The planner as Serve's autoscaling policy: two pool policies of one app
share one planner; contexts in, replica counts out (Serve's context faked)."""

from __future__ import annotations

from types import SimpleNamespace

from deployments.planner_policy import SlaPlannerPolicy


def app_args(mode: str = "act", app_name: str = "a") -> dict:
    engine = {"kind": "sim", "gpu": "H100", "model": "llama-3.1-8b"}
    return {
        "model": {"name": "m", "source": "/models/m", "max_model_len": 32768},
        "prefill_pool": {"replicas": 1, "engine": engine},
        "decode_pool": {"replicas": 1, "engine": engine},
        "sla": {"ttft_p99_ms": 500, "itl_p50_ms": 30},
        "planner": {
            "mode": mode,
            "interval_s": 10,
            "predictor": "constant",
            # the prefill rule the hand arithmetic below was done with (the default is wait, factor 4)
            "prefill_queueing": "kingman",
            "queueing_factor": 3,
            "prefill": {"max_replicas": 8},
            "decode": {"max_replicas": 8},
        },
    }


def ctx(app: str, now: float, metrics: dict, replicas: int = 1):
    return SimpleNamespace(
        app_name=app,
        current_time=now,
        aggregated_metrics=metrics,
        current_num_replicas=replicas,
        target_num_replicas=replicas,
    )


def replica_metrics(**values) -> dict:
    return {k: {"r1": v} for k, v in values.items()}


DECODE = replica_metrics(
    arrival_rate=20.0,
    mean_isl=4000.0,
    mean_osl=50.0,
    prompt_tokens=80000.0,
    cached_tokens=0.0,
    first_token_p99_s=0.02,
    itl_p50_s=0.01,
    waiting=0.0,
)
PREFILL = replica_metrics(
    arrival_rate=20.0,
    mean_isl=4000.0,
    mean_osl=0.0,
    prompt_tokens=80000.0,
    cached_tokens=0.0,
    first_token_p99_s=0.2,
    itl_p50_s=-1.0,
    waiting=3.0,
)


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


# -- the observations read from each replica's latest report --------------------------------------------------------


def series(*points: tuple[float, float]) -> list:
    return [SimpleNamespace(timestamp=t, value=v) for t, v in points]


def raw_ctx(app: str, now: float, aggregated: dict, raw: dict, replicas: int):
    return SimpleNamespace(**vars(ctx(app, now, aggregated, replicas)), raw_metrics=raw)


def bucket_report(bucket_now: float, counts: list[float]) -> dict[str, float]:
    return {
        "bucket_now": bucket_now,
        "peak_window_s": 2.0,
        "peak_prompt_tps": max(counts[:-1]) / 2,
        **{f"prompt_tokens_bucket_{j}": c for j, c in enumerate(counts, start=1)},
    }


def test_queued_prompt_tokens_and_the_pool_peak_come_from_the_latest_reports():
    from deployments.registries import coordinator

    # Prefill: two replicas, queued prompt tokens 9000 / 6000 a second ago, 3000 / 1500 now.
    prefill_raw = {
        "queued_prompt_tokens": {"p1": series((99.0, 9000), (100.0, 3000)), "p2": series((99.5, 6000), (100.5, 1500))}
    }
    prefill_agg = {**PREFILL, "queued_prompt_tokens": {"p1": 9000.0, "p2": 6000.0}}  # Serve's max over its look-back
    # Decode: in 2 s buckets, d1 had 1000 prompt tokens in bucket 51 and d2 800 in bucket 50 (both reporting
    # in bucket 52): the pool peaked at 1000 tokens / 2 s = 500/s; the replicas' own peaks add up to 900/s.
    latest = {"d1": bucket_report(52, [1000, 0, 0]), "d2": bucket_report(52, [0, 800, 0])}
    decode_raw = {name: {r: series((100.0, report[name])) for r, report in latest.items()} for name in latest["d1"]}
    decode_agg = {k: {"d1": v["r1"]} for k, v in DECODE.items()}
    args = app_args("act", "latest-app")
    prefill = SlaPlannerPolicy(app=args, pool="prefill_pool")
    decode = SlaPlannerPolicy(app=args, pool="decode_pool")
    prefill(raw_ctx("latest-app", 100.0, prefill_agg, prefill_raw, 2))
    decode(raw_ctx("latest-app", 100.0, decode_agg, decode_raw, 2))
    obs = coordinator("latest-app").observation(10.0)
    assert obs.prefill_queued_tokens == 4500
    assert obs.peak_prompt_tps == 500 and obs.peak_window_s == 2
    # 20 req/s x 4000 tokens = 80,000 prompt tokens/s on average: no peak over the mean.
    assert obs.peak_ratio == 1.0


def test_without_raw_time_series_the_aggregated_values_stand_in():
    from deployments.registries import coordinator

    args = app_args("act", "aggregated-app")
    prefill = SlaPlannerPolicy(app=args, pool="prefill_pool")
    decode = SlaPlannerPolicy(app=args, pool="decode_pool")
    prefill(ctx("aggregated-app", 0.0, {**PREFILL, **replica_metrics(queued_prompt_tokens=7000.0)}))
    decode(ctx("aggregated-app", 0.0, {**DECODE, **replica_metrics(**bucket_report(52, [400_000, 200_000, 0]))}))
    obs = coordinator("aggregated-app").observation(10.0)
    assert obs.prefill_queued_tokens == 7000
    # 400,000 tokens in 2 s = 200,000/s over a mean of 80,000/s: a 2.5x burst.
    assert obs.peak_prompt_tps == 200_000 and obs.peak_ratio == 2.5


def test_a_prefill_queue_and_a_burst_each_add_prefill_replicas():
    def prefill_count(app: str, queued: float, buckets: list[float]) -> int:
        args = app_args("act", app)
        prefill = SlaPlannerPolicy(app=args, pool="prefill_pool")
        decode = SlaPlannerPolicy(app=args, pool="decode_pool")
        p_metrics = {**PREFILL, **replica_metrics(queued_prompt_tokens=queued)}
        d_metrics = {**DECODE, **replica_metrics(**bucket_report(52, buckets))}
        for now in (0.0, 10.0):
            counts = prefill(ctx(app, now, p_metrics))[0], decode(ctx(app, now, d_metrics))[0]
        return counts[0]

    # 80,000 prompt tokens/s in every bucket (peak = mean): 6.66 H100s by the M/D/1 term -> 7.
    flat = prefill_count("flat-app", 0.0, [160_000, 160_000, 0])
    # + 400,000 tokens queued, cleared within the 10 s interval at ~31,400 tokens/s a replica flat out: + 1.27 -> 8.
    queued = prefill_count("queued-app", 400_000.0, [160_000, 160_000, 0])
    # The interval's 800,000 tokens in one 2 s bucket: 400,000/s over 31,400 x (1 + 0.5 s / 2 s) a replica: 10.2,
    # capped at max_replicas 8.
    burst = prefill_count("burst-app", 0.0, [800_000, 0, 0])
    assert (flat, queued, burst) == (7, 8, 8)
