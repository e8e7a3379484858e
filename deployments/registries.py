"""Process-wide registries: the pools' request routers, keyed by
(application, deployment), and the SLA planner's coordinators (one per
application, shared by its pools' autoscaling policies), keyed by
application.

Serve pickles a request router's or a custom autoscaling policy's module by
value, so a registry cannot be a global of that module: it would be copied
with what it holds (for the planner, seen: two planners for one
application, one stepping on 90 s stale metrics). They live here and are
imported by reference at call time.
"""

from __future__ import annotations

import threading
from typing import Any

_ROUTERS: dict[tuple[str, str], Any] = {}
_LOCK = threading.Lock()


def register(app_name: str, deployment_name: str, router: Any) -> None:
    with _LOCK:
        _ROUTERS[(app_name, deployment_name)] = router


def router_for(app_name: str, deployment_name: str) -> Any | None:
    with _LOCK:
        return _ROUTERS.get((app_name, deployment_name))


_COORDINATORS: dict[str, Any] = {}


def coordinator_for(app_name: str, make: Any, current: Any = None) -> Any:
    """The application's planner coordinator; `make()` builds a new one when
    there is none or `current(existing)` says it is stale (app redeployed)."""
    with _LOCK:
        existing = _COORDINATORS.get(app_name)
        if existing is None or (current is not None and not current(existing)):
            existing = _COORDINATORS[app_name] = make()
        return existing


def coordinator(app_name: str) -> Any | None:
    with _LOCK:
        return _COORDINATORS.get(app_name)
