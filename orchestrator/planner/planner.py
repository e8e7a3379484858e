"""The SLA planner: one decision per interval, for both pools together.

    observe    an Observation of the interval that ended (from the frontend)
    predict    next interval's request rate, ISL, OSL, prefix hit rate; never
               a rate below the one just observed (too few replicas break
               the SLO at once, too many only cost until the next interval)
    propose    prefill = predicted uncached prompt tokens/s / per-replica prefill capacity
               decode  = predicted output tokens/s / (per-replica decode capacity x
                         decode_utilization: a full batch makes new requests queue)
               (capacities from the profile at the predicted lengths; each
               scaled by a correction learnt from observed vs target latency)
               aggregated (no prefill pool): one pool doing both
    constrain  min/max per pool; a GPU budget shared by the pools (the
               `budget_priority` pool is served first); up at once, down only
               after `scale_down_intervals` intervals in a row asking for less
    act        the caller's: a ScalingDecision is plain data

The planner keeps no clock and no I/O: the same object runs under Ray Serve's
autoscaling policy, in the cluster simulator and in unit tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from orchestrator.config import PlannerConfig, PoolBounds, SlaConfig
from orchestrator.planner.capacity import decode_capacity, prefill_capacity
from orchestrator.planner.predictors import Predictor, make_predictor
from orchestrator.sim.perf_model import PerfModel


@dataclass(frozen=True)
class Observation:
    """One interval as the frontend saw it. Latencies are None when no
    request finished that phase in the interval."""

    interval_s: float
    requests: int  # arrived in the interval
    mean_isl: float = 0.0
    mean_osl: float = 0.0
    prefix_hit_rate: float = 0.0  # cached / prompt tokens
    ttft_p99_s: float | None = None
    itl_p50_s: float | None = None
    prefill_replicas: int = 0  # ready (serving) at the end of the interval
    decode_replicas: int = 0
    prefill_waiting: int = 0  # requests queued in the pool's engines at the end of the interval
    decode_waiting: int = 0

    @property
    def request_rate(self) -> float:
        return self.requests / self.interval_s if self.interval_s > 0 else 0.0


@dataclass(frozen=True)
class ScalingDecision:
    prefill: int  # desired replicas (0 when aggregated)
    decode: int
    proposed_prefill: float  # before rounding and constraints
    proposed_decode: float
    predicted_rate: float
    predicted_isl: float
    predicted_osl: float
    prefill_correction: float
    decode_correction: float
    reason: str = ""


@dataclass
class _Hysteresis:
    current: int
    below: int = 0  # intervals in a row that asked for fewer

    def apply(self, wanted: int, intervals: int) -> int:
        if wanted >= self.current:
            self.current, self.below = wanted, 0
            return wanted
        self.below += 1
        if self.below >= intervals:
            self.current, self.below = wanted, 0
        return self.current


@dataclass
class SlaPlanner:
    config: PlannerConfig
    sla: SlaConfig
    perf: PerfModel
    kv_capacity_tokens: int | None
    max_num_seqs: int = 256
    disaggregated: bool = True
    gpus_per_replica: int = 1
    initial: tuple[int, int] = (1, 1)  # (prefill, decode) replicas at start
    _predictors: dict[str, Predictor] = field(default_factory=dict, init=False)
    _corrections: dict[str, float] = field(default_factory=lambda: {"prefill": 1.0, "decode": 1.0}, init=False)
    _hysteresis: dict[str, _Hysteresis] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        if self.sla.ttft_p99_ms is None or self.sla.itl_p50_ms is None:
            raise ValueError("the SLA planner needs sla.ttft_p99_ms and sla.itl_p50_ms")
        kind = self.config.predictor
        kwargs = {"period": 24} if kind == "seasonal" else {}
        self._predictors = {k: make_predictor(kind, **kwargs) for k in ("rate", "isl", "osl", "hit")}
        prefill0, decode0 = self.initial
        self._hysteresis = {"prefill": _Hysteresis(prefill0), "decode": _Hysteresis(decode0)}

    # -- the interval --------------------------------------------------------------

    def step(self, obs: Observation, forecast: Observation | None = None) -> ScalingDecision:
        """`forecast`: the next interval's load as it will be (an oracle, for
        experiments); None: predicted from the history."""
        self._observe(obs)
        rate, isl, osl, hit = self._predict(obs)
        if forecast is not None:
            rate, isl, osl = forecast.request_rate, forecast.mean_isl or isl, forecast.mean_osl or osl
        prefill_need, decode_need = self._propose(rate, isl, osl, hit)
        prefill, decode, reason = self._constrain(prefill_need, decode_need)
        return ScalingDecision(prefill, decode, prefill_need, decode_need, rate, isl, osl,
                               self._corrections["prefill"], self._corrections["decode"], reason)

    def _observe(self, obs: Observation) -> None:
        p = self._predictors
        p["rate"].observe(obs.request_rate)
        if obs.requests:
            p["isl"].observe(obs.mean_isl)
            p["osl"].observe(obs.mean_osl)
            p["hit"].observe(obs.prefix_hit_rate)
        ttft_target, itl_target = self.sla.ttft_p99_ms / 1000, self.sla.itl_p50_ms / 1000
        # A TTFT miss is the prefill pool's, unless decode engines are the ones
        # with a queue (out of sequence slots or KV: requests wait to start).
        ttft_pool = "prefill" if self.disaggregated and obs.prefill_waiting >= obs.decode_waiting else "decode"
        self._corrections[ttft_pool] = _corrected(self._corrections[ttft_pool], obs.ttft_p99_s, ttft_target)
        self._corrections["decode"] = _corrected(self._corrections["decode"], obs.itl_p50_s, itl_target)

    def _predict(self, obs: Observation) -> tuple[float, float, float, float]:
        p = self._predictors
        rate = max(p["rate"].predict() or 0.0, obs.request_rate)
        isl = p["isl"].predict() or obs.mean_isl
        osl = p["osl"].predict() or obs.mean_osl
        hit = min(max(p["hit"].predict() or 0.0, 0.0), 1.0)
        return rate, isl, osl, hit

    def _propose(self, rate: float, isl: float, osl: float, hit: float) -> tuple[float, float]:
        """Replicas each pool needs (fractional) for the predicted load."""
        if rate <= 0:
            return 0.0, 0.0
        uncached = max(isl * (1.0 - hit), 1.0)
        prefill_cap = prefill_capacity(self.perf, uncached, self.sla.ttft_p99_ms / 1000, self.config.queueing_factor)
        decode_cap = decode_capacity(self.perf, isl + osl / 2, self.sla.itl_p50_ms / 1000, self.kv_capacity_tokens,
                                     self.max_num_seqs)
        prefill = _need(rate * uncached, prefill_cap) * self._corrections["prefill"]
        decode = _need(rate * osl, decode_cap * self.config.decode_utilization) * self._corrections["decode"]
        if not self.disaggregated:  # one pool prefills and decodes
            return 0.0, prefill + decode
        return prefill, decode

    def _constrain(self, prefill_need: float, decode_need: float) -> tuple[int, int, str]:
        cfg = self.config
        prefill = _bounded(prefill_need, cfg.prefill) if self.disaggregated else 0
        decode = _bounded(decode_need, cfg.decode)
        prefill = self._hysteresis["prefill"].apply(prefill, cfg.scale_down_intervals) if self.disaggregated else 0
        decode = self._hysteresis["decode"].apply(decode, cfg.scale_down_intervals)
        reason = ""
        if cfg.max_gpus is not None:
            budget = cfg.max_gpus // self.gpus_per_replica
            if prefill + decode > budget:
                first, second = ("decode", "prefill") if cfg.budget_priority == "decode" else ("prefill", "decode")
                counts = {"prefill": prefill, "decode": decode}
                floor = {"prefill": cfg.prefill.min_replicas if self.disaggregated else 0,
                         "decode": cfg.decode.min_replicas}
                counts[first] = min(counts[first], budget - floor[second])
                counts[second] = min(counts[second], budget - counts[first])
                prefill, decode = counts["prefill"], counts["decode"]
                reason = f"GPU budget {cfg.max_gpus} binds; {first} served first"
                self._hysteresis["prefill"].current, self._hysteresis["decode"].current = prefill, decode
        return prefill, decode, reason


def _need(load: float, capacity: float) -> float:
    return load / capacity if capacity > 0 else math.inf


def _bounded(need: float, bounds: PoolBounds) -> int:
    wanted = bounds.max_replicas if math.isinf(need) else math.ceil(need - 1e-9)
    return min(max(wanted, bounds.min_replicas), bounds.max_replicas)


def _corrected(correction: float, observed: float | None, target: float) -> float:
    """Learn how far the model is from reality: a pool missing its target
    gets more capacity next time (by up to sqrt 2 an interval), one well
    under it drifts back towards the profile. Bounded to [0.5, 4]."""
    if observed is None:
        return correction
    ratio = observed / target
    if ratio > 1.0:
        correction *= min(ratio, 2.0) ** 0.5
    elif ratio < 0.5:
        correction *= 0.95
    return min(max(correction, 0.5), 4.0)
