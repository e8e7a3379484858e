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
EXIT_WITH_PARENT_ENV = "ORCHESTRATOR_EXIT_WITH_PARENT"
PARENT_POLL_S = 1.0

log = logging.getLogger(__name__)
_installed: set[str] = set()


def register() -> None:
    delay = os.environ.get(NIXL_PROGRESS_DELAY_ENV)
    if delay and "nixl" not in _installed:
        _bound_nixl_progress_delay(int(delay))
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


def _exit_with_parent() -> None:
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(1)  # parent gone: nothing will ever use this process again

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
    _installed.add("parent")
