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
possible (about 1 in 6,000 for a pair with Linux's default ranges);
`reserve_listen_port` rules it out on one node, for a port whose collision
would go unnoticed (SGLang's bootstrap server only logs a failed bind).
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

# Ray's default worker ports are 10002-19999; ports below are Ray's own and
# well-known services'.
FIRST_LISTEN_PORT = 20000
LAST_PORT = 65535
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_DEFAULT_EPHEMERAL = range(32768, 61000)
DRAWS = 64
# Abstract Unix socket names of `PortReservation`s, followed by the port.
RESERVATION_PREFIX = "orchestrator-listen-port-"

T = TypeVar("T")


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


def _draw(host: str, rng: random.Random | None, ephemeral: range | None, take: Callable[[int], T | None]) -> T:
    """The first drawn port that is bindable on `host` and that `take` accepts."""
    rng = rng or random.Random()
    ranges = listen_candidates(ephemeral_ports() if ephemeral is None else ephemeral)
    if not ranges:
        raise OSError("no ports outside the ephemeral range to listen on")
    weights = [len(r) for r in ranges]
    for _ in range(DRAWS):
        port = rng.choice(rng.choices(ranges, weights)[0])
        if bindable(host, port) and (taken := take(port)) is not None:
            return taken
    raise OSError(f"no free port on {host} in {DRAWS} draws from {ranges}")


def listen_port(host: str, rng: random.Random | None = None, ephemeral: range | None = None) -> int:
    """A free port on `host` to give an engine to listen on (see the module's contract)."""
    return _draw(host, rng, ephemeral, lambda port: port)


class PortReservation:
    """A listen port that no other reservation on this node holds while this
    object lives (until `release()`, its collection or the end of the
    process). The claim is an abstract Unix socket named after the port: it
    lives in the network namespace, as the TCP port does, and the kernel
    drops it with the process."""

    def __init__(self, port: int, claim: socket.socket) -> None:
        self.port = port
        self._claim = claim

    def release(self) -> None:
        self._claim.close()


def _claim(port: int) -> PortReservation | None:
    claim = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        claim.bind(f"\0{RESERVATION_PREFIX}{port}")
    except OSError:
        claim.close()
        return None
    return PortReservation(port, claim)


def reserve_listen_port(host: str, rng: random.Random | None = None, ephemeral: range | None = None) -> PortReservation:
    """`listen_port`, and no two reservations on one node alike: the port is
    held for the caller until it releases it or exits, however many
    replicas draw at the same moment."""
    return _draw(host, rng, ephemeral, _claim)


def _bind_address(host: str) -> str:
    return "127.0.0.1" if host == "localhost" else host
