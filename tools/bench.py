"""`orchestrator bench`: one versioned result per run.

    concurrency sweep   run each concurrency (e.g. 1,4,8,16,32,48,64) on fresh
                        requests; keep going past the list, x1.5 at a time, until
                        goodput falls below half its best (or --max-concurrency);
                        report the knee
    rate                Poisson arrivals at a fixed request rate
    trace               a trace's own schedule, time- and rate-scaled

The JSON carries what a reproducible result needs: harness and version,
system (label, model, precision, engine and version), hardware, dataset,
load, SLO, the sweep and the results at the knee.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from tools.bench_stats import RunResult, SloTerm, find_knee, past_the_knee, summarize
from tools.runner import Target, poisson_offsets, run_concurrency, run_schedule
from tools.workloads import RequestSpec, replay_offsets

SCHEMA = "orchestrator-bench/1"
DEFAULT_CONCURRENCY = (1, 4, 8, 16, 32, 48, 64)

_PCTS = {
    "type": "object",
    "required": ["p50", "p90", "p99", "mean"],
    "properties": {k: {"type": ["number", "null"]} for k in ("p50", "p90", "p99", "mean")},
}
_RUN = {
    "type": "object",
    "required": [
        "duration_s",
        "sent",
        "completed",
        "failed",
        "errors",
        "prompt_tokens",
        "output_tokens",
        "request_throughput",
        "output_token_throughput",
        "total_token_throughput",
        "goodput_requests",
        "goodput_output_tokens",
        "ttft_ms",
        "itl_ms",
        "tpot_ms",
        "e2e_ms",
        "slo_attained",
        "prefix_hit_rate",
    ],
    "properties": {
        "ttft_ms": _PCTS,
        "itl_ms": _PCTS,
        "tpot_ms": _PCTS,
        "e2e_ms": _PCTS,
        "sent": {"type": "integer"},
        "completed": {"type": "integer"},
        "failed": {"type": "integer"},
    },
}
# JSON Schema of a result document (checked by the tests).
RESULT_SCHEMA = {
    "type": "object",
    "required": ["schema", "harness", "started_at", "system", "hardware", "dataset", "load", "slo", "sweep", "knee"],
    "properties": {
        "schema": {"const": SCHEMA},
        "harness": {"type": "object", "required": ["name", "version"]},
        "system": {"type": "object", "required": ["label", "model", "precision", "engine", "engine_version"]},
        "hardware": {"type": "object", "required": ["cpu", "cores", "gpu"]},
        "dataset": {"type": "object", "required": ["kind"]},
        "load": {"type": "object", "required": ["mode"]},
        "slo": {"type": "object", "additionalProperties": {"type": "number"}},
        "sweep": {
            "type": "array",
            "minItems": 1,
            "items": {"allOf": [_RUN, {"type": "object", "required": ["concurrency"]}]},
        },
        "knee": {"oneOf": [{"type": "null"}, {"allOf": [_RUN, {"type": "object", "required": ["concurrency"]}]}]},
    },
}


def harness_version() -> str:
    try:
        return version("ray-disagg-orchestrator")
    except PackageNotFoundError:
        return "unknown"


def hardware() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "gpu": os.environ.get("BENCH_GPU") or None,
        "platform": platform.platform(),
    }


@dataclass
class SystemInfo:
    label: str
    model: str
    precision: str = "unknown"
    engine: str = "unknown"
    engine_version: str = "unknown"
    notes: str = ""


@dataclass
class SweepPoint:
    concurrency: float
    result: RunResult


@dataclass
class BenchRun:
    system: SystemInfo
    dataset: dict[str, Any]
    load: dict[str, Any]
    slo: list[SloTerm]
    points: list[SweepPoint] = field(default_factory=list)
    started_at: float = field(default_factory=time.time)

    def knee(self) -> SweepPoint | None:
        at = find_knee([(p.concurrency, p.result.goodput_requests) for p in self.points])
        return next((p for p in self.points if p.concurrency == at), None)

    def to_dict(self) -> dict[str, Any]:
        knee = self.knee()
        return {
            "schema": SCHEMA,
            "harness": {"name": "orchestrator bench", "version": harness_version()},
            "started_at": self.started_at,
            "system": self.system.__dict__,
            "hardware": hardware(),
            "dataset": self.dataset,
            "load": self.load,
            "slo": {t.key: t.limit_ms for t in self.slo},
            "sweep": [{"concurrency": p.concurrency, **p.result.to_dict()} for p in self.points],
            "knee": None if knee is None else {"concurrency": knee.concurrency, **knee.result.to_dict()},
        }


async def sweep(
    target: Target,
    make_requests: Callable[[int, int], Sequence[RequestSpec]],
    concurrencies: Sequence[int],
    requests_per_point: Callable[[int], int],
    slo: list[SloTerm],
    max_concurrency: int,
    on_point: Callable[[SweepPoint], None] = lambda p: None,
    progress: Callable[[int], Callable[[], None]] = lambda n: lambda: None,
) -> list[SweepPoint]:
    """A concurrency sweep against a server. `make_requests(n, offset)` gives n
    fresh requests (offset: how many came before)."""

    async def run_point(concurrency: int, specs: Sequence[RequestSpec]) -> RunResult:
        records, duration = await run_concurrency(target, specs, concurrency, progress(len(specs)))
        return summarize(records, duration, slo)

    return await sweep_with(run_point, make_requests, concurrencies, requests_per_point, max_concurrency, on_point)


async def sweep_with(
    run_point: Callable[[int, Sequence[RequestSpec]], Awaitable[RunResult]],
    make_requests: Callable[[int, int], Sequence[RequestSpec]],
    concurrencies: Sequence[int],
    requests_per_point: Callable[[int], int],
    max_concurrency: int,
    on_point: Callable[[SweepPoint], None] = lambda p: None,
) -> list[SweepPoint]:
    """The sweep itself, whatever runs a point (a server, the simulator): the
    levels given, then x1.5 past the last one until goodput falls below half
    its best or `max_concurrency` is reached."""
    points: list[SweepPoint] = []
    levels = list(concurrencies)
    used = 0
    i = 0
    while i < len(levels):
        c = levels[i]
        n = requests_per_point(c)
        specs = make_requests(n, used)
        used += n
        point = SweepPoint(c, await run_point(c, specs))
        points.append(point)
        on_point(point)
        curve = [(p.concurrency, p.result.goodput_requests) for p in points]
        if past_the_knee(curve):
            break
        if i == len(levels) - 1 and c < max_concurrency:
            levels.append(min(max_concurrency, int(c * 1.5)))
        i += 1
    return points


async def run_rate(
    target: Target,
    specs: Sequence[RequestSpec],
    rate: float,
    slo: list[SloTerm],
    seed: int,
    progress: Callable[[], None] = lambda: None,
) -> RunResult:
    records, duration = await run_schedule(target, specs, poisson_offsets(len(specs), rate, seed), progress)
    return summarize(records, duration, slo)


async def run_trace(
    target: Target,
    specs: Sequence[RequestSpec],
    time_scale: float,
    rate_scale: float,
    slo: list[SloTerm],
    progress: Callable[[], None] = lambda: None,
) -> RunResult:
    records, duration = await run_schedule(target, specs, replay_offsets(list(specs), time_scale, rate_scale), progress)
    return summarize(records, duration, slo)


async def warm_up(target: Target, specs: Sequence[RequestSpec]) -> None:
    """Requests whose results are thrown away (engine warm-up, connection setup)."""
    if specs:
        await run_concurrency(target, specs, min(4, len(specs)))


def write_outputs(run: BenchRun, out: str | Path) -> dict[str, Path]:
    """The JSON, a markdown table next to it, and a PNG plot for sweeps."""
    from tools.report import markdown_table, plot_sweep

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = run.to_dict()
    out.write_text(json.dumps(doc, indent=2) + "\n")
    paths = {"json": out}
    md = out.with_suffix(".md")
    md.write_text(markdown_table(doc))
    paths["markdown"] = md
    if len(run.points) > 1:
        png = out.with_suffix(".png")
        plot_sweep([doc], png)
        paths["plot"] = png
    return paths


def run_async(coro):
    return asyncio.run(coro)
