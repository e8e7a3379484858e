"""A tenant's tokens per minute: a bucket of `per_minute` tokens refilled continuously. Time is the caller's."""

from __future__ import annotations


class TokenBucket:
    def __init__(self, per_minute: int, now: float) -> None:
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0  # tokens a second
        self.level = self.capacity
        self.at = now

    def _refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now

    def wait_s(self, tokens: int, now: float) -> float:
        """Seconds until `tokens` may be taken (0: now). A charge over the capacity waits for a full bucket."""
        self._refill(now)
        need = min(float(tokens), self.capacity)
        return max(0.0, (need - self.level) / self.rate)

    def take(self, tokens: int, now: float) -> None:
        self._refill(now)
        self.level -= min(float(tokens), self.capacity)

    def give_back(self, tokens: int, now: float) -> None:
        self._refill(now)
        self.level = min(self.capacity, self.level + tokens)
