"""A streamed response whose HTTP reader stops taking data is cut, so that it holds no engine and no memory.

    events = cut_when_stalled(source, stall_s, on_cut)

`events` yields what `source` yields. The server pulls the next event only once the previous one is
written, and writing blocks while the client's socket, HAProxy's buffers and the server's own are full:
a client that stops reading leaves `events` parked at a yield. Parked `stall_s` (on the event loop's
clock), it is cut: `on_cut()` is called, `source` is closed (its own clean-up runs: the engine streams
cancelled and aborted, the admission slot given back) and, should the reader ever take data again, it
gets one error event in OpenAI's shape and the end of the stream, no [DONE].

Cost per event: one clock read. One timer per stream, re-armed at most once every `stall_s`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable

from orchestrator.api import sse
from orchestrator.api.errors import server_error


async def cut_when_stalled(
    source: AsyncGenerator[str, None], stall_s: float, on_cut: Callable[[], None]
) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    parked_at: float | None = None  # when the reader was handed an event it has not yet come back from
    closing: asyncio.Task | None = None

    def check() -> None:
        nonlocal closing, timer
        if parked_at is not None and loop.time() - parked_at >= stall_s:
            on_cut()
            closing = loop.create_task(source.aclose())  # `source` is parked at its own yield: not running
            return
        timer = loop.call_at((parked_at if parked_at is not None else loop.time()) + stall_s, check)

    timer = loop.call_later(stall_s, check)
    try:
        async for event in source:
            parked_at = loop.time()
            yield event
            if closing is not None:
                await closing
                yield sse.event(server_error(f"stream cut: the client read nothing for {stall_s:g} s").body())
                return
            parked_at = None
    finally:
        timer.cancel()
        if closing is None:
            await source.aclose()
