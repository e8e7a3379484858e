"""The class gate (orchestrator/traffic/gate.py) in the event loop: a queued request waits on a future that
a departure, the gate's next event (a deadline, a contention window lapsing) or its own arrival (it may fit
where the queue's head does not) settles; every decision counted by class and tenant.

    enter(resolved, streams, tokens) -> ClassSlot   (429 in OpenAI's shape, Retry-After, when refused)
    ClassSlot.spent(tokens); ClassSlot.release()     (the unused charge refunded; queued requests admitted)
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from orchestrator.api.errors import APIError
from orchestrator.metrics import FrontendMetrics
from orchestrator.traffic.gate import ClassGate, Outcome, Reason, Ticket
from orchestrator.traffic.policy import Resolved, TrafficPolicy


class ClassSlot:
    """An admitted request's hold on its class; released exactly once."""

    def __init__(self, admission: TrafficAdmission, ticket: Ticket) -> None:
        self._admission = admission
        self._ticket = ticket
        self._spent: int | None = None
        self._held = True

    def spent(self, tokens: int) -> None:
        """What the request used of its charge (prompt + generated); unknown, nothing is refunded."""
        self._spent = tokens

    def release(self) -> None:
        if self._held:
            self._held = False
            unused = self._ticket.tokens - self._spent if self._spent is not None else 0
            self._admission.leave(self._ticket, max(0, unused))


class TrafficAdmission:
    def __init__(
        self,
        policy: TrafficPolicy,
        metrics: FrontendMetrics,
        retry_after_s: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.gate = ClassGate(policy)
        self.metrics = metrics
        self.retry_after_s = retry_after_s
        self.clock = clock
        self._waiters: dict[Ticket, asyncio.Future[Reason | None]] = {}
        self._timer: asyncio.TimerHandle | None = None

    async def enter(self, resolved: Resolved, streams: int, tokens: int) -> ClassSlot:
        ticket = Ticket(resolved.cls, resolved.tenant, streams, tokens)
        decision = self.gate.offer(ticket, self.clock())
        if decision.outcome is Outcome.REJECTED:
            raise self._refusal(ticket, decision.reason, decision.retry_after_s)
        self._count(ticket, decision.outcome.value)
        if decision.outcome is Outcome.ADMITTED:
            self._streams_changed(ticket)
            return ClassSlot(self, ticket)
        return await self._wait(ticket)

    async def _wait(self, ticket: Ticket) -> ClassSlot:
        waiter: asyncio.Future[Reason | None] = asyncio.get_running_loop().create_future()
        self._waiters[ticket] = waiter
        queued_at = self.clock()
        self._settle(self.gate.drain(queued_at))
        self._arm()
        try:
            reason = await waiter
        except asyncio.CancelledError:  # the client went away while queued
            if self._waiters.pop(ticket, None) is not None:  # still queued
                self._settle(self.gate.withdraw(ticket, self.clock()))
            elif waiter.done() and not waiter.cancelled() and waiter.result() is None:  # admitted as it went
                self.leave(ticket, ticket.tokens)
            raise
        self.metrics.class_queue_seconds.labels(ticket.cls.name).observe(self.clock() - queued_at)
        if reason is not None:
            raise self._refusal(ticket, reason, None)
        self._count(ticket, "dequeued")
        return ClassSlot(self, ticket)

    def leave(self, ticket: Ticket, unused_tokens: int) -> None:
        self._settle(self.gate.leave(ticket, self.clock(), unused_tokens))
        self._streams_changed(ticket)

    def _settle(self, admitted: list[Ticket]) -> None:
        for t in admitted:
            waiter = self._waiters.pop(t, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
            self._streams_changed(t)

    def _arm(self) -> None:
        """One timer, at the gate's next event."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        now = self.clock()
        deadline = self.gate.next_event(now)
        if deadline is not None:
            delay = max(0.0, deadline - now)
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        now = self.clock()
        for t in self.gate.expire(now):
            waiter = self._waiters.pop(t, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(Reason.QUEUE_DEADLINE)
        self._settle(self.gate.drain(now))
        self._arm()

    def _streams_changed(self, t: Ticket) -> None:
        self.metrics.class_streams.labels(t.cls.name).set(self.gate.class_streams[t.cls.name])

    def _count(self, t: Ticket, decision: str) -> None:
        self.metrics.class_decisions.labels(t.cls.name, t.tenant.name, decision).inc()

    def _refusal(self, t: Ticket, reason: Reason | None, retry_after_s: float | None) -> APIError:
        why = reason.value if reason is not None else "refused"
        self._count(t, why)
        wait = math.ceil(retry_after_s) if retry_after_s is not None else self.retry_after_s
        message = {
            Reason.TENANT_IN_FLIGHT: "This API key has its most requests in flight; retry later.",
            Reason.TENANT_TOKENS: "This API key has spent its tokens per minute; retry later.",
            Reason.CLASS_FULL: f"SLO class {t.cls.name!r} is at capacity; retry later.",
            Reason.QUEUE_DEADLINE: f"SLO class {t.cls.name!r} had no room within its queue wait; retry later.",
        }.get(reason, "The server is at capacity; retry later.")
        return APIError(
            429,
            message,
            type="requests",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(max(1, wait))},
        )
