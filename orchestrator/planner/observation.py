"""The one way an interval becomes the planner's Observation: from the
latest `ReplicaReport` of every serving replica of each pool.

    requests        decode pool's arrivals/s x interval (every request reaches a decode replica)
    mean ISL        decode pool's, weighted by each replica's arrivals
    mean OSL        decode pool's, weighted by each replica's finished requests (None: none finished)
    asked OSL       decode pool's mean `max_tokens` of the arrivals, weighted by their count (None: not known)
    output share    decode pool's output tokens / `max_tokens` of the finished requests (None: not known)
    running         decode pool's requests streaming output at the snapshot, summed
    prefix hits     cached / prompt tokens, both pools' cache hits over the decode pool's prompt tokens
    TTFT p99        the worst decode replica's, plus the worst prefill replica's where there is a
                    prefill pool (a client's first token waits for both)
    ITL p50         the mean of the decode replicas'
    waiting         per pool, summed
    queued tokens   the prefill pool's prompt tokens with no first token yet, summed
    peak            the decode pool's prompt tokens/s over its busiest peak bucket (pool_peak_prompt_tps)
    dispersion      of the decode pool's prompt tokens per peak bucket, in mean ISLs (prompt_dispersion)
    length scv      cs^2 of the decode pool's arrived prompt lengths (prompt_length_scv)
    recent          the decode pool's prompt tokens/s over its newest RECENT_BUCKETS peak buckets
    reports         per pool, how many reports made it (0 with replicas in force: a metrics gap)
    in force        per pool, the replicas asked for, starting or serving (None: not known)
    levels          per engine priority the replicas recorded by (levels.observe_levels)

Ray Serve's policy (deployments/planner_policy.py) reads the reports from
the replicas' custom autoscaling metrics; the cluster simulator
(orchestrator/sim/cluster.py) from its simulated replicas' own load windows,
fed at the moments a Serve replica would feed its window.
"""

from __future__ import annotations

from collections.abc import Sequence

from orchestrator.planner.levels import observe_levels
from orchestrator.planner.observer import (
    ReplicaReport,
    pool_peak_prompt_tps,
    pool_prompt_buckets,
    prompt_dispersion,
    prompt_length_scv,
)
from orchestrator.planner.planner import Observation

RECENT_BUCKETS = 3  # the newest peak buckets the recent prompt rate is read over (the fast loop's)


def observe_pools(
    interval_s: float,
    prefill: Sequence[ReplicaReport] | None,
    decode: Sequence[ReplicaReport],
    prefill_ready: int,
    decode_ready: int,
    prefill_in_force: int | None = None,
    decode_in_force: int | None = None,
) -> Observation:
    """`prefill` None: aggregated serving (no prefill pool)."""
    disaggregated = prefill is not None
    prefill = prefill or []
    rate = sum(r.arrival_rate for r in decode)
    prompt = sum(r.prompt_tokens for r in decode)
    cached = sum(r.cached_tokens for r in decode) + sum(r.cached_tokens for r in prefill)
    ttft = _worst(r.first_token_p99_s for r in decode)
    prefill_ttft = _worst(r.first_token_p99_s for r in prefill)
    if ttft is not None and prefill_ttft is not None:
        ttft += prefill_ttft
    itl = [r.itl_p50_s for r in decode if r.itl_p50_s is not None]
    peak = pool_peak_prompt_tps(decode)
    widths = [r.peak_window_s for r in decode if r.peak_window_s]
    mean_isl = _weighted(decode, "mean_isl")
    pooled = pool_prompt_buckets(decode)
    return Observation(
        interval_s=interval_s,
        requests=round(rate * interval_s),
        mean_isl=mean_isl,
        mean_osl=_mean_osl(decode),
        mean_max_tokens=_weighted_known(decode, "mean_max_tokens", "arrival_rate"),
        output_share=_output_share(decode),
        decode_running=round(sum(r.running for r in decode)),
        prefix_hit_rate=min(cached / prompt, 1.0) if prompt else 0.0,
        ttft_p99_s=ttft,
        itl_p50_s=sum(itl) / len(itl) if itl else None,
        prefill_replicas=prefill_ready,
        decode_replicas=decode_ready,
        prefill_waiting=round(sum(r.waiting for r in prefill)),
        decode_waiting=round(sum(r.waiting for r in decode)),
        prefill_queued_tokens=sum(r.queued_prompt_tokens for r in prefill),
        peak_prompt_tps=peak,
        peak_window_s=max(widths) if peak is not None and widths else None,
        prompt_dispersion=prompt_dispersion(pooled[1], mean_isl) if pooled is not None else None,
        prompt_length_scv=prompt_length_scv(decode),
        recent_prompt_tps=sum(pooled[1][:RECENT_BUCKETS]) / (pooled[0] * min(len(pooled[1]), RECENT_BUCKETS))
        if pooled is not None and pooled[1]
        else None,
        prefill_reports=len(prefill) if disaggregated else None,
        decode_reports=len(decode),
        prefill_in_force=prefill_in_force,
        decode_in_force=decode_in_force,
        levels=observe_levels([r.levels for r in prefill], [r.levels for r in decode]),
    )


def _worst(values) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _mean_osl(reports: Sequence[ReplicaReport]) -> float | None:
    """Output tokens per finished request over the pool (None: none finished,
    which says nothing about the outputs of the requests in flight)."""
    finished = sum(r.finished for r in reports)
    if not finished:
        return None
    return sum(r.mean_osl * r.finished for r in reports) / finished


def _weighted_known(reports: Sequence[ReplicaReport], field: str, weight: str) -> float | None:
    """`field` averaged over the reports with weight > 0, None where one of them does not know it (0)."""
    counted = [r for r in reports if getattr(r, weight) > 0]
    total = sum(getattr(r, weight) for r in counted)
    if not counted or any(getattr(r, field) <= 0 for r in counted):
        return None
    return sum(getattr(r, field) * getattr(r, weight) for r in counted) / total


def _output_share(reports: Sequence[ReplicaReport]) -> float | None:
    """Output tokens the finished requests made per token they asked for (None: none finished, or an ask
    not known)."""
    asked = _weighted_known(reports, "finished_max_tokens", "finished")
    made = _mean_osl(reports)
    if asked is None or made is None:
        return None
    return made / asked


def _weighted(reports: Sequence[ReplicaReport], field: str) -> float:
    total = sum(r.arrival_rate for r in reports)
    if not total:
        return 0.0
    return sum(getattr(r, field) * r.arrival_rate for r in reports) / total
