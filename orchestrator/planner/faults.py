"""What the planner does when what it sees is not what it asked for.

    metrics gap     a pool with replicas in force or serving sent no report for the interval: the
                    observation says nothing of its load, so the planner holds both pools where they
                    are (never below what it holds, so never below a minimum) and learns nothing from it
    pending         a pool with fewer replicas serving than in force for longer than the pending timeout:
                    reported every interval it lasts. Nothing waits on it: the other pool scales as
                    before, and a smaller ask cancels pending replicas first (Serve and the simulator)
    manual change   the replicas in force are not what the planner last decided (someone resized the
                    pool, or the platform clamped it to bounds of its own): reported, and the planner
                    resizes from the count in force, up at once if the load needs more, down only
                    through its stabilisation window

Pure: the intervals' lengths are the only time it knows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class PoolView:
    """One pool at an interval's end, as the planner's caller sees it (None: not known)."""

    ready: int  # serving
    reports: int | None = None  # serving replicas whose report made the observation
    in_force: int | None = None  # asked for: starting and serving


@dataclass(frozen=True)
class PendingReplicas:
    pool: str
    missing: int  # in force, not serving
    for_s: float  # how long the pool has been short of its count in force


@dataclass(frozen=True)
class ManualChange:
    pool: str
    decided: int  # the planner's last count
    in_force: int


@dataclass(frozen=True)
class Faults:
    gap: tuple[str, ...] = ()  # pools that sent no report
    pending: tuple[PendingReplicas, ...] = ()  # short for longer than the timeout
    manual: tuple[ManualChange, ...] = ()

    def describe(self) -> str:
        parts = [f"metrics gap ({', '.join(self.gap)} sent no report): holding" if self.gap else ""]
        parts += [f"{p.pool}: {p.missing} replica(s) not up after {p.for_s:.0f} s" for p in self.pending]
        parts += [f"{m.pool} resized outside the planner, {m.decided} -> {m.in_force}" for m in self.manual]
        return "; ".join(p for p in parts if p)


def metrics_gap(pools: Mapping[str, PoolView]) -> tuple[str, ...]:
    """The pools with replicas in force or serving that sent no report."""
    return tuple(name for name, p in pools.items() if p.reports == 0 and (p.ready > 0 or (p.in_force or 0) > 0))


@dataclass
class FaultWatch:
    pending_timeout_s: float
    _short_s: dict[str, float] = field(default_factory=dict)  # per pool, how long serving < in force

    def see(self, interval_s: float, pools: Mapping[str, PoolView], decided: Mapping[str, int] | None) -> Faults:
        """`decided`: the counts the planner last asked for, where they were applied (None: nothing applied yet,
        or the planner only advises)."""
        gap = metrics_gap(pools)
        pending = []
        for name, p in pools.items():
            short = p.in_force is not None and p.ready < p.in_force
            self._short_s[name] = self._short_s.get(name, 0.0) + interval_s if short else 0.0
            if short and self._short_s[name] > self.pending_timeout_s:
                pending.append(PendingReplicas(name, p.in_force - p.ready, self._short_s[name]))
        manual = tuple(
            ManualChange(name, decided[name], p.in_force)
            for name, p in pools.items()
            if decided is not None and name in decided and p.in_force is not None and p.in_force != decided[name]
        )
        return Faults(gap, tuple(pending), manual)
