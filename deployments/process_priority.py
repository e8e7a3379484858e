"""The scheduling priority (nice value) of a serving process and of what it starts.

Ray starts worker processes at nice 15 (`worker_niceness`). On Linux a nice
value belongs to each thread, and a process or thread inherits the value of
the thread that creates it; so the whole process is reniced, every thread
it already has (Ray's, the event loop's, a thread pool's), before the
engine processes are spawned from one of them.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

log = logging.getLogger("ray.serve")

SetPriority = Callable[[int, int, int], None]


def _threads() -> list[int]:
    """This process's thread ids (Linux), or [0]: the calling process where /proc has none."""
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except FileNotFoundError:
        return [0]


def set_niceness(target: int | None, setpriority: SetPriority = os.setpriority) -> int:
    """Every thread of this process at nice `target` (None: left as it is); returns the value the
    calling thread runs at afterwards. Where lowering it is not permitted, logs a warning and
    leaves the process as it was: a slower answer under contention, not a failed replica."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if target is None or target == current:
        return current
    try:
        for tid in _threads():
            try:
                setpriority(os.PRIO_PROCESS, tid, target)
            except ProcessLookupError:
                pass  # a thread that ended meanwhile
    except PermissionError:
        log.warning(
            "cannot set nice %d (running at %d, as Ray started this worker): serving processes yield the CPU "
            "to every process at a lower value. Start Ray with RAY_worker_niceness=%d, or grant CAP_SYS_NICE",
            target,
            current,
            target,
        )
    return os.getpriority(os.PRIO_PROCESS, 0)
