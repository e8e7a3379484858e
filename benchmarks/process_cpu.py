"""CPU time by process kind, from the OS: what each part of a serving system
(engines, replicas, frontend, proxy, Ray's own) spent over a window.

Markers are (substring of the command line, kind) pairs; a process's kind is
that of the first marker its command line holds, and processes matching none
are not counted. Engine processes rename themselves (`VLLM::EngineCore...`
via setproctitle), which is what the command line then shows.
"""

from __future__ import annotations

import os
from collections import Counter

import psutil

Markers = tuple[tuple[str, str], ...]

RAY_MARKERS: Markers = (
    ("haproxy", "haproxy"),
    ("raylet", "ray"),
    ("gcs_server", "ray"),
    ("ray::", "ray"),
    ("ray/", "ray"),
)

# Every system of the serving comparisons: vLLM's engine processes first (children of any of them): its
# engine core (scheduler, queues) and, on CPU, its worker (the model's forward passes).
SERVING_MARKERS: Markers = (
    ("EngineCore", "engine_core"),
    ("VLLM::Worker", "engine_worker"),
    (":frontend", "frontend"),
    (":decode_pool", "replicas"),
    (":prefill_pool", "replicas"),  # ours
    ("OpenAiIngress", "frontend"),
    ("PDProxyServer", "frontend"),
    ("LLMServer", "replicas"),  # Ray Serve LLM
    ("vllm.entrypoints.openai.api_server", "api_server"),
    ("APIServer", "api_server"),  # vLLM's own server
    ("dynamo.frontend", "frontend"),
    ("dynamo.vllm", "replicas"),
    ("dynamo.mocker", "replicas"),  # Dynamo
    *RAY_MARKERS,
)


def _kind(p: psutil.Process, markers: Markers) -> str | None:
    try:
        cmd = " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return next((kind for marker, kind in markers if marker in cmd), None)


def snapshot(markers: Markers, exclude: int | None = None) -> dict[int, tuple[str, float]]:
    """pid -> (kind, user+system CPU seconds so far) for every process a marker names, but `exclude`."""
    exclude = os.getpid() if exclude is None else exclude
    out = {}
    for p in psutil.process_iter():
        if p.pid == exclude:
            continue
        kind = _kind(p, markers)
        if kind is None:
            continue
        try:
            t = p.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        out[p.pid] = (kind, t.user + t.system)
    return out


def spent(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> Counter:
    """CPU seconds by kind between two snapshots (a process born in between counts from zero)."""
    cpu: Counter = Counter()
    for pid, (kind, t) in after.items():
        cpu[kind] += t - before.get(pid, (kind, 0.0))[1]
    return cpu
