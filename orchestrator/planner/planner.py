"""The SLA planner: one decision per interval, for both pools together.

    observe    an Observation of the interval that ended (from the frontend)
    predict    the request rate, ISL, OSL and prefix hit rate of the next
               interval and of the interval that starts once a replica asked
               for now is serving (`replica_startup_s`),
               the larger of the two; never a rate below the one just
               observed (too few replicas break the SLO at once, too many
               only cost until the next interval); the Kalman trend is
               damped over the horizon (`trend_damping`: a slope filtered
               from noisy intervals, carried straight over the start-up
               time, overshoots at every turn of the load)
    propose    prefill = the largest of
                 predicted uncached prompt tokens/s / per-replica prefill capacity
                   (a G/G/1 queue, Kingman, for the arrivals' burstiness
                   ca^2: the prompt work's measured index of dispersion less
                   the prompt lengths' cs^2, the mean over the last
                   `peak_memory_intervals`, at least 1, the M/D/1 case;
                   utilisation capped so that the prompt's service time plus
                   queueing_factor x the mean wait stays under the p99
                   target: a prompt's own service time is no queue's
                   (`prefill_queueing: wait`, the default); `kingman`: the
                   mean TTFT under the p99 target / queueing_factor)
                 predicted peak prompt tokens/s (the rate x the recent
                   peak-to-mean ratio over `peak_window_s`) / what a replica
                   computes flat out, stretched by the backlog a peak may
                   leave: a replica at rate c over a window w clears c x (1 + T/w)
                   within the TTFT target T
               plus the prompt tokens already queued, drained within one interval
               decode  = the larger of
                 predicted output tokens/s / (per-replica decode capacity x
                   decode_utilization: a full batch makes new requests queue),
                   the OSL observed being the arrivals' asked-for `max_tokens`
                   x the share of their ask the finished requests made (sized
                   from the traffic arriving: a turn to longer outputs shows
                   in the first interval of it, not once they finish), the
                   finished requests' mean where the asks are not known
                 the streams running now / the batch one replica holds within
                   the ITL target (the decode load in flight, whatever the
                   model predicted)
               (capacities from the profile at the predicted lengths, the
               decode step scaled by what the replicas measure unless
               `decode_step_calibration` is off; each
               scaled by a correction (>= 1) learnt from observed vs target
               latency, raised only when the model can be blamed for a miss:
               the pool had the replicas the model sizes for the load observed
               serving throughout the interval (a miss while short of them is
               lag), it did not inherit a queue that alone breaks the target
               (those first tokens waited before the interval began), and the
               miss persisted `correction_after_intervals` intervals in a row
               (a p99 over one interval is noisy, and a burst is not a wrong
               model); it drifts back to 1 while latency is well under target)
               aggregated (no prefill pool): one pool doing both
    by class   with the traffic's priority levels (levels.py: one per engine
               priority of the SLO classes) the pools are sized so that each
               SLO level meets its own targets: the prefill pool the most any
               SLO level needs for the prompts of the levels that run before
               it or with it within its TTFT target, plus what the lower
               levels' prompts keep busy (the engines take waiting prompts by
               priority, but a prompt being computed keeps its place:
               capacity.py), or the burst headroom of the levels up to each if
               more; the decode pool what the SLO levels' output needs within
               the strictest ITL target among them (their streams share every
               batch). Best-effort levels add
               what the whole load needs beyond that (prompts at the loosest
               SLO level's TTFT target), at most `best_effort_share` of the
               budget per pool; otherwise they fill what the SLO levels leave.
               Each level's share of the requests and its lengths against the
               whole's come from the last interval that saw any; the rate,
               lengths and hit rate are predicted for the whole load as
               without classes. The corrections learn from the SLO level
               furthest over its own targets, never from a best-effort one
    constrain  min/max per pool; a GPU budget shared by the pools (the
               `budget_priority` pool is served first); up at once, down to
               the most any of the last `scale_down_intervals` intervals
               asked for (a stabilisation window: one quiet interval does not
               take away what the busier ones around it needed)
    react      between steps, every `fast_interval_s` (the fast loop): the
               larger of the last step's sizing and the same model's sizing
               of the prompt tokens/s that arrived over the newest few peak
               buckets (at the step's ISL, OSL, hit rate and burstiness),
               with the backlog and the running streams re-read from what the
               engines hold now (the prompt tokens queued for prefill; the
               decode streams running and waiting), raises a pool short of it
               at once, within the bounds and the GPU budget; it never lowers
               a pool. The raise is an ask in the pool's stabilisation window,
               so the steps that follow keep it until `scale_down_intervals`
               asks in a row are lower: the two loops never undo each other
    act        the caller's: a ScalingDecision is plain data, which names
               the pools a cap leaves short of the SLO (caps.py) and what
               was not as asked (faults.py: a metrics gap holds both pools,
               replicas that do not come up are reported, a count changed
               outside the planner is where it resizes from)

The planner keeps no clock and no I/O: the same object runs under Ray Serve's
autoscaling policy, in the cluster simulator and in unit tests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from orchestrator.config import PlannerConfig, PoolBounds, SlaConfig
from orchestrator.planner.capacity import (
    PromptLevel,
    decode_batch_limit,
    decode_capacity,
    prefill_capacity,
    prefill_service_s,
    priority_prefill_need,
)
from orchestrator.planner.caps import CapShortfall, shortfalls
from orchestrator.planner.faults import Faults, FaultWatch, PoolView, metrics_gap
from orchestrator.planner.levels import (
    LevelObservation,
    LevelShare,
    PriorityLevel,
    blend,
    levels_over_target,
    mix_of,
)
from orchestrator.planner.predictors import Predictor, make_predictor
from orchestrator.sim.perf_model import Batch, PerfModel


@dataclass(frozen=True)
class Observation:
    """One interval as the frontend saw it. Latencies are None when no
    request finished that phase in the interval."""

    interval_s: float
    requests: int  # arrived in the interval
    mean_isl: float = 0.0
    mean_osl: float | None = 0.0  # of the requests that finished; None: none did (no sample)
    mean_max_tokens: float | None = None  # output tokens the arrivals asked for (None: not known)
    output_share: float | None = None  # output tokens made / asked for, of the finished (None: not known)
    decode_running: int = 0  # requests streaming output in the decode pool at the end of the interval
    prefix_hit_rate: float = 0.0  # cached / prompt tokens
    ttft_p99_s: float | None = None
    itl_p50_s: float | None = None
    prefill_replicas: int = 0  # ready (serving) at the end of the interval
    decode_replicas: int = 0
    prefill_waiting: int = 0  # requests queued in the pool's engines at the end of the interval
    decode_waiting: int = 0
    prefill_queued_tokens: float = 0.0  # prompt tokens still to compute in the prefill engines at the end
    peak_prompt_tps: float | None = None  # most prompt tokens/s that arrived over any `peak_window_s` stretch
    peak_window_s: float | None = None
    # var / mean of the prompt tokens per `peak_window_s` stretch, in mean ISLs (observer.prompt_dispersion)
    prompt_dispersion: float | None = None
    prompt_length_scv: float | None = None  # cs^2 of the arrived prompt lengths (observer.prompt_length_scv)
    recent_prompt_tps: float | None = None  # prompt tokens/s over the newest few peak buckets (None: not measured)
    prefill_reports: int | None = None  # serving replicas whose report made this observation (None: not counted)
    decode_reports: int | None = None
    prefill_in_force: int | None = None  # replicas asked for, starting or serving (None: not known)
    decode_in_force: int | None = None
    levels: tuple[LevelObservation, ...] = ()  # per engine priority (none: not recorded by priority)

    @property
    def arrival_scv(self) -> float | None:
        """ca^2 of the arrivals: the prompt work's dispersion (ca^2 + cs^2) less
        the prompt lengths' own cs^2 (None: not measured)."""
        if self.prompt_dispersion is None:
            return None
        return self.prompt_dispersion - (self.prompt_length_scv or 0.0)

    @property
    def peak_ratio(self) -> float | None:
        """Peak over mean prompt tokens/s in the interval (None: not measured)."""
        mean = self.requests * self.mean_isl / self.interval_s if self.interval_s > 0 else 0.0
        if self.peak_prompt_tps is None or mean <= 0:
            return None
        return max(self.peak_prompt_tps / mean, 1.0)

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
    peak_ratio: float = 1.0  # the prompt tokens/s peak-to-mean ratio the prefill pool was sized for
    burstiness: float = 1.0  # the arrivals' ca^2 the prefill pool's queue was sized for (1: Poisson, M/D/1)
    capped: tuple[CapShortfall, ...] = ()  # pools a cap leaves short of the SLO
    faults: Faults = Faults()  # what was not as asked; a metrics gap: the counts were held
    running_decode: float = 0.0  # decode replicas the streams running now fill (a floor of proposed_decode)


@dataclass
class _Hysteresis:
    """Up at once; down to the most any of the last `intervals` intervals
    asked for (Kubernetes' HPA stabilisation window): a pool shrinks only
    once every ask in the window is below its size, and then no further
    than the busiest of them, so one quiet interval does not take away the
    replicas the intervals around it needed."""

    current: int
    asks: list[int] = field(default_factory=list)  # the last asks, newest last

    def restart(self, count: int) -> None:
        """From `count` (set outside the planner), with a fresh window: it shrinks only after `intervals`
        asks below it."""
        self.current, self.asks = count, []

    def raise_to(self, wanted: int) -> bool:
        """Up to `wanted` at once, as an ask of the window (the fast loop's); whether it rose."""
        if wanted <= self.current:
            return False
        self.current = wanted
        self.asks.append(wanted)
        return True

    def apply(self, wanted: int, intervals: int) -> int:
        self.asks = (self.asks + [wanted])[-intervals:]
        if wanted >= self.current:
            self.current = wanted
        elif len(self.asks) >= intervals:
            self.current = min(self.current, max(self.asks))
        return self.current


@dataclass(frozen=True)
class _Sizing:
    """A step's sizing of the interval's load, before the queue and the running streams: what the fast loop
    re-reads those against until the next step."""

    prefill: float  # replicas (fractional) for the predicted prompt load
    decode: float  # ... for the predicted output load
    isl: float
    osl: float
    hit: float
    burstiness: float
    interval_s: float
    decision: ScalingDecision


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
    acting: bool = True  # the caller applies the decisions (False: advisory, nothing it decides is in force)
    levels: tuple[PriorityLevel, ...] = ()  # the traffic's priority levels (none: one target, `sla`, for every request)
    _mix: tuple[LevelShare, ...] = field(default=(), init=False)  # each level's part of the last load seen
    _peaks: list[float] = field(default_factory=list, init=False)
    _dispersions: list[float] = field(default_factory=list, init=False)
    _peak_window_s: float | None = field(default=None, init=False)
    _backlog_s: float = field(default=0.0, init=False)  # the prefill queue at the last interval's end, in seconds
    _queued_tokens: float = field(default=0.0, init=False)  # ... and in prompt tokens
    _predictors: dict[str, Predictor] = field(default_factory=dict, init=False)
    _corrections: dict[str, float] = field(default_factory=lambda: {"prefill": 1.0, "decode": 1.0}, init=False)
    _hysteresis: dict[str, _Hysteresis] = field(default_factory=dict, init=False)
    _ready_before: dict[str, int] | None = field(default=None, init=False)  # ready at the last interval's end
    _sized_misses: dict[str, int] = field(default_factory=dict, init=False)  # per signal, in a row
    _watch: FaultWatch = field(init=False)
    _decided: dict[str, int] | None = field(default=None, init=False)  # the last decision's counts
    _output_share: float | None = field(default=None, init=False)  # output tokens made / asked (None: not seen)
    _step_scale: float = field(default=1.0, init=False)  # measured decode step / the profile's (calibration)
    _sizing: _Sizing | None = field(default=None, init=False)  # the last step's, for the fast loop

    def __post_init__(self) -> None:
        if not any(not level.best_effort for level in self.levels) and (
            self.sla.ttft_p99_ms is None or self.sla.itl_p50_ms is None
        ):
            raise ValueError("the SLA planner needs sla.ttft_p99_ms and sla.itl_p50_ms, or an SLO class with targets")
        kind = self.config.predictor
        kwargs = {"seasonal": {"period": 24}, "kalman": {"damping": self.config.trend_damping}}.get(kind, {})
        self._predictors = {k: make_predictor(kind, **kwargs) for k in ("rate", "isl", "osl", "hit")}
        prefill0, decode0 = self.initial
        self._hysteresis = {"prefill": _Hysteresis(prefill0), "decode": _Hysteresis(decode0)}
        self._watch = FaultWatch(self.config.pending_timeout_s)

    # -- the interval --------------------------------------------------------------

    def step(self, obs: Observation, forecast: Observation | Sequence[Observation] | None = None) -> ScalingDecision:
        """`forecast`: the coming load as it will be (an oracle, for
        experiments: the next interval and the one after start-up, taken
        the way predictions are, the larger of each); None: predicted from
        the history."""
        faults = self._watch.see(obs.interval_s, self._pools(obs), self._decided if self.acting else None)
        for change in faults.manual:
            self._hysteresis[change.pool].restart(change.in_force)
        if faults.gap:
            return self._hold(faults)
        self._observe(obs)
        rate, isl, osl, hit = self._predict(obs)
        peak, burst = self.peak_ratio, self.burstiness
        if forecast is not None:
            ahead = [forecast] if isinstance(forecast, Observation) else list(forecast)
            rate = max(f.request_rate for f in ahead)
            isl = max((f.mean_isl for f in ahead if f.requests), default=isl)
            osl = max((f.mean_osl for f in ahead if f.requests and f.mean_osl is not None), default=osl)
            peak = max((f.peak_ratio for f in ahead if f.peak_ratio is not None), default=peak)
            burst = self._burstiness([f.arrival_scv for f in ahead if f.arrival_scv is not None], burst)
        load_prefill, load_decode = self._propose(rate, isl, osl, hit, peak, burst)
        prefill_need = load_prefill + self._backlog(obs.prefill_queued_tokens, obs.interval_s, isl, hit)
        running = self._running_need(obs.decode_running, isl, osl)
        decode_need = max(load_decode, running)
        prefill, decode, reason, capped = self._constrain(prefill_need, decode_need)
        self._decided = self._counts(prefill, decode)
        decision = ScalingDecision(
            prefill,
            decode,
            prefill_need,
            decode_need,
            rate,
            isl,
            osl,
            self._corrections["prefill"],
            self._corrections["decode"],
            "; ".join(r for r in (reason, faults.describe()) if r),
            peak,
            burst,
            capped,
            faults,
            running,
        )
        self._sizing = _Sizing(load_prefill, load_decode, isl, osl, hit, burst, obs.interval_s, decision)
        return decision

    def react(self, now: Observation) -> ScalingDecision | None:
        """The fast loop, between steps (see the module's docstring): `now` is what the replicas report at this
        moment; its recent prompt rate and its queue, running and waiting counts are what it reads. None: nothing
        raised (no step yet, an advisory planner, a pool with no report, or no pool short)."""
        sizing = self._sizing
        if sizing is None or not self.acting or metrics_gap(self._pools(now)):
            return None
        fresh_prefill, fresh_decode = 0.0, 0.0
        if now.recent_prompt_tps is not None and sizing.isl > 0:
            fresh_prefill, fresh_decode = self._propose(
                now.recent_prompt_tps / sizing.isl, sizing.isl, sizing.osl, sizing.hit, 1.0, sizing.burstiness
            )
        prefill_need = max(sizing.prefill, fresh_prefill) + self._backlog(
            now.prefill_queued_tokens, sizing.interval_s, sizing.isl, sizing.hit
        )
        running = self._running_need(now.decode_running + now.decode_waiting, sizing.isl, sizing.osl)
        needs = {"prefill": prefill_need, "decode": max(sizing.decode, fresh_decode, running)}
        raised = []
        for pool in ("prefill", "decode") if self.disaggregated else ("decode",):
            wanted = min(_bounded(needs[pool], getattr(self.config, pool)), self._budget_room(pool))
            if self._hysteresis[pool].raise_to(wanted):
                raised.append(f"{pool} to {wanted}")
        if not raised:
            return None
        prefill = self._hysteresis["prefill"].current if self.disaggregated else 0
        decode = self._hysteresis["decode"].current
        self._decided = self._counts(prefill, decode)
        return replace(
            sizing.decision,
            prefill=prefill,
            decode=decode,
            proposed_prefill=needs["prefill"] if self.disaggregated else 0.0,
            proposed_decode=needs["decode"],
            reason=f"fast loop: {', '.join(raised)} for what the engines hold now",
            running_decode=running,
            capped=(),
            faults=Faults(),
        )

    @property
    def _budget_replicas(self) -> int | None:
        """Replicas the GPU budget holds across both pools (None: no budget)."""
        return None if self.config.max_gpus is None else self.config.max_gpus // self.gpus_per_replica

    def _budget_room(self, pool: str) -> float:
        """The most replicas `pool` may have beside the other pool's current count within the GPU budget."""
        budget = self._budget_replicas
        if budget is None:
            return math.inf
        other = "decode" if pool == "prefill" else "prefill"
        other_count = self._hysteresis[other].current if self.disaggregated or other == "decode" else 0
        return budget - other_count

    def _pools(self, obs: Observation) -> dict[str, PoolView]:
        pools = {"decode": PoolView(obs.decode_replicas, obs.decode_reports, obs.decode_in_force)}
        if self.disaggregated:
            pools["prefill"] = PoolView(obs.prefill_replicas, obs.prefill_reports, obs.prefill_in_force)
        return pools

    def _counts(self, prefill: int, decode: int) -> dict[str, int]:
        return {"prefill": prefill, "decode": decode} if self.disaggregated else {"decode": decode}

    def _hold(self, faults: Faults) -> ScalingDecision:
        """The counts the planner holds, unchanged, and nothing learnt: an interval without reports says
        nothing about the load (a rate of 0 from missing reports would take the pools to their minimum)."""
        prefill = self._hysteresis["prefill"].current if self.disaggregated else 0
        decode = self._hysteresis["decode"].current
        self._decided = self._counts(prefill, decode)
        p = self._predictors
        return ScalingDecision(
            prefill,
            decode,
            float(prefill),
            float(decode),
            p["rate"].predict() or 0.0,
            p["isl"].predict() or 0.0,
            p["osl"].predict() or 0.0,
            self._corrections["prefill"],
            self._corrections["decode"],
            faults.describe(),
            self.peak_ratio,
            self.burstiness,
            faults=faults,
        )

    @property
    def burstiness(self) -> float:
        """How much burstier than Poisson the prefill pool's arrivals are: the
        mean ca^2 of the last `peak_memory_intervals` intervals, at least 1
        (1: Poisson, or none measured). The prompt lengths' own spread is left
        to `queueing_factor`, calibrated on the training loads with it."""
        return self._burstiness(self._dispersions[-self.config.peak_memory_intervals :])

    def _burstiness(self, dispersions: Sequence[float], default: float = 1.0) -> float:
        if self.config.prefill_queueing == "md1":
            return 1.0
        return max(sum(dispersions) / len(dispersions), 1.0) if dispersions else default

    @property
    def peak_ratio(self) -> float:
        """The burst headroom: the largest peak-to-mean ratio of the last
        `peak_memory_intervals` intervals (1: none measured)."""
        return max(self._peaks[-self.config.peak_memory_intervals :], default=1.0)

    @property
    def _slo_levels(self) -> list[PriorityLevel]:
        return [level for level in self.levels if not level.best_effort]

    @property
    def _ttft_s(self) -> float:
        """The strictest TTFT target (p99) any request is held to."""
        slo = self._slo_levels
        return min(level.ttft_p99_s for level in slo) if slo else self.sla.ttft_p99_ms / 1000

    @property
    def _itl_s(self) -> float:
        """The strictest ITL target (p50): every decode batch is held to it."""
        slo = self._slo_levels
        return min(level.itl_p50_s for level in slo) if slo else self.sla.itl_p50_ms / 1000

    def _observe(self, obs: Observation) -> None:
        p = self._predictors
        if self.levels:
            self._mix = mix_of(self.levels, obs.levels) or self._mix
        p["rate"].observe(obs.request_rate)
        if obs.output_share is not None:  # the newer interval weighs half: the share moves with the traffic's mix
            seen = self._output_share
            self._output_share = obs.output_share if seen is None else (seen + obs.output_share) / 2
        if obs.requests:
            p["isl"].observe(obs.mean_isl)
            p["hit"].observe(obs.prefix_hit_rate)
        if self.config.decode_step_calibration:
            self._calibrate_step(obs)
        osl = self._arriving_osl(obs)
        if osl is None and obs.mean_osl is not None:
            osl = obs.mean_osl
        if obs.requests and osl is not None:
            p["osl"].observe(osl)
        # What the model says the load just seen needed, uncorrected: a pool
        # short of it missed its target because it was late, which is no
        # reason to distrust the model (the backlog term catches up instead).
        peak = obs.peak_ratio
        if obs.peak_window_s:
            self._peak_window_s = obs.peak_window_s
        if obs.requests and obs.arrival_scv is not None:
            self._dispersions = (self._dispersions + [obs.arrival_scv])[-self.config.peak_memory_intervals :]
        prefill_need, decode_need = self._propose(
            obs.request_rate,
            obs.mean_isl,
            self._osl_seen(obs),
            obs.prefix_hit_rate,
            max(peak or 1.0, 1.0),
            self.burstiness,
            corrected=False,
        )
        if obs.requests and peak is not None:
            self._peaks = (self._peaks + [peak])[-self.config.peak_memory_intervals :]
        ready = {"prefill": obs.prefill_replicas, "decode": obs.decode_replicas}
        # Replicas serving throughout the interval: the fewer of its start and
        # end (one that came up late in the interval did not serve its queue).
        before = self._ready_before or ready
        throughout = {k: min(before[k], ready[k]) for k in ready}
        self._ready_before = ready
        ttft_target = self._ttft_s
        # observed / target: the pool's against the one target, or (by class) the SLO level furthest over its own
        if self.levels:
            ttft_over, itl_over = levels_over_target(self.levels, obs.levels)
        else:
            ttft_over = None if obs.ttft_p99_s is None else obs.ttft_p99_s / ttft_target
            itl_over = None if obs.itl_p50_s is None else obs.itl_p50_s / self._itl_s
        # ... or inherited a queue, and drained it: a request arriving to a
        # queue that takes d to drain has its first token no sooner than d
        # plus its own share of the queueing the pool is sized for (mean
        # TTFT = target / factor), so a queue of more than
        # target x (1 - 1/factor) alone breaks the target for the interval's
        # first arrivals. A queue that did not shrink under a sized pool is
        # the model's, though: it says the pool computes more than it does.
        inherited = (
            self._backlog_s > ttft_target * (1 - 1 / self.config.queueing_factor)
            and obs.prefill_queued_tokens < self._queued_tokens
        )
        self._queued_tokens = obs.prefill_queued_tokens
        self._backlog_s = self._drain_s(
            obs.prefill_queued_tokens, obs.prefill_replicas, obs.mean_isl, obs.prefix_hit_rate
        )
        sized = {
            "prefill": throughout["prefill"] >= prefill_need - 1e-9 and not inherited,  # need: inf if unreachable
            "decode": throughout["decode"] >= decode_need - 1e-9,
        }
        # A TTFT miss is the prefill pool's, unless decode engines are the ones
        # with a queue (out of sequence slots or KV: requests wait to start).
        ttft_pool = "prefill" if self.disaggregated and obs.prefill_waiting >= obs.decode_waiting else "decode"
        self._corrections[ttft_pool] = _corrected(
            self._corrections[ttft_pool],
            ttft_over,
            raise_ok=self._persists("ttft", ttft_over, sized[ttft_pool]),
        )
        self._corrections["decode"] = _corrected(
            self._corrections["decode"],
            itl_over,
            raise_ok=self._persists("itl", itl_over, sized["decode"]),
        )

    def _persists(self, signal: str, over: float | None, sized: bool) -> bool:
        """Whether `signal` has now missed its target (`over`: observed / target) with its pool sized for
        `correction_after_intervals` intervals in a row: one interval's p99
        is a noisy statistic and a burst is not a wrong model, but a wrong
        model misses every interval."""
        missed = sized and over is not None and over > 1.0
        self._sized_misses[signal] = self._sized_misses.get(signal, 0) + 1 if missed else 0
        return self._sized_misses[signal] >= self.config.correction_after_intervals

    def _arriving_osl(self, obs: Observation) -> float | None:
        """The output tokens the interval's arrivals will make: what they asked for x the share of their
        ask the finished requests made (None: either not known)."""
        if obs.mean_max_tokens is None or self._output_share is None:
            return None
        return obs.mean_max_tokens * self._output_share

    def _osl_seen(self, obs: Observation) -> float:
        """The interval's OSL: its arrivals' (`_arriving_osl`); where not known, the mean of the requests
        that finished in it; where none did, the predictor's (the outputs of the requests in flight are
        not 0)."""
        osl = self._arriving_osl(obs)
        if osl is not None:
            return osl
        if obs.mean_osl is not None:
            return obs.mean_osl
        return self._predictors["osl"].predict() or 0.0

    def _calibrate_step(self, obs: Observation) -> None:
        """The decode replicas' median gap between tokens over the profile's step at the batch they ran (the
        streams running per replica at the interval's end, at the interval's mean context), averaged with the
        last interval's and held within [1, 4]: an interval with no stream or no gap measured changes
        nothing."""
        if obs.itl_p50_s is None or obs.decode_running <= 0 or obs.decode_replicas <= 0:
            return
        batch = max(round(obs.decode_running / obs.decode_replicas), 1)
        context = max(int(round(obs.mean_isl + self._osl_seen(obs) / 2)), 1)
        modelled = self.perf.step_time(Batch(decode_contexts=(context,) * batch))
        if modelled <= 0:
            return
        ratio = min(max(obs.itl_p50_s / modelled, 1.0), 4.0)
        self._step_scale = (self._step_scale + ratio) / 2

    def _running_need(self, running: int, isl: float, osl: float) -> float:
        """Decode replicas the streams running now fill: one holds the largest batch within the ITL
        target at the mean context (0 running: 0; a batch of 1 already over the target: infinite)."""
        if running <= 0:
            return 0.0
        batch = self._one_decode_replica(decode_batch_limit, isl + osl / 2)
        need = running / batch if batch else math.inf
        best_effort = sum(s.rate_share * s.osl_ratio for s in self._mix if s.level.best_effort)
        if not best_effort or math.isinf(need):
            return need
        # best-effort streams' part (their share of the output load) counts within its share of the budget
        whole = sum(s.rate_share * s.osl_ratio for s in self._mix)
        part = need * best_effort / whole
        return need - part + min(part, self.config.best_effort_share * self._pool_budget("decode"))

    def _one_decode_replica(self, measure, context: float):
        """`decode_batch_limit` or `decode_capacity` of one decode replica at `context`: within the ITL target
        and the KV capacity, its step `_step_scale` x the profile's."""
        return measure(
            self.perf,
            context,
            self._itl_s,
            self.kv_capacity_tokens,
            self.max_num_seqs,
            self._step_scale,
        )

    def _predict(self, obs: Observation) -> tuple[float, float, float, float]:
        """The busier of the next interval and the one that starts when a
        replica asked for now is serving."""
        p = self._predictors
        later = 1 + (math.ceil(self.config.replica_startup_s / obs.interval_s - 1e-9) if obs.interval_s > 0 else 0)
        steps = (1, later) if later > 1 else (1,)
        rate = max([p["rate"].predict(k) or 0.0 for k in steps] + [obs.request_rate])
        isl = max(p["isl"].predict(k) or obs.mean_isl for k in steps)
        osl = max(p["osl"].predict(k) or self._osl_seen(obs) for k in steps)
        hit = min(max(p["hit"].predict() or 0.0, 0.0), 1.0)
        return rate, isl, osl, hit

    def _propose(
        self,
        rate: float,
        isl: float,
        osl: float,
        hit: float,
        peak_ratio: float = 1.0,
        burstiness: float = 1.0,
        corrected: bool = True,
    ) -> tuple[float, float]:
        """Replicas each pool needs (fractional) for the load."""
        if rate <= 0:
            return 0.0, 0.0
        if self._mix:
            prefill, decode = self._propose_levels(rate, isl, osl, hit, peak_ratio, burstiness)
        else:
            prefill, decode = self._sized(rate, isl, osl, hit, peak_ratio, burstiness, self._ttft_s)
        if corrected:
            prefill *= self._corrections["prefill"]
            decode *= self._corrections["decode"]
        if not self.disaggregated:  # one pool prefills and decodes
            return 0.0, prefill + decode
        return prefill, decode

    def _propose_levels(
        self, rate: float, isl: float, osl: float, hit: float, peak_ratio: float, burstiness: float
    ) -> tuple[float, float]:
        """Replicas each pool needs (fractional, uncorrected) for the load by priority level (the
        module's docstring, `by class`)."""
        slo = [share for share in self._mix if not share.level.best_effort]
        loosest = max((s.level.ttft_p99_s for s in slo), default=self._ttft_s)
        prefill = self._prefill_by_priority(rate, isl, hit, burstiness, best_effort_target=None)
        for share in slo:  # the burst headroom of what runs before each level or with it
            r, i, _ = blend([s for s in self._mix if s.level.priority <= share.level.priority], rate, isl, osl)
            prefill = max(prefill, self._peak_need(r, i, hit, peak_ratio, share.level.ttft_p99_s))
        r, i, o = blend(slo, rate, isl, osl)
        decode = _need(r * o, self._one_decode_replica(decode_capacity, i + o / 2) * self.config.decode_utilization)
        if len(slo) < len(self._mix):  # best effort: what the whole load needs beyond, within its share
            whole_prefill = max(
                self._prefill_by_priority(rate, isl, hit, burstiness, best_effort_target=loosest),
                self._peak_need(rate, isl, hit, peak_ratio, loosest),
            )
            whole_decode = self._sized(rate, isl, osl, hit, peak_ratio, burstiness, loosest)[1]
            share = self.config.best_effort_share
            prefill += min(max(whole_prefill - prefill, 0.0), share * self._pool_budget("prefill"))
            decode += min(max(whole_decode - decode, 0.0), share * self._pool_budget("decode"))
        return prefill, decode

    def _prefill_by_priority(
        self, rate: float, isl: float, hit: float, burstiness: float, best_effort_target: float | None
    ) -> float:
        """Prefill replicas for the levels' prompts (capacity.priority_prefill_need), best effort held to
        `best_effort_target` (None: to nothing)."""
        levels = [
            PromptLevel(
                rate * s.rate_share,
                max(isl * s.isl_ratio * (1.0 - hit), 1.0),
                best_effort_target if s.level.best_effort else s.level.ttft_p99_s,
            )
            for s in self._mix
        ]
        return priority_prefill_need(self.perf, levels, self.config.queueing_factor, burstiness)

    def _pool_budget(self, pool: str) -> int:
        """The replicas `pool` may have at most: the GPU budget where one is set, else its max_replicas."""
        budget = self._budget_replicas
        return budget if budget is not None else getattr(self.config, pool).max_replicas

    def _sized(
        self,
        rate: float,
        isl: float,
        osl: float,
        hit: float,
        peak_ratio: float,
        burstiness: float,
        ttft_target: float,
    ) -> tuple[float, float]:
        """Replicas each pool needs (fractional, uncorrected) for the load held to one TTFT target and the
        ITL target."""
        if rate <= 0:
            return 0.0, 0.0
        uncached = max(isl * (1.0 - hit), 1.0)
        on_wait = self.config.prefill_queueing == "wait"
        prefill_cap = prefill_capacity(
            self.perf, uncached, ttft_target, self.config.queueing_factor, burstiness, factor_on_wait_only=on_wait
        )
        decode_cap = self._one_decode_replica(decode_capacity, isl + osl / 2)
        prefill = max(_need(rate * uncached, prefill_cap), self._peak_need(rate, isl, hit, peak_ratio, ttft_target))
        decode = _need(rate * osl, decode_cap * self.config.decode_utilization)
        return prefill, decode

    def _peak_need(self, rate: float, isl: float, hit: float, peak_ratio: float, ttft_target: float) -> float:
        """Prefill replicas for the peak prompt tokens/s: a replica flat out over the peak window clears its
        backlog within the TTFT target (0: no peak measured)."""
        if peak_ratio <= 1.0 or not self._peak_window_s:
            return 0.0
        uncached = max(isl * (1.0 - hit), 1.0)
        return _need(
            rate * uncached * peak_ratio, self._flat_out_tps(isl, hit) * (1 + ttft_target / self._peak_window_s)
        )

    def _flat_out_tps(self, isl: float, hit: float) -> float:
        """Prompt tokens/s one prefill replica computes back to back at this ISL."""
        uncached = max(isl * (1.0 - hit), 1.0)
        return uncached / prefill_service_s(self.perf, uncached)

    def _drain_s(self, queued_tokens: float, replicas: int, isl: float, hit: float) -> float:
        """Seconds `replicas` prefill replicas flat out take to clear the queue."""
        if queued_tokens <= 0:
            return 0.0
        if replicas <= 0:
            return math.inf
        return queued_tokens / (replicas * self._flat_out_tps(isl, hit))

    def _backlog(self, queued_tokens: float, interval_s: float, isl: float, hit: float) -> float:
        """Replicas that compute the prompt tokens already queued within one
        interval, on top of the new load."""
        if queued_tokens <= 0 or interval_s <= 0:
            return 0.0
        return queued_tokens / (interval_s * self._flat_out_tps(isl, hit))

    def _constrain(self, prefill_need: float, decode_need: float) -> tuple[int, int, str, tuple[CapShortfall, ...]]:
        cfg = self.config
        prefill = _bounded(prefill_need, cfg.prefill) if self.disaggregated else 0
        decode = _bounded(decode_need, cfg.decode)
        prefill = self._hysteresis["prefill"].apply(prefill, cfg.scale_down_intervals) if self.disaggregated else 0
        decode = self._hysteresis["decode"].apply(decode, cfg.scale_down_intervals)
        bounded = self._counts(prefill, decode)
        reason = ""
        budget = self._budget_replicas
        if budget is not None:
            if prefill + decode > budget:
                first, second = ("decode", "prefill") if cfg.budget_priority == "decode" else ("prefill", "decode")
                counts = {"prefill": prefill, "decode": decode}
                floor = {
                    "prefill": cfg.prefill.min_replicas if self.disaggregated else 0,
                    "decode": cfg.decode.min_replicas,
                }
                counts[first] = min(counts[first], budget - floor[second])
                counts[second] = min(counts[second], budget - counts[first])
                prefill, decode = counts["prefill"], counts["decode"]
                reason = f"GPU budget {cfg.max_gpus} binds; {first} served first"
                self._hysteresis["prefill"].current, self._hysteresis["decode"].current = prefill, decode
        needed = {"prefill": prefill_need, "decode": decode_need} if self.disaggregated else {"decode": decode_need}
        capped = shortfalls(needed, bounded, self._counts(prefill, decode))
        return prefill, decode, "; ".join(r for r in (reason, *(c.describe() for c in capped)) if r), capped


def _need(load: float, capacity: float) -> float:
    return load / capacity if capacity > 0 else math.inf


def _bounded(need: float, bounds: PoolBounds) -> int:
    wanted = bounds.max_replicas if math.isinf(need) else math.ceil(need - 1e-9)
    return min(max(wanted, bounds.min_replicas), bounds.max_replicas)


def _corrected(correction: float, over: float | None, raise_ok: bool = True) -> float:
    """Learn how far the model is from reality: a pool missing its target
    with the replicas the model asked for gets more capacity next time (by
    up to sqrt 2 an interval), one well under it drifts back towards the
    profile (5% an interval, down to 1, never under it: latency far under
    target says nothing about how much load a replica takes when its limit
    is not latency but its batch slots, KV or the burst headroom).
    Bounded to [1, 4]. `over`: observed / target (None: not measured)."""
    if over is None:
        return correction
    if over > 1.0:
        if raise_ok:
            correction *= min(over, 2.0) ** 0.5
    elif over < 0.5:
        correction = max(correction * 0.95, 1.0)
    return min(max(correction, 1.0), 4.0)
