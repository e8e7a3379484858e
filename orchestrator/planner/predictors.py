"""Next-interval load predictors: each sees one value per interval
(`observe`) and says what it expects `steps` intervals ahead (`predict`;
1: the next interval). None until it has seen anything."""

from __future__ import annotations

from collections import deque
from typing import Protocol

import numpy as np


class Predictor(Protocol):
    def observe(self, value: float) -> None: ...

    def predict(self, steps: int = 1) -> float | None: ...


class ConstantPredictor:
    """The next interval looks like the last one."""

    def __init__(self) -> None:
        self._last: float | None = None

    def observe(self, value: float) -> None:
        self._last = value

    def predict(self, steps: int = 1) -> float | None:
        return self._last


class MovingAveragePredictor:
    def __init__(self, window: int = 5) -> None:
        self._values: deque[float] = deque(maxlen=window)

    def observe(self, value: float) -> None:
        self._values.append(value)

    def predict(self, steps: int = 1) -> float | None:
        return float(np.mean(self._values)) if self._values else None


class KalmanTrendPredictor:
    """A local linear trend model (level + slope) filtered by a Kalman filter:
    follows ramps without the lag of a moving average and smooths noise.
    `process_var` / `measurement_var` set how fast it believes a change.

    `damping` (phi, in (0, 1]) damps the trend over the horizon, as in
    Gardner and McKenzie's damped-trend smoothing: `steps` ahead is
    level + (phi + phi^2 + ... + phi^steps) x slope. 1: a straight line. A
    slope filtered from a few noisy intervals is itself noisy, and a
    straight line carries its error (and any ramp that is about to turn)
    `steps` times over; damped trends forecast better at longer horizons,
    with phi usually fitted in [0.8, 0.98]."""

    def __init__(self, process_var: float = 0.05, measurement_var: float = 1.0, damping: float = 1.0) -> None:
        if not 0 < damping <= 1:
            raise ValueError(f"damping must be in (0, 1], not {damping}")
        self._phi = damping
        self._F = np.array([[1.0, 1.0], [0.0, 1.0]])
        self._H = np.array([[1.0, 0.0]])
        self._q, self._r = process_var, measurement_var
        self._x: np.ndarray | None = None
        self._P = np.eye(2) * 1e3

    def observe(self, value: float) -> None:
        if self._x is None:
            self._x = np.array([value, 0.0])
            return
        scale = max(abs(value), 1.0) ** 2  # variances relative to the level, so units do not matter
        Q, R = np.eye(2) * self._q * scale, self._r * scale * 0.1
        x = self._F @ self._x
        P = self._F @ self._P @ self._F.T + Q
        y = value - (self._H @ x)[0]
        S = (self._H @ P @ self._H.T)[0, 0] + R
        K = (P @ self._H.T)[:, 0] / S
        self._x = x + K * y
        self._P = (np.eye(2) - np.outer(K, self._H[0])) @ P

    def predict(self, steps: int = 1) -> float | None:
        """The level `steps` intervals on along the filtered (damped) trend."""
        if self._x is None:
            return None
        level, slope = self._x
        trend = steps if self._phi == 1 else sum(self._phi**k for k in range(1, steps + 1))
        return max(float(level + trend * slope), 0.0)


class SeasonalPredictor:
    """The value one period before the predicted interval, scaled by how the
    recent level compares with the level then (seasonal naive with drift);
    falls back to a moving average until it has two periods of history."""

    def __init__(self, period: int, window: int = 3) -> None:
        self.period = period
        self.window = window
        self._history: deque[float] = deque(maxlen=2 * period + 1)
        self._fallback = MovingAveragePredictor(window)

    def observe(self, value: float) -> None:
        self._history.append(value)
        self._fallback.observe(value)

    def predict(self, steps: int = 1) -> float | None:
        h = list(self._history)
        if len(h) < 2 * self.period:
            return self._fallback.predict()
        n = len(h)
        recent = np.mean(h[n - self.window :])
        then = np.mean(h[n - self.period - self.window : n - self.period])
        ratio = recent / then if then > 0 else 1.0
        back = n - self.period + (steps - 1) % self.period
        return max(float(h[back] * ratio), 0.0)


def make_predictor(kind: str, **kwargs) -> Predictor:
    kinds = {
        "constant": ConstantPredictor,
        "moving_average": MovingAveragePredictor,
        "kalman": KalmanTrendPredictor,
        "seasonal": SeasonalPredictor,
    }
    if kind not in kinds:
        raise ValueError(f"unknown predictor {kind!r}; one of {sorted(kinds)}")
    return kinds[kind](**kwargs)
