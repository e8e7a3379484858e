"""A serving process's nice value: every thread it has, and what it then starts, runs at the
configured value (Ray starts its workers at 15); where lowering it is not permitted, the
process carries on as it was, with a warning."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest

from deployments.process_priority import set_niceness

# Run in a child process: a nice value, once raised, cannot be lowered without privilege.
CHILD = textwrap.dedent(
    """
    import os, subprocess, sys, threading
    from deployments.process_priority import set_niceness

    os.setpriority(os.PRIO_PROCESS, 0, {start})  # as Ray starts a worker
    seen = []
    ready, done = threading.Event(), threading.Event()
    def older_thread():
        ready.set(); done.wait(); seen.append(os.getpriority(os.PRIO_PROCESS, 0))
    t = threading.Thread(target=older_thread); t.start(); ready.wait()
    after = set_niceness({target})
    done.set(); t.join()
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
                           capture_output=True, text=True, check=True).stdout.strip()
    print(after, seen[0], child)
    """
)


def _run_child(start: int, target: int | None) -> list[int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(start=start, target=target)],
        capture_output=True,
        text=True,
        check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    return [int(x) for x in out.stdout.split()]


def test_a_raised_value_reaches_every_thread_and_the_processes_started_after():
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert _run_child(start=base, target=base + 4) == [base + 4] * 3


@pytest.mark.skipif(os.geteuid() != 0, reason="lowering a nice value needs CAP_SYS_NICE")
def test_a_worker_at_rays_15_comes_back_to_0_with_its_threads_and_engines():
    assert _run_child(start=15, target=0) == [0, 0, 0]


def test_none_leaves_rays_value():
    assert _run_child(start=15, target=None) == [15, 15, 15]


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_not_permitted_warns_and_serves_on():
    def refuse(which: int, who: int, value: int) -> None:
        raise PermissionError(1, "Operation not permitted")

    current = os.getpriority(os.PRIO_PROCESS, 0)
    records = _Records()
    logger = logging.getLogger("ray.serve")
    logger.addHandler(records)
    try:
        assert set_niceness(current - 1, setpriority=refuse) == current
    finally:
        logger.removeHandler(records)
    assert any("RAY_worker_niceness" in m for m in records.messages)
