"""Process-wide registry of the pools' request routers, keyed by
(application, deployment).

Serve pickles a request router's module by value, so the registry cannot be
a global of that module: the router would register into a copy. It lives
here and is imported at call time.
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
