"""An asyncio event loop on a virtual clock, for timing tests that must not
depend on how busy the machine is.

`loop.time()` starts at 0 and moves only when nothing is ready to run: the
loop then jumps to its next timer instead of sleeping. So `asyncio.sleep(d)`
takes exactly `d` of loop time and no wall time, and durations measured with
`loop.time()` are exact. Real I/O still works: while no timer is pending the
loop blocks on its selector as usual (threads, sockets).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._virtual_now = 0.0
        real_select = self._selector.select

        def select(timeout: float | None = None):
            if timeout is None:  # no timer pending: wait for real I/O
                return real_select(None)
            ready = real_select(0)
            if not ready and timeout > 0:
                self._virtual_now += timeout  # idle until the next timer: jump to it
            return ready

        self._selector.select = select

    def time(self) -> float:
        return self._virtual_now


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run` on a virtual clock."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def loop_time() -> float:
    """The running loop's clock: virtual under `run_virtual`, monotonic otherwise."""
    return asyncio.get_running_loop().time()
