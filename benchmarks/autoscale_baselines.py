"""The fixed-pool baselines of an autoscale run (`static`, `hindsight`) taken
from an earlier run of the same load (`--baselines-from`), so that a change
to the planner's settings is measured against them without rerunning them.

Both are runs of the cluster simulator with the pools fixed, or scheduled
knowing the trace; the planner enters them only through which replica counts
are tried:

    static       the splits of floor/ceil(the planner's mean replicas)
    hindsight    the grid 1..P x 1..D, P and D one more than any count the
                 planner, its variants or the best static split used

So an earlier run's results stand for this run's where:

    same load    workload, requests, horizon, SLA, GPU, model, interval,
                 start-up and the per-interval load are equal
    same code    the earlier best static split, run again now, measures the
                 same attainment and GPU-hours to the last digit
    static       each split this run tries was tried then (its summary is
                 reused; a split not tried then is run now)
    hindsight    this run's grid lies within the earlier grid (the earlier
                 optimum, over as many or more candidates, is reused: never
                 easier to beat than this run's own); else it is run in full

What was reused and what ran is recorded in the result under "baselines".
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.hindsight import Counts
from benchmarks.launch import ROOT

# The result fields that fix the load the baselines were measured on.
LOAD_FIELDS = ("workload", "requests", "horizon_s", "sla", "gpu", "model", "interval_s", "startup_s", "load")
SUMMARY = ("attainment", "gpu_hours", "attainment_per_gpu_hour")
_GRID = re.compile(r"1\.\.(\d+)P x 1\.\.(\d+)D")


def static_splits(planner_gpu_hours: float | None, horizon_s: float) -> list[Counts]:
    """The fixed splits the static baseline tries: every split of the whole
    replica counts just under and over the planner's mean (4 without one)."""
    mean = planner_gpu_hours * 3600 / horizon_s if planner_gpu_hours is not None else 4.0
    counts = sorted({max(2, math.floor(mean)), max(2, math.ceil(mean))})
    return [(p, n - p) for n in counts for p in range(1, n)]


def split_name(split: Counts) -> str:
    return f"{split[0]}P+{split[1]}D"


def parse_split(name: str) -> Counts:
    p, d = name.rstrip("D").split("P+")
    return int(p), int(d)


def grid_name(top: Counts) -> str:
    return f"1..{top[0]}P x 1..{top[1]}D"


@dataclass(frozen=True)
class Baselines:
    """An earlier run's static and hindsight results, with where they came from."""

    path: str
    commit: str | None  # the last commit of `path` (None: not committed)
    static: Mapping[str, Any]  # results.static: the best split's full result, all tried under "tried"
    hindsight: Mapping[str, Any]  # results.hindsight
    load: Mapping[str, Any]  # LOAD_FIELDS of the earlier run

    @classmethod
    def read(cls, path: str | Path) -> Baselines:
        doc = json.loads(Path(path).read_text())
        results = doc.get("results", {})
        missing = [k for k in ("static", "hindsight") if k not in results]
        if missing:
            raise SystemExit(f"--baselines-from {path}: no {' or '.join(missing)} result to reuse")
        return cls(_shown(Path(path)), _commit(Path(path)), results["static"], results["hindsight"], _load(doc))

    def check_load(self, load: Mapping[str, Any]) -> None:
        """Stop unless `load` (this run's LOAD_FIELDS) is the earlier run's."""
        differ = [k for k in LOAD_FIELDS if _canonical(load[k]) != _canonical(self.load.get(k))]
        if differ:
            raise SystemExit(f"--baselines-from {self.path}: a different load ({', '.join(differ)} differ)")

    def check_code(self, rerun: Callable[[Counts], Mapping[str, Any]]) -> dict[str, Any]:
        """Run the earlier best static split again; stop unless it measures the same."""
        split = self.static["split"]
        now = rerun(parse_split(split))
        differ = [k for k in SUMMARY if now[k] != self.static[k]]
        if differ:
            raise SystemExit(
                f"--baselines-from {self.path}: static {split} now measures "
                + ", ".join(f"{k} {now[k]!r} (was {self.static[k]!r})" for k in differ)
                + ": the simulator changed since; run the baselines in full"
            )
        return {"split": split, **{k: now[k] for k in SUMMARY}}

    def static_result(
        self, splits: Sequence[Counts], run: Callable[[Sequence[Counts]], list[Mapping[str, Any]]]
    ) -> tuple[dict[str, Any], list[str]]:
        """The static baseline over `splits`: the earlier summaries where it
        tried a split, `run` for the rest; and the splits that ran now."""
        tried_then = self.static["tried"]
        new = [s for s in splits if split_name(s) not in tried_then]
        ran = {r["split"]: r for r in run(new)} if new else {}
        tried = {
            split_name(s): {k: (ran.get(split_name(s)) or tried_then[split_name(s)])[k] for k in SUMMARY}
            for s in splits
        }
        best_name = max(tried, key=lambda n: (tried[n]["attainment_per_gpu_hour"], tried[n]["attainment"]))
        if best_name in ran:
            best = dict(ran[best_name])
        elif best_name == self.static["split"]:
            best = {k: v for k, v in self.static.items() if k != "tried"}
        else:  # reused, but only its summary was kept: run it for the full result
            best = dict(run([parse_split(best_name)])[0])
            ran[best_name] = best
        return {**best, "tried": tried}, sorted(ran)

    def covers(self, top: Counts) -> bool:
        """Whether the earlier hindsight grid holds the grid 1..top."""
        match = _GRID.fullmatch(self.hindsight["grid"])
        if not match:
            raise SystemExit(f"--baselines-from {self.path}: hindsight grid {self.hindsight['grid']!r} unreadable")
        return top[0] <= int(match[1]) and top[1] <= int(match[2])


def _load(doc: Mapping[str, Any]) -> dict[str, Any]:
    return {k: doc.get(k) for k in LOAD_FIELDS}


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _shown(path: Path) -> str:
    """`path` as recorded: from the repository's root where it lies inside it."""
    return str(path.resolve().relative_to(ROOT)) if path.resolve().is_relative_to(ROOT) else str(path)


def _commit(path: Path) -> str | None:
    out = subprocess.run(
        ["git", "log", "-1", "--format=%H", "--", path.name], cwd=path.parent, capture_output=True, text=True
    )
    return out.stdout.strip() or None
