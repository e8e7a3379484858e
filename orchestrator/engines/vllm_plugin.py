"""vLLM general plugin for the engine processes a pool replica starts.

vLLM loads it (entry point `vllm.general_plugins`) in each of its processes:
the replica itself, the engine core and its workers. Each behaviour below is
off unless the replica's environment (set from the pool config, see
`vllm_engine.process_env`) turns it on.

NIXL progress delay (`ORCHESTRATOR_NIXL_PROGRESS_DELAY_US`)
    NIXL's Python agent starts the UCX backend's progress thread with a poll
    delay of 0, so it spins a whole core per engine even when no KV moves.
    On a GPU node that buys microseconds; on a small CPU machine it eats the
    cores the engines need (two idle NIXL engines kept a 2-core machine at
    100%). vLLM builds the agent itself and exposes no knob, so the delay is
    raised here. Transfers still wake the thread at once through the UCX
    workers' event fds; the delay only bounds polling when nothing happens.

Shared-memory queue polling (`ORCHESTRATOR_SHM_POLL_US`, `ORCHESTRATOR_SHM_POLL_MAX_US`)
    The engine core and its worker process talk through vLLM's shared-memory
    message queues; a reader spins (`sched_yield` in a loop) for 1 s after
    every message, then sleeps on the writer's notification socket. So a
    serving engine keeps two processes on CPU at all times: the worker between
    steps, the engine core while the worker computes. On a GPU node that buys
    microseconds; on a small CPU machine it starves the engine's own API server
    (measured: 1.6-1.8 cores for one engine at one request at a time). vLLM has
    no setting for it, so here the reader sleeps between looks during that
    second instead of yielding; after it, vLLM's own idle wait is unchanged.
    Sleeping on the notification instead does not work: that socket
    (high-water mark 1, conflated) loses wake-ups under load; readers that
    waited on it, bounded, were late by the whole bound on most steps, and
    unbounded an engine hung within 30 requests. vLLM's spin hides this.

    Each sleep is `WAIT_SHARE` of the time this wait has lasted so far, within
    [POLL_US, POLL_MAX_US]: a message is seen at most that share of its wait
    late (or POLL_US), and a wait of W costs about log(W) looks, not W / POLL_US.
    A fixed 50 us poll cost 15% of a core per waiting process (20 us of CPU a
    look, measured here), in proportion to the wait: with every core busy the
    steps grow longer, the polls with them, and the engines' CPU per token rose
    with the load around them. POLL_MAX_US = POLL_US is the fixed poll.

Exit with the parent (`ORCHESTRATOR_EXIT_WITH_PARENT`)
    A replica killed outright (actor killed, node agent gone) leaves vLLM's
    engine-core and worker processes running, holding their memory (on GPUs:
    the GPU the replacement replica needs) and, with NIXL, a spinning core.
    Each process exits once its parent is gone.
"""

from __future__ import annotations

import logging
import os
import threading
import time

NIXL_PROGRESS_DELAY_ENV = "ORCHESTRATOR_NIXL_PROGRESS_DELAY_US"
SHM_POLL_ENV = "ORCHESTRATOR_SHM_POLL_US"
SHM_POLL_MAX_ENV = "ORCHESTRATOR_SHM_POLL_MAX_US"
WAIT_SHARE = 1 / 16
EXIT_WITH_PARENT_ENV = "ORCHESTRATOR_EXIT_WITH_PARENT"
PARENT_POLL_S = 1.0

log = logging.getLogger(__name__)
_installed: set[str] = set()


def register() -> None:
    delay = os.environ.get(NIXL_PROGRESS_DELAY_ENV)
    if delay and "nixl" not in _installed:
        _bound_nixl_progress_delay(int(delay))
    poll_us = os.environ.get(SHM_POLL_ENV)
    if poll_us and "shm" not in _installed:
        _poll_shm_queues(int(poll_us), int(os.environ.get(SHM_POLL_MAX_ENV, poll_us)))
    if os.environ.get(EXIT_WITH_PARENT_ENV) == "1" and "parent" not in _installed:
        _exit_with_parent()


def _bound_nixl_progress_delay(min_delay_us: int) -> None:
    try:
        import nixl._api as api
    except ImportError:
        return
    bindings = api.nixlBind
    base = bindings.nixlAgentConfig

    class BoundedProgressConfig(base):
        def __setattr__(self, name, value):
            if name == "pthrDelay":
                value = max(value, min_delay_us)
            super().__setattr__(name, value)

    bindings.nixlAgentConfig = BoundedProgressConfig
    _installed.add("nixl")
    log.info("NIXL progress thread poll delay >= %d us", min_delay_us)


def _poll_shm_queues(poll_us: int, max_poll_us: int) -> None:
    try:
        from vllm.distributed.device_communicators import shm_broadcast
    except ImportError:
        return
    base = shm_broadcast.SpinCondition
    poll_s, max_poll_s = poll_us / 1e6, max(poll_us, max_poll_us) / 1e6

    class PollingCondition(base):
        # The read this wait follows (vLLM's `last_read`) and when the wait began: the first look after
        # a read starts a new wait, so the reader's own work since that read does not count as waiting.
        _after_read: float | None = None
        _waiting_since = 0.0

        def wait(self, timeout_ms: int | None = None) -> None:
            now = time.monotonic()
            if now > self.last_read + self.busy_loop_s:
                super().wait(timeout_ms)
                return
            if self._after_read != self.last_read:
                self._after_read, self._waiting_since = self.last_read, now
            # where vLLM would sched_yield and look again
            time.sleep(min(max_poll_s, max(poll_s, WAIT_SHARE * (now - self._waiting_since))))

    # MessageQueue looks the class up in its module when it builds a queue.
    shm_broadcast.SpinCondition = PollingCondition
    _installed.add("shm")
    log.info("shared-memory queue readers sleep %d-%d us between looks instead of spinning", poll_us, max_poll_us)


def _exit_with_parent() -> None:
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)  # parent gone: nothing will ever use this process again

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
    _installed.add("parent")
