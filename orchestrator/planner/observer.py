"""What a pool replica saw over the last window, as plain numbers: the
planner's observations come from the replicas themselves (Ray Serve's custom
autoscaling metrics carry these snapshots to the controller), not from an
external Prometheus.

Per replica, over the last `span_s` seconds:
  arrivals/s, mean prompt tokens, mean output tokens asked for (`max_tokens`)
  of the requests that arrived, mean output tokens and mean `max_tokens` of
  the requests that finished, prompt tokens found in the local prefix cache,
  p99 time to first token at the replica, median gap between its tokens,
  requests waiting in its engine;
and at the snapshot:
  prompt tokens queued (requests arrived whose first token has not come yet),
  requests streaming output (first token come, not yet gone),
  prompt tokens that arrived in each of the last complete `peak_window_s`
  buckets, and the most prompt tokens/s over one of them.
A latency with no sample in the window is reported as -1 (metrics are floats).
With `levels` (the SLO classes' engine priorities), the report also carries one
LevelReport per level (orchestrator/planner/levels.py): the planner sizes each
SLO class's level to its own targets.

Buckets are aligned on the clock's epoch (bucket k is [k w, (k + 1) w)), and
the clock is wall time by default, so that the replicas of a pool, each
reporting on its own schedule, count the same stretches of time and the
controller can add them up (`pool_peak_prompt_tps`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.planner.levels import MISSING, LevelReport, level_of

MAX_BUCKETS = 60  # reported buckets per snapshot at most (metrics are one key each)
BUCKET_KEY = "prompt_tokens_bucket_"  # + j: prompt tokens in bucket `bucket_now - j` (j = 1 the last complete one)


@dataclass(frozen=True)
class ReplicaReport:
    """One replica's report to the planner: the boundary between a replica
    (a Serve replica, or one in the cluster simulator) and the planner's
    pool-level Observation (orchestrator/planner/observation.py). Serve
    carries it as flat float metrics (`to_metrics` / `from_metrics`)."""

    arrival_rate: float = 0.0  # requests/s over the span
    mean_isl: float = 0.0  # of the requests that arrived
    mean_osl: float = 0.0  # of the requests that finished (0 when none did: see `finished`)
    finished: float = 0.0  # requests that finished over the span
    mean_max_tokens: float = 0.0  # the output tokens the requests that arrived asked for (0: not known)
    finished_max_tokens: float = 0.0  # ... and those that finished (0: not known)
    prompt_tokens: float = 0.0  # arrived
    prompt_tokens_sq: float = 0.0  # the sum of the squares of the arrived requests' prompt tokens
    cached_tokens: float = 0.0  # found in this replica's prefix cache, of the requests that finished
    first_token_p99_s: float | None = None  # at this replica, from its arrival; None: no sample
    itl_p50_s: float | None = None
    waiting: float = 0.0  # requests queued in the engine now
    queued_prompt_tokens: float = 0.0  # prompt tokens of requests here with no first token yet
    running: float = 0.0  # requests streaming output now: first token come, not yet gone
    peak_window_s: float | None = None  # width of a peak bucket
    peak_prompt_tps: float | None = None  # the most prompt tokens/s over one complete bucket
    bucket_now: float | None = None  # index of the bucket `now` is in, on the shared clock
    buckets: tuple[float, ...] = ()  # prompt tokens per bucket, j = 1 the last complete one
    levels: tuple[LevelReport, ...] = ()  # per engine priority seen (none: not recorded by priority)

    _LATENCIES = ("first_token_p99_s", "itl_p50_s")
    _SCALARS = (
        "arrival_rate",
        "mean_isl",
        "mean_osl",
        "finished",
        "mean_max_tokens",
        "finished_max_tokens",
        "prompt_tokens",
        "prompt_tokens_sq",
        "cached_tokens",
        "waiting",
        "queued_prompt_tokens",
        "running",
        "peak_window_s",
        "peak_prompt_tps",
        "bucket_now",
    )

    def to_metrics(self) -> dict[str, float]:
        out = {k: float(getattr(self, k)) for k in self._SCALARS if getattr(self, k) is not None}
        out.update({k: MISSING if getattr(self, k) is None else float(getattr(self, k)) for k in self._LATENCIES})
        out.update({f"{BUCKET_KEY}{j}": float(n) for j, n in enumerate(self.buckets, start=1)})
        for index, level in enumerate(self.levels):
            out.update(level.to_metrics(index))
        return out

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, float]) -> ReplicaReport:
        """Missing keys take their defaults; a latency of MISSING (or NaN) is no sample."""

        def present(key: str) -> float | None:
            value = metrics.get(key)
            return None if value is None or math.isnan(value) else float(value)

        values: dict = {k: v for k in cls._SCALARS if (v := present(k)) is not None}
        for k in cls._LATENCIES:
            v = present(k)
            values[k] = v if v is not None and v > MISSING else None
        buckets = {int(k[len(BUCKET_KEY) :]): v for k, v in metrics.items() if k.startswith(BUCKET_KEY)}
        values["buckets"] = tuple(buckets[j] for j in range(1, len(buckets) + 1) if j in buckets)
        values["levels"] = LevelReport.all_from_metrics(metrics)
        return cls(**values)


class ReplicaLoadWindow:
    """`clock`: seconds; the replicas of a pool must share it (wall time) for
    their peak buckets to line up. `peak_window_s`: the width w of a peak
    bucket; the replica reports its last n = max(1, span_s // w) complete
    buckets, plus one more, so that the controller can line up replicas
    whose latest reports straddle a bucket boundary. `levels`: the engine
    priorities whose arrivals, lengths and latencies it reports apart too,
    each in every report."""

    def __init__(
        self,
        span_s: float,
        clock: Callable[[], float] = time.time,
        max_samples: int = 100_000,
        peak_window_s: float = 2.0,
        levels: Sequence[int] = (),
    ) -> None:
        if span_s <= 0 or peak_window_s <= 0:
            raise ValueError("span_s and peak_window_s must be positive")
        self.span_s = span_s
        self.peak_window_s = peak_window_s
        self.peak_buckets = min(max(int(span_s // peak_window_s), 1), MAX_BUCKETS)
        self._clock = clock
        self.levels = tuple(sorted(levels))
        # (t, prompt tokens, max_tokens, priority)
        self._arrivals: deque[tuple[float, int, int, int]] = deque(maxlen=max_samples)
        # (t, out, cached, first, max_tokens, priority)
        self._finished: deque[tuple[float, int, int, float, int, int]] = deque(maxlen=max_samples)
        self._gaps: deque[tuple[float, float, int]] = deque(maxlen=max_samples)  # (t, seconds between tokens, priority)
        self._keys = itertools.count()
        self._pending: dict[int, int] = {}  # key -> prompt tokens of a request with no first token yet
        self._open: set[int] = set()  # keys of the requests here (arrived, not closed)
        self._queued_tokens = 0

    def arrived(self, prompt_tokens: int, max_tokens: int = 0, priority: int = 0) -> int:
        """A request of engine `priority` reached the replica, asking for up to
        `max_tokens` output tokens (0: not known). Its prompt tokens count as
        queued until `prompt_done` with the key returned here; it is here until
        `closed`."""
        self._arrivals.append((self._clock(), prompt_tokens, max_tokens, priority))
        key = next(self._keys)
        self._pending[key] = prompt_tokens
        self._open.add(key)
        self._queued_tokens += prompt_tokens
        return key

    def prompt_done(self, key: int) -> None:
        """The request's first token came. Idempotent."""
        self._queued_tokens -= self._pending.pop(key, 0)

    def closed(self, key: int) -> None:
        """The request left the replica, whichever way (finished, failed,
        cancelled, with or without a first token). Idempotent."""
        self.prompt_done(key)
        self._open.discard(key)

    def token_gap(self, seconds: float, priority: int = 0) -> None:
        self._gaps.append((self._clock(), seconds, priority))

    def finished(
        self,
        output_tokens: int,
        cached_tokens: int,
        first_token_s: float | None,
        max_tokens: int = 0,
        priority: int = 0,
    ) -> None:
        first = MISSING if first_token_s is None else first_token_s
        self._finished.append((self._clock(), output_tokens, cached_tokens, first, max_tokens, priority))

    def report(self, waiting: int = 0) -> ReplicaReport:
        """May run on another thread than the recording calls (Serve runs a
        replica's sync methods in a thread pool): it drops samples older
        than anything it reports (popleft, atomic) and reads copies of the
        rest (list() of a deque holds the GIL throughout), never iterating a
        deque that the event loop may append to."""
        now = self._clock()
        since = now - self.span_s
        w = self.peak_window_s
        current = math.floor(now / w)  # the bucket `now` is in (incomplete)
        buckets = [0] * (self.peak_buckets + 1)  # j = 1 .. n + 1 back from `current`
        horizon = min(since, (current - len(buckets)) * w)
        for samples in (self._arrivals, self._finished, self._gaps):
            while samples and samples[0][0] < horizon:
                samples.popleft()
        all_arrivals = list(self._arrivals)
        arrived = [(p, m) for t, p, m, _ in all_arrivals if t >= since]
        arrivals = [p for p, _ in arrived]
        finished_all = [s for s in list(self._finished) if s[0] >= since]
        finished = [(o, c, f, m) for _, o, c, f, m, _ in finished_all]
        gaps_all = [s for s in list(self._gaps) if s[0] >= since]
        gaps = [g for _, g, _ in gaps_all]
        firsts = [f for _, _, f, _ in finished if f >= 0]
        prompt = sum(arrivals)
        for t, p, _, _ in all_arrivals:
            j = current - math.floor(t / w)
            if 1 <= j <= len(buckets):
                buckets[j - 1] += p
        return ReplicaReport(
            arrival_rate=len(arrivals) / self.span_s,
            mean_isl=prompt / len(arrivals) if arrivals else 0.0,
            mean_osl=float(np.mean([o for o, _, _, _ in finished])) if finished else 0.0,
            finished=float(len(finished)),
            mean_max_tokens=_mean_known(m for _, m in arrived),
            finished_max_tokens=_mean_known(m for _, _, _, m in finished),
            prompt_tokens=float(prompt),
            prompt_tokens_sq=float(sum(p * p for p in arrivals)),
            cached_tokens=float(sum(c for _, c, _, _ in finished)),
            first_token_p99_s=float(np.quantile(firsts, 0.99)) if firsts else None,
            itl_p50_s=float(np.median(gaps)) if gaps else None,
            waiting=float(waiting),
            queued_prompt_tokens=float(self._queued_tokens),
            # read apart from the recording thread: a request between its two sets may count once either way
            running=float(max(len(self._open) - len(self._pending), 0)),
            peak_window_s=float(w),
            peak_prompt_tps=max(buckets[: self.peak_buckets]) / w,
            bucket_now=float(current),
            buckets=tuple(float(n) for n in buckets),
            levels=self._levels([a for a in all_arrivals if a[0] >= since], finished_all, gaps_all)
            if self.levels
            else (),
        )

    def _levels(self, arrivals: list, finished: list, gaps: list) -> tuple[LevelReport, ...]:
        """One LevelReport per configured level, each sample in its level (`level_of`)."""
        by: list[tuple[list, list, list]] = [([], [], []) for _ in self.levels]
        for kind, samples in enumerate((arrivals, finished, gaps)):
            for sample in samples:
                by[level_of(self.levels, sample[-1])][kind].append(sample)
        out = []
        for priority, (came, done, gap) in zip(self.levels, by):
            firsts = [f for _, _, _, f, _, _ in done if f >= 0]
            out.append(
                LevelReport(
                    priority,
                    arrival_rate=len(came) / self.span_s,
                    mean_isl=float(np.mean([p for _, p, _, _ in came])) if came else 0.0,
                    mean_max_tokens=_mean_known(m for _, _, m, _ in came),
                    finished=float(len(done)),
                    mean_osl=float(np.mean([o for _, o, _, _, _, _ in done])) if done else 0.0,
                    first_token_p99_s=float(np.quantile(firsts, 0.99)) if firsts else None,
                    itl_p50_s=float(np.median([g for _, g, _ in gap])) if gap else None,
                )
            )
        return tuple(out)

    def snapshot(self, waiting: int = 0) -> dict[str, float]:
        """The report as Serve's custom autoscaling metrics (flat floats)."""
        return self.report(waiting).to_metrics()


def _mean_known(values: Iterable[int]) -> float:
    """The mean of the known values (> 0); 0 when there is none, or one is not known (a mix says nothing)."""
    values = list(values)
    if not values or min(values) <= 0:
        return 0.0
    return float(np.mean(values))


def pool_prompt_buckets(reports: Iterable[ReplicaReport]) -> tuple[float, list[float]] | None:
    """Prompt tokens that arrived at a pool per peak bucket, from its
    replicas' latest reports: per bucket (an absolute index on the shared
    clock) the sum over replicas, for the newest n buckets every replica
    reported (n as a replica reports it: the peak buckets of one span),
    newest first, with the bucket width. None: no replica reported buckets,
    or they share none (reports more than one bucket apart, or different
    widths)."""
    per_replica = _bucket_counts(reports)
    widths = {w for w, _, _ in per_replica}
    common = set.intersection(*(set(c) for _, _, c in per_replica)) if per_replica else set()
    if len(widths) != 1 or not common:
        return None
    n = min(len(c) for _, _, c in per_replica) - 1  # the extra bucket is for lining up only
    newest = sorted(common, reverse=True)[: max(n, 1)]
    return widths.pop(), [sum(c[b] for _, _, c in per_replica) for b in newest]


def pool_peak_prompt_tps(reports: Iterable[ReplicaReport]) -> float | None:
    """The most prompt tokens/s that arrived at a pool over one peak bucket
    (`pool_prompt_buckets`). Where the replicas share no bucket, the sum of
    their own peaks, an upper bound (their peaks need not coincide). None:
    no replica reported buckets."""
    reports = list(reports)
    pooled = pool_prompt_buckets(reports)
    if pooled is not None:
        w, buckets = pooled
        return max(buckets) / w
    per_replica = _bucket_counts(reports)
    return float(sum(peak for _, peak, _ in per_replica)) if per_replica else None


def prompt_dispersion(buckets: Sequence[float], mean_isl: float) -> float | None:
    """The index of dispersion of the prompt work arriving per bucket, in
    prompt lengths: var(tokens per bucket) / (mean tokens per bucket x mean
    ISL). Requests arriving as a Poisson process with prompts of random
    length X give E[X^2] / E[X]^2 = 1 + cs^2; bursty arrivals add their
    own variability: it estimates Kingman's ca^2 + cs^2 at the bucket's time
    scale (1 for M/D/1). None: fewer than 3 buckets, or no prompt tokens."""
    if len(buckets) < 3 or mean_isl <= 0:
        return None
    mean = float(np.mean(buckets))
    if mean <= 0:
        return None
    return float(np.var(buckets, ddof=1)) / (mean * mean_isl)


def prompt_length_scv(reports: Iterable[ReplicaReport]) -> float | None:
    """cs^2 of the prompt lengths that arrived at the replicas: E[X^2] / E[X]^2 - 1
    over every request of every report (None: none arrived)."""
    reports = [r for r in reports if r.prompt_tokens > 0 and r.mean_isl > 0]
    prompt = sum(r.prompt_tokens for r in reports)
    count = sum(r.prompt_tokens / r.mean_isl for r in reports)
    if not reports or not prompt:
        return None
    return max(sum(r.prompt_tokens_sq for r in reports) * count / prompt**2 - 1.0, 0.0)


def _bucket_counts(reports: Iterable[ReplicaReport]) -> list[tuple[float, float, dict[int, float]]]:
    """Per replica that reported buckets: (width, own peak tokens/s, {absolute bucket: tokens})."""
    out = []
    for report in reports:
        w, now = report.peak_window_s, report.bucket_now
        if not w or now is None:
            continue
        counts = {int(now) - j: tokens for j, tokens in enumerate(report.buckets, start=1)}
        out.append((w, report.peak_prompt_tps or 0.0, counts))
    return out
