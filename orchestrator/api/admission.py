"""Admission control: a frontend replica runs at most `limit` engine streams at once (a request holds one per
prompt and choice: prompts × n) and turns the next request away at once (429 + Retry-After) instead of queueing
without bound. A request enters holding one stream while it is prepared, then widens to its streams; a slot is
held from admission until the response's last byte, streams included, so memory stays bounded by the limit."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.api.traffic_admission import ClassSlot


class AdmissionGate:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0  # engine streams held

    def try_enter(self, streams: int = 1) -> bool:
        if self.in_flight + streams > self.limit:
            return False
        self.in_flight += streams
        return True

    def leave(self, streams: int = 1) -> None:
        self.in_flight -= streams
        assert self.in_flight >= 0, "left more often than entered"


class Slot:
    """One admitted request's place in the gate; released exactly once."""

    def __init__(self, gate: AdmissionGate) -> None:
        self._gate = gate
        self._streams = 1
        self._held = True
        self._class_slot: ClassSlot | None = None

    def attach(self, class_slot: ClassSlot) -> None:
        """The request's hold on its SLO class (orchestrator/api/traffic_admission.py), released with this."""
        self._class_slot = class_slot

    def spent(self, tokens: int) -> None:
        """Tokens the request used (prompt + generated), for its tenant's charge."""
        if self._class_slot is not None:
            self._class_slot.spent(tokens)

    def widen(self, streams: int) -> bool:
        """Hold `streams` engine streams (at most the whole gate: a request larger than the limit runs alone);
        False, holding what it held, when the gate has no room for them now."""
        extra = min(streams, self._gate.limit) - self._streams
        if extra <= 0:
            return True
        if not self._gate.try_enter(extra):
            return False
        self._streams += extra
        return True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._gate.leave(self._streams)
            if self._class_slot is not None:
                self._class_slot.release()
