"""What one replica sustains within the SLA, from a performance model (a
measured profile, or the roofline of a simulated GPU).

    prefill  service time s = step_time(one prompt of `isl` uncached tokens)
             the mean TTFT of a G/G/1 queue (Kingman) is
             s + rho/(1 - rho) * (ca^2 + cs^2)/2 * s; the planner passes the
             arrivals' ca^2 as the burstiness b (1: Poisson, M/D/1) and
             leaves the prompt lengths' spread to queueing_factor. Holding the mean under T = target/queueing_factor
             (the p99 target, with p99 ~ factor x mean) caps the utilisation:
             rho_max = 2(T - s) / (2(T - s) + b s).
             capacity = rho_max * isl / s  prompt tokens per second
             wait: the factor on the wait only, p99 ~ s + queueing_factor x
             Wmean: a prompt's own service time is no queue's, so a prompt
             that takes half the target leaves the queue the other half
             instead of nothing: rho_max = 2(T - s) / (2(T - s) + f b s),
             T the p99 target, f the factor (the same as the mean rule's
             while s is small against T).
    prefill by priority (SLO classes: the engines take waiting prompts by
             priority, but a prompt already being computed keeps its token
             budget, so a lower level's prompts in service delay a higher
             level's, and a prompt of a higher level never waits behind a
             lower level's queue): level k needs the replicas the `wait`
             rule gives the prompts of the levels up to k held to k's
             target, plus the replicas the lower levels' prompts keep busy
             (their work, rate x service time, in full: no headroom of
             theirs is shared); the pool the most any SLO level needs. With
             one level it is the `wait` rule.
    decode   the largest batch b whose step time at context `ctx` stays within
             the ITL target and whose KV fits the replica:
             capacity = b / step_time(b)  output tokens per second
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.sim.perf_model import Batch, PerfModel


def prefill_service_s(perf: PerfModel, uncached_tokens: float) -> float:
    n = max(int(round(uncached_tokens)), 1)
    return perf.step_time(Batch(prefill=((n, 0),)))


def prefill_capacity(
    perf: PerfModel,
    uncached_tokens: float,
    ttft_target_s: float,
    queueing_factor: float,
    burstiness: float = 1.0,
    factor_on_wait_only: bool = False,
) -> float:
    """Prompt tokens per second one replica prefills within the TTFT target (0 when even an idle replica
    misses it): its mean TTFT under target / factor, or (`factor_on_wait_only`) its service time plus factor x
    its mean wait under the target."""
    s = prefill_service_s(perf, uncached_tokens)
    budget, factor = (ttft_target_s, queueing_factor) if factor_on_wait_only else (ttft_target_s / queueing_factor, 1)
    if s >= budget:
        return 0.0
    slack = budget - s
    rho_max = 2 * slack / (2 * slack + factor * burstiness * s)
    return rho_max * max(uncached_tokens, 1.0) / s


@dataclass(frozen=True)
class PromptLevel:
    """One priority level's prompts: per second, uncached tokens each, and the TTFT p99 target (None: none)."""

    rate: float
    uncached_tokens: float
    ttft_target_s: float | None


def priority_prefill_need(
    perf: PerfModel, levels: Sequence[PromptLevel], queueing_factor: float, burstiness: float = 1.0
) -> float:
    """Replicas (fractional) that hold every level with a target within it, `levels` highest priority first
    (the module's docstring; inf: no count holds one, 0: no level with a target or no load)."""
    need = 0.0
    for k, level in enumerate(levels):
        if level.ttft_target_s is None:
            continue
        upto, below = levels[: k + 1], levels[k + 1 :]
        rate = sum(v.rate for v in upto)
        if rate <= 0:
            continue
        tokens = sum(v.rate * v.uncached_tokens for v in upto) / rate
        capacity = prefill_capacity(
            perf, tokens, level.ttft_target_s, queueing_factor, burstiness, factor_on_wait_only=True
        )
        if capacity <= 0:
            return math.inf
        busy = sum(v.rate * prefill_service_s(perf, v.uncached_tokens) for v in below if v.rate > 0)
        need = max(need, rate * tokens / capacity + busy)
    return need


def decode_batch_limit(
    perf: PerfModel,
    context: float,
    itl_target_s: float,
    kv_capacity_tokens: int | None,
    max_num_seqs: int,
    step_scale: float = 1.0,
) -> int:
    """The largest batch within the ITL target and the KV capacity (0: none), a step taking `step_scale` x the
    model's."""
    ctx = max(int(round(context)), 1)
    limit = max_num_seqs
    if kv_capacity_tokens:
        limit = min(limit, kv_capacity_tokens // ctx)

    def within(b: int) -> bool:
        return step_scale * perf.step_time(Batch(decode_contexts=(ctx,) * b)) <= itl_target_s * (1 + 1e-9)

    if limit < 1 or not within(1):
        return 0
    lo, hi = 1, limit  # within(lo) holds
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if within(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def decode_capacity(
    perf: PerfModel,
    context: float,
    itl_target_s: float,
    kv_capacity_tokens: int | None,
    max_num_seqs: int,
    step_scale: float = 1.0,
) -> float:
    """Output tokens per second one replica decodes within the ITL target, a step taking `step_scale` x the
    model's."""
    b = decode_batch_limit(perf, context, itl_target_s, kv_capacity_tokens, max_num_seqs, step_scale)
    if b == 0:
        return 0.0
    return b / (step_scale * perf.step_time(Batch(decode_contexts=(max(int(round(context)), 1),) * b)))
