"""Admission by class and tenant, in one frontend replica: events in, decisions out, no clock of its own.

    offer(ticket):
      the tenant at max_in_flight, or its tokens a minute spent  -> REJECTED (Retry-After: when it refills)
      its class has queued requests, or no room for it now:
        a queue with room, the tenant within its share of it     -> QUEUED (until room, or its deadline)
        else                                                     -> REJECTED at once
      else                                                       -> ADMITTED
    room for a ticket of tenant T in class C:
      C's streams + the ticket's <= C.max_streams, and
      beyond T's weighted share of C.max_streams among C's active tenants, the room the others' shares
      still need stays free (a flooding tenant cannot take what a quieter one is owed)
    drain(now): queued tickets admitted where room is, the classes that run first first; within a class
      the tenant served the fewest tokens per weight first (virtual token counter), then the earliest
      deadline. leave and withdraw drain; the caller drains after a ticket queues (it may fit past a head
      that does not) and at `next_event` (a deadline, or a tenant's contention window lapsing, which
      frees the share it was owed)

A class's `max_streams` is what it may hold; what it may not is kept for the others: classes with a
lower cap are shed first under pressure. Streams are engine streams (prompts x n)."""

from __future__ import annotations

import enum
import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field

from orchestrator.traffic.policy import RequestClass, Tenant, TrafficPolicy
from orchestrator.traffic.token_bucket import TokenBucket


class Outcome(enum.Enum):
    ADMITTED = "admitted"
    QUEUED = "queued"
    REJECTED = "rejected"


class Reason(str, enum.Enum):
    TENANT_IN_FLIGHT = "tenant_in_flight"
    TENANT_TOKENS = "tenant_tokens"
    CLASS_FULL = "class_full"  # no room and no queue (or a full one)
    QUEUE_DEADLINE = "queue_deadline"  # waited its class's queue_wait_s


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    reason: Reason | None = None
    retry_after_s: float | None = None  # a rejection's: None for the frontend's default


@dataclass(eq=False)
class Ticket:
    cls: RequestClass
    tenant: Tenant
    streams: int
    tokens: int  # charged to the tenant: prompt + max_tokens of every stream
    deadline: float = 0.0  # set when queued
    seq: int = field(default=0)


class ClassGate:
    def __init__(self, policy: TrafficPolicy) -> None:
        self.policy = policy
        self.class_streams: dict[str, int] = defaultdict(int)
        self.held: dict[tuple[str, str], int] = defaultdict(int)  # (class, tenant) -> streams
        self.tenant_requests: dict[str, int] = defaultdict(int)  # admitted and queued
        self.served: dict[tuple[str, str], float] = defaultdict(float)  # (class, tenant) -> tokens / weight
        self.last_seen: dict[tuple[str, str], float] = {}
        self.queues: dict[str, list[Ticket]] = {c.name: [] for c in policy.classes.values()}
        self.buckets: dict[str, TokenBucket] = {}
        self._seq = itertools.count()

    # -- events -------------------------------------------------------------------

    def offer(self, t: Ticket, now: float) -> Decision:
        c, tn = t.cls.name, t.tenant.name
        self.last_seen[(c, tn)] = now
        if t.tenant.max_in_flight is not None and self.tenant_requests[tn] >= t.tenant.max_in_flight:
            return Decision(Outcome.REJECTED, Reason.TENANT_IN_FLIGHT)
        bucket = self._bucket(t.tenant, now)
        if bucket is not None:
            wait = bucket.wait_s(t.tokens, now)
            if wait > 0:
                return Decision(Outcome.REJECTED, Reason.TENANT_TOKENS, wait)
        queue = self.queues[c]
        if not queue and self._fits(t, now):
            self._charge(t, now)
            self._hold(t)
            return Decision(Outcome.ADMITTED)
        if len(queue) < t.cls.queue_size and self._may_queue(t, now):
            self._lift(t)
            self._charge(t, now)
            t.seq, t.deadline = next(self._seq), now + t.cls.queue_wait_s
            queue.append(t)
            return Decision(Outcome.QUEUED)
        return Decision(Outcome.REJECTED, Reason.CLASS_FULL)

    def leave(self, t: Ticket, now: float, unused_tokens: int = 0) -> list[Ticket]:
        """An admitted ticket's request ended, `unused_tokens` of its charge not spent; the tickets this admits."""
        c, tn = t.cls.name, t.tenant.name
        self.class_streams[c] -= t.streams
        self.held[(c, tn)] -= t.streams
        self.tenant_requests[tn] -= 1
        assert self.class_streams[c] >= 0 and self.tenant_requests[tn] >= 0, "left more often than admitted"
        if unused_tokens > 0:
            self._refund(t, unused_tokens, now, served=True)
        return self.drain(now)

    def withdraw(self, t: Ticket, now: float) -> list[Ticket]:
        """A queued ticket whose client went away; the tickets this admits."""
        queue = self.queues[t.cls.name]
        if t in queue:
            queue.remove(t)
            self.tenant_requests[t.tenant.name] -= 1
            self._refund(t, t.tokens, now)
        return self.drain(now)

    def expire(self, now: float) -> list[Ticket]:
        """Queued tickets past their deadline, taken out (each is a 429 with Retry-After)."""
        gone = []
        for queue in self.queues.values():
            for t in [t for t in queue if t.deadline <= now]:
                queue.remove(t)
                self.tenant_requests[t.tenant.name] -= 1
                self._refund(t, t.tokens, now)
                gone.append(t)
        return gone

    def next_event(self, now: float) -> float | None:
        """When the queues may next change without a request coming or going: the earliest queued deadline,
        or the earliest lapse after `now` of a contention window that holds room for a tenant of a class with
        a queue (None: nothing queued)."""
        queued = {c for c, q in self.queues.items() if q}
        if not queued:
            return None
        deadlines = [t.deadline for c in queued for t in self.queues[c]]
        window = self.policy.contention_window_s
        lapses = [seen + window for (c, _), seen in self.last_seen.items() if c in queued and seen + window > now]
        return min(deadlines + lapses)

    # -- rules --------------------------------------------------------------------

    def _fits(self, t: Ticket, now: float) -> bool:
        c = t.cls
        streams = min(t.streams, c.max_streams)  # a request wider than its class runs alone
        after = self.class_streams[c.name] + streams
        if after > c.max_streams:
            return False
        active = self._active(c.name, t.tenant.name, now)
        if len(active) == 1:
            return True
        weights = sum(self.policy.tenants[tn].weight for tn in active)
        share = {tn: c.max_streams * self.policy.tenants[tn].weight / weights for tn in active}
        if self.held[(c.name, t.tenant.name)] + streams <= share[t.tenant.name]:
            return True
        # What the others are owed, in whole streams: a class too small to give each a stream goes to whoever
        # asks first (and its queue to the tenant served least).
        owed = sum(max(0, math.floor(share[tn]) - self.held[(c.name, tn)]) for tn in active if tn != t.tenant.name)
        return after + owed <= c.max_streams

    def _may_queue(self, t: Ticket, now: float) -> bool:
        """Among active tenants, each queues at most its weighted share of the queue (at least one place):
        a flood cannot fill the queue a quieter tenant needs."""
        c = t.cls
        active = self._active(c.name, t.tenant.name, now)
        if len(active) == 1:
            return True
        weights = sum(self.policy.tenants[tn].weight for tn in active)
        share = max(1, math.floor(c.queue_size * t.tenant.weight / weights))
        return sum(q.tenant is t.tenant for q in self.queues[c.name]) < share

    def _active(self, c: str, tenant: str, now: float) -> set[str]:
        """Tenants of class `c` holding streams, queued, or seen within the contention window; `tenant` included."""
        window = self.policy.contention_window_s
        active = {tn for (cc, tn), seen in self.last_seen.items() if cc == c and now - seen < window}
        active |= {tn for (cc, tn), held in self.held.items() if cc == c and held > 0}
        active |= {q.tenant.name for q in self.queues[c]}
        return active | {tenant}

    def drain(self, now: float) -> list[Ticket]:
        """The queued tickets admitted now (the module's docstring)."""
        admitted = []
        for c in self.policy.by_priority():
            queue = self.queues[c.name]
            while queue:
                order = sorted(queue, key=lambda q: (self.served[(c.name, q.tenant.name)], q.deadline, q.seq))
                nxt = next((q for q in order if self._fits(q, now)), None)
                if nxt is None:
                    break
                queue.remove(nxt)
                self._hold(nxt)
                admitted.append(nxt)
        return admitted

    def _hold(self, t: Ticket) -> None:
        """Admitted: its streams held, its tokens counted as served to its tenant (the virtual token counter)."""
        streams = min(t.streams, t.cls.max_streams)
        t.streams = streams
        self.class_streams[t.cls.name] += streams
        self.held[(t.cls.name, t.tenant.name)] += streams
        self.served[(t.cls.name, t.tenant.name)] += t.tokens / t.tenant.weight

    def _charge(self, t: Ticket, now: float) -> None:
        """Offered and taken (admitted or queued): the tenant's request and tokens a minute counted."""
        self.tenant_requests[t.tenant.name] += 1
        bucket = self._bucket(t.tenant, now)
        if bucket is not None:
            bucket.take(t.tokens, now)

    def _refund(self, t: Ticket, tokens: int, now: float, served: bool = False) -> None:
        """`tokens` of `t`'s charge not spent, given back to its tenant's bucket (and its counter, if `served`)."""
        if served:
            self.served[(t.cls.name, t.tenant.name)] -= tokens / t.tenant.weight
        bucket = self._bucket(t.tenant, now)
        if bucket is not None:
            bucket.give_back(tokens, now)

    def _lift(self, t: Ticket) -> None:
        """A tenant that starts queueing is not owed the tokens it did not ask for while away: its counter
        rises to the least of the tenants already queued in its class (the virtual token counter's rule)."""
        queue = self.queues[t.cls.name]
        if queue and all(q.tenant.name != t.tenant.name for q in queue):
            key = (t.cls.name, t.tenant.name)
            self.served[key] = max(self.served[key], min(self.served[(t.cls.name, q.tenant.name)] for q in queue))

    def _bucket(self, tenant: Tenant, now: float) -> TokenBucket | None:
        if tenant.tokens_per_minute is None:
            return None
        bucket = self.buckets.get(tenant.name)
        if bucket is None:
            bucket = self.buckets[tenant.name] = TokenBucket(tenant.tokens_per_minute, now)
        return bucket
