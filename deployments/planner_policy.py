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

The observation comes from each serving replica's latest report
(`ReplicaReport`, carried as custom metrics; the newest point of
`ctx.raw_metrics`, Serve's aggregated value where a metric has no raw
series) through `orchestrator.planner.observation.observe_pools`, the same
builder the cluster simulator uses. Each report already covers the last
interval (the replica's load window), and its prompt-token buckets line up
across replicas on the shared clock for the pool's peak.

With `planner.fast_interval_s` set, between intervals it lets the planner's
fast loop look at the same latest reports every that many seconds (their
newest prompt-token buckets, queue, running and waiting counts): a pool it
raises is resized at once.
The replicas push their reports every second (the pools' autoscaling
`metrics_interval_s`, deployments/app.py).

A decision that a cap leaves short of the SLO, a metrics gap, replicas that
do not come up and a count changed outside the planner are logged as
warnings each interval they last, and exported as gauges. A replica whose
newest report is older than `report_max_age_s` (two intervals, at least three
of Serve's metric pushes) counts as not reporting.

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
from orchestrator.planner.factory import make_planner
from orchestrator.planner.faults import Faults
from orchestrator.planner.observation import observe_pools
from orchestrator.planner.observer import ReplicaReport
from orchestrator.planner.planner import Observation, ScalingDecision

log = logging.getLogger("ray.serve")

POOL_KEYS = {"prefill_pool": "prefill", "decode_pool": "decode"}


class _Coordinator:
    def __init__(self, app: AppConfig) -> None:
        self.app = app
        self.planner = make_planner(app)
        self.metrics: dict[str, dict[str, dict[Any, float]]] = {}  # pool -> metric -> replica -> value
        self.latest: dict[str, dict[Any, dict[str, float]]] = {}  # pool -> replica -> its latest report
        self.ready: dict[str, int] = {}
        self.in_force: dict[str, int] = {}  # per pool, Serve's target: replicas starting or serving
        self.last_step: float | None = None
        self.last_react: float | None = None  # the fast loop's last look
        self.decision: ScalingDecision | None = None
        self.gauges = _Gauges()

    def update(self, pool: str, ctx: Any) -> None:
        self.metrics[pool] = ctx.aggregated_metrics or {}
        now = ctx.current_time if ctx.current_time is not None else time.time()
        self.latest[pool] = _latest_reports(
            getattr(ctx, "raw_metrics", None), self.metrics[pool], now, report_max_age_s(self.app.planner.interval_s)
        )
        self.ready[pool] = ctx.current_num_replicas
        self.in_force[pool] = ctx.target_num_replicas

    def decide(self, pool: str, now: float, current_target: int) -> int:
        interval = self.app.planner.interval_s
        if self.last_step is None:
            self.last_step = now
        elif now - self.last_step >= interval and all(p in self.metrics for p in self._pools()):
            observation = self.observation(now - self.last_step)
            self.decision = self.planner.step(observation)
            self.last_step = now
            log.info("SLA planner (%s): %s from %s", self.app.planner.mode.value, self.decision, observation)
            if self.decision.capped or self.decision.faults != Faults():
                log.warning("SLA planner: %s", self.decision.reason)
            self.gauges.record(observation, self.decision, self.ready)
        elif self._fast_due(now):
            self.last_react = now
            raised = self.planner.react(self.observation(now - self.last_step))
            if raised is not None:
                self.decision = raised
                log.info("SLA planner (%s): %s", self.app.planner.mode.value, raised.reason)
        if self.decision is None or self.app.planner.mode is not PlannerMode.ACT:
            return current_target
        return self.decision.prefill if pool == "prefill_pool" else self.decision.decode

    def _fast_due(self, now: float) -> bool:
        """Whether the fast loop looks now: on, every pool reported, a step made, `fast_interval_s` since it
        last looked (or since the step)."""
        fast = self.app.planner.fast_interval_s
        if fast is None or self.last_step is None or not all(p in self.metrics for p in self._pools()):
            return False
        return now - max(self.last_step, self.last_react or self.last_step) >= fast

    def _pools(self) -> list[str]:
        return ["decode_pool"] + (["prefill_pool"] if self.app.prefill_pool is not None else [])

    def observation(self, interval_s: float) -> Observation:
        """From each serving replica's latest report (orchestrator/planner/observation.py)."""

        def reports(pool: str) -> list[ReplicaReport]:
            return [ReplicaReport.from_metrics(m) for m in self.latest.get(pool, {}).values()]

        prefill = reports("prefill_pool") if self.app.prefill_pool is not None else None
        return observe_pools(
            interval_s,
            prefill,
            reports("decode_pool"),
            self.ready.get("prefill_pool", 0),
            self.ready.get("decode_pool", 0),
            self.in_force.get("prefill_pool") if self.app.prefill_pool is not None else None,
            self.in_force.get("decode_pool"),
        )


def report_max_age_s(interval_s: float) -> float:
    """The oldest a replica's newest report may be and still count: two planner intervals, and at least three
    of the pushes that carry replicas' metrics to Serve's controller."""
    from ray.serve._private.constants import RAY_SERVE_REPLICA_AUTOSCALING_METRIC_PUSH_INTERVAL_S as push_s

    return max(2 * interval_s, 3 * push_s)


def _latest_reports(
    raw: dict[str, dict[Any, list]] | None,
    aggregated: dict[str, dict[Any, float]],
    now: float | None = None,
    max_age_s: float | None = None,
) -> dict[Any, dict[str, float]]:
    """Each replica's latest report: per metric its newest value (a replica
    reports all its metrics at once, with one timestamp, so these are one
    report's), none older than `max_age_s` before `now` (a replica whose
    metrics stopped counts as not reporting). A metric without raw time
    series (not given by every Serve) takes Serve's aggregated value instead,
    of no known age: bucket counts then may mix two reports across a bucket
    boundary (a peak off by a bucket)."""
    reports: dict[Any, dict[str, float]] = {}
    for name, by_replica in aggregated.items():
        if raw and raw.get(name):
            continue
        for replica, value in by_replica.items():
            reports.setdefault(replica, {})[name] = value
    for name, series_by_replica in (raw or {}).items():
        for replica, series in series_by_replica.items():
            newest = max(series, key=lambda p: p.timestamp) if series else None
            if newest is not None and (now is None or max_age_s is None or now - newest.timestamp <= max_age_s):
                reports.setdefault(replica, {})[name] = newest.value
    return reports


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
    "burstiness": "ca^2 of the arrivals the prefill pool's queue was sized for (1: Poisson, M/D/1).",
    "capped_load_ratio": "Load over what the granted replicas hold within the SLO where a cap binds (0: none; "
    "-1: no count holds it).",
    "pending_replicas": "Replicas asked for that have not come up within planner.pending_timeout_s.",
    "metrics_gap": "1 while the planner holds the pools because a pool sent no report.",
    "predicted_osl": "Output tokens a request makes, as the decode pool was sized: the arrivals' max_tokens x the "
    "share of it the finished requests made (their mean where the asks are not known).",
    "running_floor": "Decode replicas the streams running now fill (a floor of the decode pool's size).",
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
            self._gauges = {
                k: Gauge(f"{PLANNER_GAUGE_PREFIX}{k}", v, tag_keys=("pool",)) for k, v in PLANNER_GAUGES.items()
            }
        g = self._gauges
        g["observed_rate"].set(obs.request_rate, tags={"pool": "all"})
        g["predicted_rate"].set(decision.predicted_rate, tags={"pool": "all"})
        g["queued_prompt_tokens"].set(obs.prefill_queued_tokens, tags={"pool": "prefill"})
        g["peak_ratio"].set(decision.peak_ratio, tags={"pool": "prefill"})
        g["burstiness"].set(decision.burstiness, tags={"pool": "prefill"})
        g["metrics_gap"].set(1.0 if decision.faults.gap else 0.0, tags={"pool": "all"})
        g["predicted_osl"].set(decision.predicted_osl, tags={"pool": "decode"})
        g["running_floor"].set(
            decision.running_decode if math.isfinite(decision.running_decode) else -1.0, tags={"pool": "decode"}
        )
        capped = {c.pool: c.load_over_capacity for c in decision.capped}
        pending = {p.pool: p.missing for p in decision.faults.pending}
        for pool, proposed, desired, correction in (
            ("prefill", decision.proposed_prefill, decision.prefill, decision.prefill_correction),
            ("decode", decision.proposed_decode, decision.decode, decision.decode_correction),
        ):
            g["proposed_replicas"].set(proposed if math.isfinite(proposed) else -1, tags={"pool": pool})
            g["desired_replicas"].set(desired, tags={"pool": pool})
            g["correction"].set(correction, tags={"pool": pool})
            g["ready_replicas"].set(ready.get(f"{pool}_pool", 0), tags={"pool": pool})
            ratio = capped.get(pool, 0.0)
            g["capped_load_ratio"].set(ratio if math.isfinite(ratio) else -1.0, tags={"pool": pool})
            g["pending_replicas"].set(pending.get(pool, 0), tags={"pool": pool})


class SlaPlannerPolicy:
    """Serve custom autoscaling policy (class form: one instance per pool deployment)."""

    def __init__(self, app: dict[str, Any], pool: str) -> None:
        self.app = AppConfig.model_validate(app)
        self.pool = pool

    def __call__(self, ctx: Any) -> tuple[int, dict[str, Any]]:
        from deployments import registries  # by reference: see registries

        coordinator = registries.coordinator_for(
            ctx.app_name or "", lambda: _Coordinator(self.app), current=lambda c: c.app == self.app
        )  # redeployed: new
        coordinator.update(self.pool, ctx)
        now = ctx.current_time if ctx.current_time is not None else time.time()
        target = coordinator.decide(self.pool, now, ctx.target_num_replicas)
        decision = coordinator.decision
        state = (
            {}
            if decision is None
            else {
                "planner": {
                    "prefill": decision.prefill,
                    "decode": decision.decode,
                    "predicted_rate": decision.predicted_rate,
                }
            }
        )
        return target, state
