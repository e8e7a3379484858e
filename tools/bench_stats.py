"""Benchmark metrics, defined as vLLM's `bench serve` and AIPerf define them.

Per request (streamed):
  TTFT   send -> first chunk carrying output text
  ITL    gaps between consecutive chunks carrying output text
  TPOT   (E2E - TTFT) / (output tokens - 1), output tokens from the server's usage
  E2E    send -> last byte
Per run (completed requests only, over the run's wall time):
  request throughput = completed / duration
  output token throughput = sum(output tokens) / duration; total adds prompt tokens
  goodput = the same two throughputs counting only requests that meet every
            per-request SLO given (e.g. ttft_ms=500: TTFT <= 500 ms;
            itl_p50_ms=30: the request's median ITL <= 30 ms); without an SLO
            goodput equals throughput
  slo_attained: whether the run meets each SLO at the stated percentile over
            all its requests (ttft_p99_ms=500: the run's p99 TTFT <= 500 ms)
  prefix hit rate = cached prompt tokens / prompt tokens, as the responses'
            usage (prompt_tokens_details.cached_tokens) reports them
Percentiles are linear-interpolated (numpy's default), as both tools do.
Warm-up requests are not part of a run.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from tools.client import RequestRecord

PERCENTILES = (50, 90, 99)
_SLO_KEY = re.compile(r"^(ttft|itl|tpot|e2e)(?:_p(\d+))?_ms$")


@dataclass(frozen=True)
class SloTerm:
    metric: str  # ttft, itl, tpot, e2e
    percentile: int | None  # None: the request's own single value (or median ITL)
    limit_ms: float

    @property
    def key(self) -> str:
        return f"{self.metric}{'_p' + str(self.percentile) if self.percentile else ''}_ms"


def parse_slo(terms: list[str] | dict[str, float] | None) -> list[SloTerm]:
    """`["ttft_p99_ms=500", "itl_p50_ms=30"]` or `{"ttft_ms": 500}`."""
    if not terms:
        return []
    items = terms.items() if isinstance(terms, dict) else (t.split("=", 1) for t in terms)
    out = []
    for key, value in items:
        m = _SLO_KEY.match(key.strip())
        if not m:
            raise ValueError(f"unknown SLO term {key!r}: use ttft|itl|tpot|e2e[_pNN]_ms=<limit>")
        out.append(SloTerm(m.group(1), int(m.group(2)) if m.group(2) else None, float(value)))
    return out


def percentiles(values: list[float] | np.ndarray, scale: float = 1000.0) -> dict[str, float | None]:
    """p50/p90/p99 and mean, in ms for inputs in seconds (scale 1000)."""
    if len(values) == 0:
        return {**{f"p{p}": None for p in PERCENTILES}, "mean": None}
    a = np.asarray(values, dtype=float) * scale
    return {**{f"p{p}": float(np.percentile(a, p)) for p in PERCENTILES}, "mean": float(a.mean())}


def tpot_s(r: RequestRecord) -> float | None:
    if r.ttft_s is None or r.e2e_s is None or r.output_tokens < 2:
        return None
    return (r.e2e_s - r.ttft_s) / (r.output_tokens - 1)


def _request_value(r: RequestRecord, term: SloTerm) -> float | None:
    """The request's own value for an SLO term, in seconds."""
    if term.metric == "ttft":
        return r.ttft_s
    if term.metric == "e2e":
        return r.e2e_s
    if term.metric == "tpot":
        return tpot_s(r)
    if not r.itl_s:
        return 0.0  # one output chunk: no gap to miss
    return float(np.percentile(r.itl_s, term.percentile or 50))


def meets_slo(r: RequestRecord, slo: list[SloTerm]) -> bool:
    if not r.ok:
        return False
    for term in slo:
        value = _request_value(r, term)
        if value is None or value * 1000.0 > term.limit_ms:
            return False
    return True


@dataclass
class RunResult:
    duration_s: float
    sent: int
    completed: int
    failed: int
    errors: dict[str, int]
    prompt_tokens: int
    output_tokens: int
    request_throughput: float
    output_token_throughput: float
    total_token_throughput: float
    goodput_requests: float
    goodput_output_tokens: float
    ttft_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    tpot_ms: dict[str, float | None]
    e2e_ms: dict[str, float | None]
    slo_attained: dict[str, bool] = field(default_factory=dict)
    # Cached prompt tokens / prompt tokens, from the responses' usage; None
    # when the server does not report cached tokens.
    prefix_hit_rate: float | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def summarize(records: list[RequestRecord], duration_s: float, slo: list[SloTerm]) -> RunResult:
    ok = [r for r in records if r.ok]
    good = [r for r in ok if meets_slo(r, slo)]
    ttft = [r.ttft_s for r in ok]
    itl = [x for r in ok for x in r.itl_s]
    tpot = [t for t in map(tpot_s, ok) if t is not None]
    e2e = [r.e2e_s for r in ok]
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    output_tokens = sum(r.output_tokens for r in ok)
    samples = {"ttft": ttft, "itl": itl, "tpot": tpot, "e2e": e2e}
    attained = {}
    for term in slo:
        values = samples[term.metric]
        stat = float(np.percentile(values, term.percentile or 50)) * 1000.0 if values else None
        attained[term.key] = stat is not None and stat <= term.limit_ms
    d = max(duration_s, 1e-9)
    return RunResult(
        duration_s=duration_s,
        sent=len(records),
        completed=len(ok),
        failed=len(records) - len(ok),
        errors=dict(Counter(r.error or "unknown" for r in records if not r.ok)),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        request_throughput=len(ok) / d,
        output_token_throughput=output_tokens / d,
        total_token_throughput=(prompt_tokens + output_tokens) / d,
        goodput_requests=len(good) / d,
        goodput_output_tokens=sum(r.output_tokens for r in good) / d,
        ttft_ms=percentiles(ttft),
        itl_ms=percentiles(itl),
        tpot_ms=percentiles(tpot),
        e2e_ms=percentiles(e2e),
        slo_attained=attained,
        prefix_hit_rate=_hit_rate(ok),
    )


def _hit_rate(records: list[RequestRecord]) -> float | None:
    reported = [r for r in records if r.cached_tokens is not None]
    prompt = sum(r.prompt_tokens for r in reported)
    if not reported or not prompt:
        return None
    return sum(r.cached_tokens for r in reported) / prompt


def find_knee(points: list[tuple[float, float]], fraction: float = 0.95) -> float | None:
    """The knee of a goodput (or throughput) curve over concurrency: the
    smallest concurrency reaching `fraction` of the best value seen."""
    if not points:
        return None
    best = max(v for _, v in points)
    if best <= 0:
        return None
    return min(c for c, v in points if v >= fraction * best)


def past_the_knee(points: list[tuple[float, float]]) -> bool:
    """A sweep can stop once goodput has fallen below half its best."""
    if len(points) < 2:
        return False
    best = max(v for _, v in points)
    return best > 0 and points[-1][1] < 0.5 * best
