"""One headline result: what was measured, the figures, the committed JSON they come from and its date."""

from __future__ import annotations

import functools
import json
import math
import statistics
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from benchmarks.launch import RESULTS, ROOT


@dataclass(frozen=True)
class Target:
    """A target the row's JSON is held to: `name` (as the issue states it) and whether the figures meet it."""

    name: str
    met: bool

    def text(self) -> str:
        return f"{self.name}: {'met' if self.met else 'missed'}"


@dataclass(frozen=True)
class Row:
    """One line of the summary: its cells are what, result, the sources with their run dates, and the targets."""

    what: str
    result: str
    sources: tuple[str, ...]  # paths under benchmarks/results/
    targets: tuple[Target, ...] = ()

    def cells(self) -> tuple[str, str, str, str]:
        sources = ", ".join(f"`{s}`" for s in self.sources)
        dates = sorted({run_date(s) for s in self.sources})
        targets = "; ".join(t.text() for t in self.targets) or "—"
        return self.what, self.result, f"{sources} ({', '.join(dates)})", targets


@functools.cache
def load(source: str) -> Any:
    """A committed result document, by its path under benchmarks/results/."""
    return json.loads((RESULTS / source).read_text())


@functools.cache
def run_date(source: str) -> str:
    """The run's date: the document's own `date` where it records one, else the day its file was last
    committed (YYYY-MM-DD); a file not yet committed is dated by its modification time."""
    doc = load(source)
    if isinstance(doc, dict) and isinstance(doc.get("date"), str):
        return doc["date"][:10]
    path = RESULTS / source
    out = subprocess.run(
        ["git", "log", "-1", "--format=%cs", "--", str(path)], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.strip()
    if out:
        return out
    import datetime

    return datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.UTC).date().isoformat()


def ratio(a: float, b: float) -> str:
    """a / b as "×1.23"."""
    return f"×{a / b:.2f}"


def span(values: Iterable[float], fmt: str = "{:.1f}") -> str:
    """`values` as "lo–hi" ("lo to hi" where lo is negative), or the one value."""
    vs = sorted(values)
    lo, hi = fmt.format(vs[0]), fmt.format(vs[-1])
    if lo == hi:
        return lo
    return f"{lo} to {hi}" if vs[0] < 0 else f"{lo}–{hi}"


def geomean(values: Iterable[float]) -> float:
    vs = list(values)
    return math.exp(statistics.fmean(math.log(v) for v in vs))
