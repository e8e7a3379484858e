"""What a pool replica saw over the last window, as plain numbers: the
planner's observations come from the replicas themselves (Ray Serve's custom
autoscaling metrics carry these snapshots to the controller), not from an
external Prometheus.

Per replica, over the last `span_s` seconds:
  arrivals/s, mean prompt tokens, mean output tokens (of requests finished),
  prompt tokens found in the local prefix cache, p99 time to first token at
  the replica, median gap between its tokens, requests waiting in its engine.
A latency with no sample in the window is reported as -1 (metrics are floats).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

MISSING = -1.0


class ReplicaLoadWindow:
    def __init__(self, span_s: float, clock: Callable[[], float] = time.monotonic, max_samples: int = 100_000) -> None:
        self.span_s = span_s
        self._clock = clock
        self._arrivals: deque[tuple[float, int]] = deque(maxlen=max_samples)  # (t, prompt tokens)
        self._finished: deque[tuple[float, int, int, float]] = deque(maxlen=max_samples)  # (t, out, cached, first)
        self._gaps: deque[tuple[float, float]] = deque(maxlen=max_samples)  # (t, seconds between tokens)

    def arrived(self, prompt_tokens: int) -> None:
        self._arrivals.append((self._clock(), prompt_tokens))

    def token_gap(self, seconds: float) -> None:
        self._gaps.append((self._clock(), seconds))

    def finished(self, output_tokens: int, cached_tokens: int, first_token_s: float | None) -> None:
        self._finished.append((self._clock(), output_tokens, cached_tokens,
                               MISSING if first_token_s is None else first_token_s))

    def snapshot(self, waiting: int = 0) -> dict[str, float]:
        since = self._clock() - self.span_s
        arrivals = [p for t, p in self._arrivals if t >= since]
        finished = [(o, c, f) for t, o, c, f in self._finished if t >= since]
        gaps = [g for t, g in self._gaps if t >= since]
        firsts = [f for _, _, f in finished if f >= 0]
        prompt = sum(arrivals)
        return {
            "arrival_rate": len(arrivals) / self.span_s,
            "mean_isl": prompt / len(arrivals) if arrivals else 0.0,
            "mean_osl": float(np.mean([o for o, _, _ in finished])) if finished else 0.0,
            "prompt_tokens": float(prompt),
            "cached_tokens": float(sum(c for _, c, _ in finished)),
            "first_token_p99_s": float(np.quantile(firsts, 0.99)) if firsts else MISSING,
            "itl_p50_s": float(np.median(gaps)) if gaps else MISSING,
            "waiting": float(waiting),
        }
