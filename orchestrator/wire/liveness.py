"""A data-plane peer that goes silent (its host lost, its link cut) is found dead within `DEAD_PEER_S`.

A killed process's kernel closes its sockets, and the peer sees the connection end at once. A host that
vanishes sends nothing: a frontend waiting on a stream would wait for TCP's own limits (minutes). Each
data-plane socket therefore has TCP keepalive (the kernel probes an idle connection: `IDLE_S` without
traffic, then `PROBES` probes `INTERVAL_S` apart) and a user timeout (data sent and not acknowledged for
`DEAD_PEER_S`). A live peer's kernel answers the probes however busy its process is, so a long prefill is
not mistaken for a dead host. The connection then fails like any lost connection: the frontend migrates
or falls back (wire/client.py), the replica aborts the streams (wire/server.py).
"""

from __future__ import annotations

import socket

IDLE_S = 5
INTERVAL_S = 2
PROBES = 3
DEAD_PEER_S = IDLE_S + INTERVAL_S * PROBES  # 11 s


def watch_liveness(sock: socket.socket | None) -> None:
    """Keepalive and the user timeout on a connected TCP socket (no-op on anything else)."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, IDLE_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, INTERVAL_S)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, PROBES)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DEAD_PEER_S * 1000)
