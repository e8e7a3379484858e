"""The hindsight optimum for the autoscaling experiment: the cheapest schedule
of (prefill, decode) replica counts, one per interval, that keeps the target
share of a whole trace's requests within the SLO, knowing the trace.

    met[c][t]    requests arriving in interval t that meet the SLO when the
                 pools are c = (prefill, decode) replicas (measured: a run of
                 the cluster simulator with c fixed throughout)
    cost(c)      GPU-seconds of an interval at c; raising a pool by k
                 replicas costs k x startup_s more (a replica is paid for
                 from being asked for, `startup_s` before it serves)
    find         min  sum_t cost(c_t) + start-ups
                 s.t. sum_t met[c_t][t] >= target x requests
                 by Lagrangian relaxation: for a price lam per request met,
                 a dynamic programme over intervals (state: the counts) gives
                 the schedule minimising cost - lam x met; bisection on lam
                 finds the cheapest schedule that reaches the target. Where
                 no schedule reaches it, the one meeting the most requests,
                 at its least cost.

Approximations, stated where the result is reported: an interval at c is
taken to go as it went in the run fixed at c (the queue it inherits is that
run's, not the schedule's), and the relaxation finds schedules on the convex
hull of (cost, met) only. The experiment therefore replays the schedule in
the simulator and reports what the replay measures, not what the programme
predicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Counts = tuple[int, int]  # (prefill, decode) replicas


@dataclass(frozen=True)
class Schedule:
    counts: tuple[Counts, ...]  # per interval
    met: int  # requests within the SLO, as the fixed-count runs predict
    requests: int
    gpu_s: float  # GPU-seconds, start-ups included
    price: float  # the lam that chose it (inf: the most requests met at any cost)

    @property
    def attainment(self) -> float:
        return self.met / self.requests if self.requests else 1.0


def cheapest_schedule(
    met: Mapping[Counts, Sequence[int]],
    requests: Sequence[int],
    interval_s: float,
    startup_s: float,
    target: float = 0.99,
    gpus_per_replica: int = 1,
    iterations: int = 60,
) -> Schedule:
    """`met[c][t]` for every candidate c and interval t; `requests[t]` arrived in t."""
    if not met:
        raise ValueError("no candidate replica counts")
    intervals = len(requests)
    if any(len(m) != intervals for m in met.values()):
        raise ValueError("every candidate needs one count per interval")
    needed = target * sum(requests)
    best_effort = _programme(met, intervals, interval_s, startup_s, gpus_per_replica, price=None)
    best_effort = _schedule(best_effort, met, requests, interval_s, startup_s, gpus_per_replica, float("inf"))
    if best_effort.met < needed:
        return best_effort
    lo, hi = 0.0, 1.0
    while _solve(met, requests, interval_s, startup_s, gpus_per_replica, hi).met < needed:
        hi *= 2
        if hi > 1e12:
            return best_effort
    for _ in range(iterations):
        mid = (lo + hi) / 2
        if _solve(met, requests, interval_s, startup_s, gpus_per_replica, mid).met >= needed:
            hi = mid
        else:
            lo = mid
    return _solve(met, requests, interval_s, startup_s, gpus_per_replica, hi)


def _solve(met, requests, interval_s, startup_s, gpus, price: float) -> Schedule:
    counts = _programme(met, len(requests), interval_s, startup_s, gpus, price)
    return _schedule(counts, met, requests, interval_s, startup_s, gpus, price)


def _programme(
    met: Mapping[Counts, Sequence[int]],
    intervals: int,
    interval_s: float,
    startup_s: float,
    gpus: int,
    price: float | None,
) -> tuple[Counts, ...]:
    """The schedule minimising GPU-seconds - price x met (price None: the
    most met first, then the least GPU-seconds). Dynamic programme over
    intervals; the state is the counts of the interval."""
    states = sorted(met)

    def value(c: Counts, t: int) -> tuple[float, float]:
        gpu_s = sum(c) * gpus * interval_s
        return (-met[c][t], gpu_s) if price is None else (gpu_s - price * met[c][t], 0.0)

    def step(a: Counts, b: Counts) -> float:
        return _startup_gpu_s(a, b, startup_s, gpus)

    best = {c: value(c, 0) for c in states}
    back: list[dict[Counts, Counts]] = []
    for t in range(1, intervals):
        here: dict[Counts, tuple[float, float]] = {}
        choice: dict[Counts, Counts] = {}
        for c in states:
            v = value(c, t)
            prev = min(states, key=lambda a: _plus(best[a], step(a, c), price))
            total = _plus(best[prev], step(prev, c), price)
            here[c] = (total[0] + v[0], total[1] + v[1])
            choice[c] = prev
        best = here
        back.append(choice)
    last = min(states, key=lambda c: best[c])
    path = [last]
    for choice in reversed(back):
        path.append(choice[path[-1]])
    return tuple(reversed(path))


def _plus(v: tuple[float, float], gpu_s: float, price: float | None) -> tuple[float, float]:
    return (v[0], v[1] + gpu_s) if price is None else (v[0] + gpu_s, v[1])


def _startup_gpu_s(a: Counts, b: Counts, startup_s: float, gpus: int) -> float:
    return sum(max(y - x, 0) for x, y in zip(a, b)) * startup_s * gpus


def _schedule(counts, met, requests, interval_s, startup_s, gpus, price) -> Schedule:
    gpu_s = sum(sum(c) * gpus * interval_s for c in counts)
    gpu_s += sum(_startup_gpu_s(a, b, startup_s, gpus) for a, b in zip(counts, counts[1:]))
    return Schedule(
        counts=tuple(counts),
        met=sum(met[c][t] for t, c in enumerate(counts)),
        requests=sum(requests),
        gpu_s=gpu_s,
        price=price,
    )
