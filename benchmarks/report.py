"""What an experiment writes: its result document as JSON (under benchmarks/results/ by default), a markdown
table of it and plots. The markdown table writer and the plot set-up are the tools' own (tools/report.py), so
that `orchestrator bench` and the experiments write tables one way.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.report import pyplot, save_figure, table

__all__ = [
    "document",
    "hit_rate",
    "latency_cells",
    "machine",
    "median_over",
    "percent",
    "pyplot",
    "save_figure",
    "table",
    "write",
    "write_json",
]


def document(benchmark: str, version: int, **fields: Any) -> dict[str, Any]:
    """A result document's head: what ran it (name, schema version, the run's UTC date, the machine), then
    `fields`."""
    import datetime

    from tools.bench import hardware

    date = datetime.datetime.now(datetime.UTC).date().isoformat()
    return {"benchmark": benchmark, "version": version, "date": date, "hardware": hardware(), **fields}


def write_json(path: str | Path, doc: Any, indent: int = 2) -> Path:
    """`doc` as JSON at `path` (its folder made if missing), ending with a newline."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=indent) + "\n")
    return path


def write(
    out: str | Path,
    doc: dict,
    markdown: Callable[[dict], str] | None = None,
    plot: Callable[[dict, Path], None] | None = None,
    echo: bool = True,
) -> str | None:
    """A run's results: `doc` as JSON at `out`, `markdown(doc)` beside it (.md; printed with `echo`) and
    `plot(doc, path)` beside it (.png). Returns the markdown."""
    out = write_json(out, doc)
    text = markdown(doc) if markdown else None
    if text is not None:
        out.with_suffix(".md").write_text(text)
    if plot:
        plot(doc, out.with_suffix(".png"))
    if text is not None and echo:
        print(text)
    return text


def median_over(runs: list[dict], *keys: str) -> float | None:
    """The median of `runs[i][keys[0]][keys[1]]...` over the runs that have it; None where none does."""
    values = []
    for r in runs:
        v = r
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        if v is not None:
            values.append(v)
    return float(statistics.median(values)) if values else None


def percent(x: float | None, signed: bool = False) -> str:
    """A fraction as a whole percentage ('12%', signed '+12%'); '-' for None."""
    return "-" if x is None else f"{x * 100:{'+' if signed else ''}.0f}%"


def machine() -> dict[str, Any]:
    """This machine as the result documents record it."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()}


def latency_cells(r: dict) -> list[str]:
    """A summary's TTFT p50 / p99 and ITL p50 (ms), as table cells."""
    return [f"{r['ttft_ms']['p50']:.1f}", f"{r['ttft_ms']['p99']:.1f}", f"{r['itl_ms']['p50']:.2f}"]


def hit_rate(r: dict) -> str:
    """A summary's prefix hit rate as a cell ('-' where the engines report none)."""
    return "-" if r.get("prefix_hit_rate") is None else f"{r['prefix_hit_rate']:.1%}"
