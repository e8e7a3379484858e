"""Ports an engine adapter tells its engine to listen on.

Contract: a port returned here was free when drawn and lies outside the
kernel's ephemeral range and Ray's worker ports, so that nothing on the node
takes it by accident before the engine binds it (which can be minutes later,
after the model loads). A port found by binding port 0 does not hold that:
it comes from the ephemeral range that every outgoing connection on the
node also draws from. Seen in CI: seven engines starting at once, one
vLLM prefill engine's NIXL handshake listener lost its port that way
(EADDRINUSE), the listener thread died and the engine core waited for it
forever. Two replicas drawing the same port within one start-up remains
possible (about 1 in 6,000 for a pair with Linux's default ranges).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Ray's default worker ports are 10002-19999; ports below are Ray's own and
# well-known services'.
FIRST_LISTEN_PORT = 20000
LAST_PORT = 65535
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_EPHEMERAL = range(32768, 61000)
DRAWS = 64


def ephemeral_ports(source: Path = EPHEMERAL_RANGE_FILE) -> range:
    """The kernel's ephemeral port range (Linux's default where unreadable)."""
    try:
        low, high = (int(x) for x in source.read_text().split())
    except (OSError, ValueError):
        return LINUX_DEFAULT_EPHEMERAL
    return range(low, high + 1)


def listen_candidates(ephemeral: range) -> list[range]:
    """The port ranges an engine may be told to listen on."""
    below = range(FIRST_LISTEN_PORT, max(FIRST_LISTEN_PORT, ephemeral.start))
    above = range(max(FIRST_LISTEN_PORT, ephemeral.stop), LAST_PORT + 1)
    return [r for r in (below, above) if len(r)]


def bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((_bind_address(host), port))
        except OSError:
            return False
        return True


def listen_port(host: str, rng: random.Random | None = None, ephemeral: range | None = None) -> int:
    """A free port on `host` to give an engine to listen on (see the module's contract)."""
    rng = rng or random.Random()
    ranges = listen_candidates(ephemeral_ports() if ephemeral is None else ephemeral)
    if not ranges:
        raise OSError("no ports outside the ephemeral range to listen on")
    weights = [len(r) for r in ranges]
    for _ in range(DRAWS):
        port = rng.choice(rng.choices(ranges, weights)[0])
        if bindable(host, port):
            return port
    raise OSError(f"no free port on {host} in {DRAWS} draws from {ranges}")


def _bind_address(host: str) -> str:
    return "127.0.0.1" if host == "localhost" else host
