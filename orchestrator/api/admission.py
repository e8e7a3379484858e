"""Admission control: a frontend replica serves at most `limit` requests at
once and turns the next away at once (429 + Retry-After) instead of queueing
without bound. A slot is held from admission until the response's last byte,
streams included, so memory stays bounded by the limit."""

from __future__ import annotations


class AdmissionGate:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def try_enter(self) -> bool:
        if self.in_flight >= self.limit:
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        self.in_flight -= 1
        assert self.in_flight >= 0, "left more often than entered"


class Slot:
    """One admitted request's place in the gate; released exactly once."""

    def __init__(self, gate: AdmissionGate) -> None:
        self._gate = gate
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._gate.leave()
