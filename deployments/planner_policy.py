"""The SLA planner as Ray Serve's autoscaling policy for both pools.

Each pool deployment gets this class as its custom autoscaling policy
(`autoscaling_config.policy`); Serve instantiates it once per deployment in
the controller and calls it every control-loop tick with that deployment's
context. The two instances of one application share a `_Coordinator` (same
controller process), which keeps one `SlaPlanner` for both pools: each tick
it takes the latest custom metrics of each pool (what its replicas report
through `record_autoscaling_stats`); once an interval has passed it builds
an Observation from both and decides both counts together. In advisory mode
it logs the decision and leaves the counts as they are.

Besides the windowed metrics (aggregated by Serve over its look-back,
`max`), two observations are read from each replica's latest report alone
(`ctx.raw_metrics`), as the simulator reads them at the interval's end:
  prefill_queued_tokens  the prompt tokens of requests the prefill pool's
                         replicas hold with no first token yet (the whole
                         prompt: a prompt half computed in chunks, or partly
                         in the prefix cache, counts in full);
  peak_prompt_tps        over the decode pool's replicas, which every request
                         reaches (the same arrivals as the interval's mean
                         prompt tokens/s): per peak bucket the sum of the
                         replicas' prompt tokens, the largest over the
                         newest buckets of one interval
                         (observer.pool_peak_prompt_tps; the sum of the
                         replicas' own peaks, an upper bound, where their
                         reports share no bucket).

Scale-down: Serve stops routing to a replica it removes and waits up to the
pool's `graceful_shutdown_timeout_s` for its in-flight requests; the
frontend's KV index drops the replica when it leaves the live set.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from orchestrator.config import AppConfig, PlannerMode
from orchestrator.engines import engine_adapter
from orchestrator.planner.observer import MISSING, pool_peak_prompt_tps
from orchestrator.planner.planner import Observation, ScalingDecision, SlaPlanner

log = logging.getLogger("ray.serve")

POOL_KEYS = {"prefill_pool": "prefill", "decode_pool": "decode"}


def make_planner(app: AppConfig) -> SlaPlanner:
    """The planner for an application: the profile it names, else the decode
    pool's engine's own performance model (the simulated engine's)."""
    from orchestrator.sim.perf_model import ProfileModel

    engine = app.decode_pool.engine
    inputs = engine_adapter(engine.kind).planner_inputs(engine)
    if app.planner.profile is not None:
        perf = ProfileModel.load(app.planner.profile)
        kv_tokens = perf.meta.get("kv_capacity_tokens") or None
        if inputs.kv_cache_bytes is not None and perf.kv_bytes_per_token:
            # On CPU the pool's KV budget is a byte count of its own config, not
            # whatever the profiled engine had.
            kv_tokens = inputs.kv_cache_bytes // perf.kv_bytes_per_token
    elif inputs.own_performance is not None:
        perf, kv_tokens = inputs.own_performance(app.kv_cache.block_size)
    else:
        raise ValueError(f"planner.profile is required for {engine.kind} pools (make one with `orchestrator profile`)")
    prefill = app.prefill_pool.replicas if app.prefill_pool is not None else 0
    return SlaPlanner(app.planner, app.sla, perf, kv_tokens, max_num_seqs=inputs.max_num_seqs or 256,
                      disaggregated=app.prefill_pool is not None, initial=(prefill, app.decode_pool.replicas))


class _Coordinator:
    def __init__(self, app: AppConfig) -> None:
        self.app = app
        self.planner = make_planner(app)
        self.metrics: dict[str, dict[str, dict[Any, float]]] = {}  # pool -> metric -> replica -> value
        self.latest: dict[str, dict[Any, dict[str, float]]] = {}  # pool -> replica -> its latest report
        self.ready: dict[str, int] = {}
        self.last_step: float | None = None
        self.decision: ScalingDecision | None = None
        self.gauges = _Gauges()

    def update(self, pool: str, ctx: Any) -> None:
        self.metrics[pool] = ctx.aggregated_metrics or {}
        self.latest[pool] = _latest_reports(getattr(ctx, "raw_metrics", None), self.metrics[pool])
        self.ready[pool] = ctx.current_num_replicas

    def decide(self, pool: str, now: float, current_target: int) -> int:
        interval = self.app.planner.interval_s
        if self.last_step is None:
            self.last_step = now
        elif now - self.last_step >= interval and all(p in self.metrics for p in self._pools()):
            observation = self.observation(now - self.last_step)
            self.decision = self.planner.step(observation)
            self.last_step = now
            log.info("SLA planner (%s): %s from %s", self.app.planner.mode.value, self.decision, observation)
            self.gauges.record(observation, self.decision, self.ready)
        if self.decision is None or self.app.planner.mode is not PlannerMode.ACT:
            return current_target
        return self.decision.prefill if pool == "prefill_pool" else self.decision.decode

    def _pools(self) -> list[str]:
        return ["decode_pool"] + (["prefill_pool"] if self.app.prefill_pool is not None else [])

    def observation(self, interval_s: float) -> Observation:
        decode = self.metrics.get("decode_pool", {})
        prefill = self.metrics.get("prefill_pool", {})
        decode_reports = list(self.latest.get("decode_pool", {}).values())
        peak = pool_peak_prompt_tps(decode_reports)
        rate = _total(decode, "arrival_rate")
        prompt = _total(decode, "prompt_tokens")
        cached = _total(decode, "cached_tokens") + _total(prefill, "cached_tokens")
        # A client's first token waits for the prefill replica, then for the decode replica's first step.
        ttft = _worst(decode, "first_token_p99_s")
        if prefill and ttft is not None and _worst(prefill, "first_token_p99_s") is not None:
            ttft += _worst(prefill, "first_token_p99_s")
        return Observation(
            interval_s=interval_s,
            requests=round(rate * interval_s),
            mean_isl=_weighted(decode, "mean_isl", "arrival_rate"),
            mean_osl=_weighted(decode, "mean_osl", "arrival_rate"),
            prefix_hit_rate=min(cached / prompt, 1.0) if prompt else 0.0,
            ttft_p99_s=ttft,
            itl_p50_s=_mean(decode, "itl_p50_s"),
            prefill_replicas=self.ready.get("prefill_pool", 0),
            decode_replicas=self.ready.get("decode_pool", 0),
            prefill_waiting=round(_total(prefill, "waiting")),
            decode_waiting=round(_total(decode, "waiting")),
            prefill_queued_tokens=sum(r.get("queued_prompt_tokens", 0.0)
                                      for r in self.latest.get("prefill_pool", {}).values()),
            peak_prompt_tps=peak,
            peak_window_s=_peak_window(decode_reports) if peak is not None else None,
        )


def _latest_reports(raw: dict[str, dict[Any, list]] | None,
                    aggregated: dict[str, dict[Any, float]]) -> dict[Any, dict[str, float]]:
    """Each replica's latest report: per metric its newest value (a replica
    reports all its metrics at once, with one timestamp, so these are one
    report's). Without raw time series (not given by this Serve), the
    aggregated values stand in: bucket counts then may mix two reports
    across a bucket boundary (a peak off by a bucket)."""
    reports: dict[Any, dict[str, float]] = {}
    if raw:
        for name, series_by_replica in raw.items():
            for replica, series in series_by_replica.items():
                if series:
                    reports.setdefault(replica, {})[name] = max(series, key=lambda p: p.timestamp).value
        return reports
    for name, by_replica in aggregated.items():
        for replica, value in by_replica.items():
            reports.setdefault(replica, {})[name] = value
    return reports


def _peak_window(reports: list[dict[str, float]]) -> float | None:
    widths = [r["peak_window_s"] for r in reports if r.get("peak_window_s")]
    return max(widths) if widths else None


def _values(metrics: dict[str, dict[Any, float]], name: str) -> list[float]:
    return [v for v in (metrics.get(name) or {}).values() if v is not None and not math.isnan(v)]


def _total(metrics, name) -> float:
    return float(sum(_values(metrics, name)))


def _present(metrics, name) -> list[float]:
    return [v for v in _values(metrics, name) if v > MISSING]


def _worst(metrics, name) -> float | None:
    values = _present(metrics, name)
    return max(values) if values else None


def _mean(metrics, name) -> float | None:
    values = _present(metrics, name)
    return sum(values) / len(values) if values else None


def _weighted(metrics, name, weight) -> float:
    values, weights = metrics.get(name) or {}, metrics.get(weight) or {}
    total = sum(weights.get(r, 0.0) for r in values)
    if not total:
        return 0.0
    return sum(v * weights.get(r, 0.0) for r, v in values.items()) / total


# The planner's gauges, exported by Ray's metrics agent as ray_<prefix><name> (dashboards/orchestrator.json).
PLANNER_GAUGE_PREFIX = "orchestrator_planner_"
PLANNER_GAUGES = {
    "observed_rate": "Requests/s the pools saw last interval.",
    "predicted_rate": "Requests/s the planner expects next interval.",
    "proposed_replicas": "Replicas the planner computed, before constraints.",
    "desired_replicas": "Replicas the planner asks for.",
    "ready_replicas": "Replicas serving.",
    "correction": "Planner correction factor (observed vs target latency).",
    "queued_prompt_tokens": "Prompt tokens the pool's replicas held with no first token yet.",
    "peak_ratio": "Peak over mean prompt tokens/s the prefill pool was sized for.",
}


class _Gauges:
    """The planner's view as Ray metrics (exported with Ray's own metrics)."""

    def __init__(self) -> None:
        self._gauges = None

    def record(self, obs: Observation, decision: ScalingDecision, ready: dict[str, int]) -> None:
        try:
            from ray.util.metrics import Gauge
        except ImportError:  # outside Ray
            return
        if self._gauges is None:
            self._gauges = {k: Gauge(f"{PLANNER_GAUGE_PREFIX}{k}", v, tag_keys=("pool",)) for k, v in PLANNER_GAUGES.items()}
        g = self._gauges
        g["observed_rate"].set(obs.request_rate, tags={"pool": "all"})
        g["predicted_rate"].set(decision.predicted_rate, tags={"pool": "all"})
        g["queued_prompt_tokens"].set(obs.prefill_queued_tokens, tags={"pool": "prefill"})
        g["peak_ratio"].set(decision.peak_ratio, tags={"pool": "prefill"})
        for pool, proposed, desired, correction in (
                ("prefill", decision.proposed_prefill, decision.prefill, decision.prefill_correction),
                ("decode", decision.proposed_decode, decision.decode, decision.decode_correction)):
            g["proposed_replicas"].set(proposed if math.isfinite(proposed) else -1, tags={"pool": pool})
            g["desired_replicas"].set(desired, tags={"pool": pool})
            g["correction"].set(correction, tags={"pool": pool})
            g["ready_replicas"].set(ready.get(f"{pool}_pool", 0), tags={"pool": pool})


class SlaPlannerPolicy:
    """Serve custom autoscaling policy (class form: one instance per pool deployment)."""

    def __init__(self, app: dict[str, Any], pool: str) -> None:
        self.app = AppConfig.model_validate(app)
        self.pool = pool

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        from deployments import registries  # by reference: see registries

        coordinator = registries.coordinator_for(ctx.app_name or "", lambda: _Coordinator(self.app),
                                                      current=lambda c: c.app == self.app)  # redeployed: new
        coordinator.update(self.pool, ctx)
        now = ctx.current_time if ctx.current_time is not None else time.time()
        target = coordinator.decide(self.pool, now, ctx.target_num_replicas)
        decision = coordinator.decision
        state = {} if decision is None else {"planner": {"prefill": decision.prefill, "decode": decision.decode,
                                                          "predicted_rate": decision.predicted_rate}}
        return target, state
