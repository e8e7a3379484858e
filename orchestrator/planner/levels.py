"""The traffic's priority levels as the planner sees them: what each level is held to, and what each did.

A level is one engine priority (the SLO classes' `priority`, lower runs first). The engines tell
requests apart by priority only, so the classes that share one are one level, held to the strictest
of their targets; a level whose classes are all best effort has none.

    replica   ReplicaLoadWindow records each request's priority; its report carries one LevelReport
              per configured level (`levels`: their priorities), every report the same levels in the
              same order, as flat floats under LEVEL_KEY (a request at a priority no class has counts
              in `level_of`'s level)
    pool      observe_levels: per priority, the decode pool's arrivals, lengths and gaps between
              tokens, and the worst decode replica's TTFT p99 plus the worst prefill replica's
              (the same rules as the pool's Observation)
    planner   each level's part of the load (`mix_of`), and how far the SLO level furthest over its
              own targets is (`levels_over_target`); SlaPlanner sizes each pool so that every SLO level
              meets its own targets (planner.py, `by class`)
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

from orchestrator.config import SloClassConfig

MISSING = -1.0  # a latency with no sample (metrics are floats)
LEVEL_KEY = "level_"  # + "{index}_{field}": LevelReport `index` of a replica's report


@dataclass(frozen=True)
class PriorityLevel:
    """One engine priority and the targets its requests are held to (None, None: best effort)."""

    priority: int
    ttft_p99_s: float | None = None
    itl_p50_s: float | None = None

    @property
    def best_effort(self) -> bool:
        return self.ttft_p99_s is None


def level_of(priorities: Sequence[int], priority: int) -> int:
    """The level (an index into `priorities`, ascending) a request of `priority` belongs to: its own, else
    the nearest that runs before it (a request may ask for a lower priority than its class's), else the
    first."""
    index = 0
    for i, p in enumerate(priorities):
        if p <= priority:
            index = i
    return index


def priority_levels(classes: Sequence[SloClassConfig]) -> tuple[PriorityLevel, ...]:
    """The classes' levels, highest priority (lowest value) first; classes at one priority are held to
    the strictest of their targets, and best effort only where every one of them is."""
    by_priority: dict[int, list[SloClassConfig]] = {}
    for c in classes:
        by_priority.setdefault(c.priority, []).append(c)
    levels = []
    for priority in sorted(by_priority):
        slo = [c for c in by_priority[priority] if c.ttft_p99_ms is not None]
        if not slo:
            levels.append(PriorityLevel(priority))
            continue
        ttft = min(c.ttft_p99_ms for c in slo) / 1000
        itl = min(c.itl_p50_ms for c in slo) / 1000
        levels.append(PriorityLevel(priority, ttft, itl))
    return tuple(levels)


@dataclass(frozen=True)
class LevelReport:
    """What one replica saw of one priority over its span (latencies None: no sample)."""

    priority: int
    arrival_rate: float = 0.0  # requests/s
    mean_isl: float = 0.0  # of the arrivals
    mean_max_tokens: float = 0.0  # the arrivals' ask (0: not known)
    finished: float = 0.0  # requests
    mean_osl: float = 0.0  # of the finished (0: none)
    first_token_p99_s: float | None = None
    itl_p50_s: float | None = None

    def to_metrics(self, index: int) -> dict[str, float]:
        prefix = f"{LEVEL_KEY}{index}_"
        return {prefix + f.name: MISSING if (v := getattr(self, f.name)) is None else float(v) for f in fields(self)}

    @classmethod
    def all_from_metrics(cls, metrics: Mapping[str, float]) -> tuple[LevelReport, ...]:
        """Every LevelReport flattened into `metrics`, in index order (a level missing its priority is
        dropped)."""
        values: dict[int, dict[str, float]] = {}
        for key, value in metrics.items():
            if not key.startswith(LEVEL_KEY):
                continue
            index, _, name = key[len(LEVEL_KEY) :].partition("_")
            if index.isdigit() and name:
                values.setdefault(int(index), {})[name] = value
        known = {f.name for f in fields(cls)}
        out = []
        for index in sorted(values):
            raw = {k: v for k, v in values[index].items() if k in known and not math.isnan(v)}
            if "priority" not in raw:
                continue
            for latency in ("first_token_p99_s", "itl_p50_s"):
                if raw.get(latency, MISSING) <= MISSING:
                    raw[latency] = None
            raw["priority"] = int(raw["priority"])
            out.append(cls(**raw))
        return tuple(out)


@dataclass(frozen=True)
class LevelObservation:
    """One priority over one interval, as the pools saw it."""

    priority: int
    request_rate: float  # requests/s at the decode pool
    mean_isl: float
    mean_osl: float | None  # the arrivals' ask where known, else the finished requests' mean (None: neither)
    ttft_p99_s: float | None = None
    itl_p50_s: float | None = None


def observe_levels(
    prefill: Sequence[Iterable[LevelReport]], decode: Sequence[Iterable[LevelReport]]
) -> tuple[LevelObservation, ...]:
    """Per priority seen at the decode pool, highest priority first. `prefill`/`decode`: each replica's
    level reports."""
    prefill_ttft: dict[int, float] = {}
    for levels in prefill:
        for level in levels:
            if level.first_token_p99_s is not None:
                prefill_ttft[level.priority] = max(prefill_ttft.get(level.priority, 0.0), level.first_token_p99_s)
    by_priority: dict[int, list[LevelReport]] = {}
    for levels in decode:
        for level in levels:
            by_priority.setdefault(level.priority, []).append(level)
    return tuple(
        _observed(priority, by_priority[priority], prefill_ttft.get(priority)) for priority in sorted(by_priority)
    )


def _observed(priority: int, reports: list[LevelReport], prefill_ttft: float | None) -> LevelObservation:
    rate = sum(r.arrival_rate for r in reports)
    isl = sum(r.mean_isl * r.arrival_rate for r in reports) / rate if rate else 0.0
    asked = [r for r in reports if r.arrival_rate > 0]
    finished = sum(r.finished for r in reports)
    if asked and all(r.mean_max_tokens > 0 for r in asked):
        osl: float | None = sum(r.mean_max_tokens * r.arrival_rate for r in asked) / rate
    elif finished:
        osl = sum(r.mean_osl * r.finished for r in reports) / finished
    else:
        osl = None
    firsts = [r.first_token_p99_s for r in reports if r.first_token_p99_s is not None]
    ttft = max(firsts) if firsts else None
    if ttft is not None and prefill_ttft is not None:
        ttft += prefill_ttft
    gaps = [r.itl_p50_s for r in reports if r.itl_p50_s is not None]
    return LevelObservation(
        priority,
        rate,
        isl,
        osl,
        ttft_p99_s=ttft,
        itl_p50_s=sum(gaps) / len(gaps) if gaps else None,
    )


@dataclass(frozen=True)
class LevelShare:
    """One level's part of a load: its share of the requests, its mean ISL and OSL over the whole's."""

    level: PriorityLevel
    rate_share: float
    isl_ratio: float
    osl_ratio: float


def mix_of(levels: Sequence[PriorityLevel], observed: Sequence[LevelObservation]) -> tuple[LevelShare, ...]:
    """Each configured level's part of the observed load, highest priority first; a level that saw no request
    is left out (empty: none did)."""
    priorities = [level.priority for level in levels]
    groups: list[list[LevelObservation]] = [[] for _ in levels]
    for o in observed:
        if o.request_rate > 0:
            groups[level_of(priorities, o.priority)].append(o)
    whole = [o for group in groups for o in group]
    rate, isl, osl = _means(whole)
    if not rate:
        return ()
    return tuple(
        LevelShare(level, r / rate, i / isl if isl > 0 else 1.0, o / osl if osl > 0 and o > 0 else 1.0)
        for level, group in zip(levels, groups)
        for r, i, o in [_means(group)]
        if r
    )


def _means(observed: Sequence[LevelObservation]) -> tuple[float, float, float]:
    """Requests/s, mean ISL and mean OSL (over those whose OSL is known; 0: none) of `observed` together."""
    rate = sum(o.request_rate for o in observed)
    if not rate:
        return 0.0, 0.0, 0.0
    isl = sum(o.request_rate * o.mean_isl for o in observed) / rate
    known = [o for o in observed if o.mean_osl is not None]
    known_rate = sum(o.request_rate for o in known)
    osl = sum(o.request_rate * o.mean_osl for o in known) / known_rate if known_rate else 0.0
    return rate, isl, osl


def blend(shares: Sequence[LevelShare], rate: float, isl: float, osl: float) -> tuple[float, float, float]:
    """The rate, mean ISL and mean OSL of the levels `shares` within a whole load of (rate, isl, osl)."""
    part = sum(s.rate_share for s in shares)
    if part <= 0:
        return 0.0, isl, osl
    return (
        rate * part,
        isl * sum(s.rate_share * s.isl_ratio for s in shares) / part,
        osl * sum(s.rate_share * s.osl_ratio for s in shares) / part,
    )


def levels_over_target(
    levels: Sequence[PriorityLevel], observed: Sequence[LevelObservation]
) -> tuple[float | None, float | None]:
    """Observed / target of the SLO level furthest over its TTFT target, and of the one furthest over its ITL
    target (None: no SLO level measured it); best-effort levels have none."""
    priorities = [level.priority for level in levels]
    ttft, itl = [], []
    for o in observed:
        level = levels[level_of(priorities, o.priority)]
        if level.best_effort:
            continue
        if o.ttft_p99_s is not None:
            ttft.append(o.ttft_p99_s / level.ttft_p99_s)
        if o.itl_p50_s is not None:
            itl.append(o.itl_p50_s / level.itl_p50_s)
    return max(ttft, default=None), max(itl, default=None)
