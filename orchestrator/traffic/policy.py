"""The classes and tenants of an application, and what a request resolves to.

    tenant  <- the API key it authenticated with (`default` for frontend.auth's key or none)
    class   <- x-slo-class header, else the body's `slo_class`, else the tenant's default, else the app's
               refused (403) when the tenant may not claim it; unknown (400)
    engine priority <- the class's; the body's `priority` where the class allows it, never above the class

Without classes every request is the one class `default` at priority 0, as before classes existed, and a
`priority` other than 0 is refused with vLLM's own message (its server without priority scheduling).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.config import TrafficConfig

DEFAULT_TENANT = "default"
DEFAULT_CLASS = "default"


@dataclass(frozen=True)
class RequestClass:
    name: str
    priority: int  # the engines' priority: lower runs first
    ttft_s: float | None  # TTFT p99 target; None with itl_s: best effort
    itl_s: float | None  # ITL p50 target
    max_streams: int  # engine streams the class may hold in one frontend
    queue_size: int = 0  # requests that may wait for room (best effort)
    queue_wait_s: float = 30.0
    allow_request_priority: bool = False

    @property
    def best_effort(self) -> bool:
        return self.ttft_s is None


@dataclass(frozen=True)
class Tenant:
    name: str
    classes: frozenset[str] | None  # None: every class
    default_class: str | None
    max_in_flight: int | None = None
    tokens_per_minute: int | None = None
    weight: float = 1.0

    def may_claim(self, cls: str) -> bool:
        return self.classes is None or cls in self.classes


class TrafficRefusal(Exception):
    """A request's claim refused: `status` 400 (unknown, malformed) or 403 (not this tenant's to claim)."""

    def __init__(self, status: int, message: str, param: str, code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


@dataclass(frozen=True)
class Resolved:
    cls: RequestClass
    tenant: Tenant
    engine_priority: int


class TrafficPolicy:
    def __init__(self, traffic: TrafficConfig, stream_limit: int) -> None:
        """`stream_limit`: the frontend's engine streams (frontend.max_in_flight), a class's default share."""
        self.enabled = bool(traffic.classes)
        self.classes = {
            c.name: RequestClass(
                c.name,
                c.priority,
                c.ttft_p99_ms / 1e3 if c.ttft_p99_ms is not None else None,
                c.itl_p50_ms / 1e3 if c.itl_p50_ms is not None else None,
                c.max_streams or stream_limit,
                c.queue_size,
                c.queue_wait_s,
                c.allow_request_priority,
            )
            for c in traffic.classes
        } or {DEFAULT_CLASS: RequestClass(DEFAULT_CLASS, 0, None, None, stream_limit)}
        self.default_class = traffic.default_class or DEFAULT_CLASS
        self.tenants = {
            t.name: Tenant(
                t.name,
                frozenset(t.classes) if t.classes is not None else None,
                t.default_class,
                t.max_in_flight,
                t.tokens_per_minute,
                t.weight,
            )
            for t in traffic.tenants
        }
        self.tenants[DEFAULT_TENANT] = Tenant(DEFAULT_TENANT, None, None)
        self.contention_window_s = traffic.contention_window_s

    def by_priority(self) -> list[RequestClass]:
        """Classes, the first to run first."""
        return sorted(self.classes.values(), key=lambda c: c.priority)

    def resolve(self, tenant: str, header_class: str | None, body_class: str | None, priority: int) -> Resolved:
        t = self.tenants[tenant]
        if not self.enabled:
            if priority != 0:
                raise TrafficRefusal(
                    400, f"Got priority {priority} but priority scheduling is not enabled.", "priority", "unsupported"
                )
            return Resolved(self.classes[DEFAULT_CLASS], t, 0)
        claimed = header_class or body_class
        name = claimed or t.default_class or self.default_class
        param = "x-slo-class" if header_class else "slo_class"
        cls = self.classes.get(name)
        if cls is None:
            raise TrafficRefusal(
                400, f"unknown SLO class {name!r}; classes: {sorted(self.classes)}", param, "invalid_slo_class"
            )
        if not t.may_claim(name):
            raise TrafficRefusal(403, f"this API key may not use SLO class {name!r}", param, "slo_class_not_allowed")
        if priority == 0 or priority == cls.priority:
            return Resolved(cls, t, cls.priority)
        if not cls.allow_request_priority:
            raise TrafficRefusal(
                400,
                f"SLO class {name!r} runs at priority {cls.priority}; it takes no request priority",
                "priority",
                "unsupported",
            )
        if priority < cls.priority:
            raise TrafficRefusal(
                403,
                f"priority {priority} is above SLO class {name!r}'s ({cls.priority}; lower values run first)",
                "priority",
                "priority_not_allowed",
            )
        return Resolved(cls, t, priority)
