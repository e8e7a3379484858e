"""Choice fan-out: every choice of a request run on its group's request path, their
chunks merged in arrival order.

    choice 0 of prompt i (the lead) is routed; the prompt's other samples wait
    for the lead's decode replica and follow it there (its cache holds the prompt)
    one choice streams as is; several are pumped into one queue

Latency metrics (TTFT, ITL) are observed here, on choice 0, as its chunks pass. With tracing
on, each choice has a span under the request's, with events at its first token and its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Protocol

from orchestrator.api.prepared import ChoicePlan, PreparedRequest
from orchestrator.kv.prompt_blocks import PromptBlocks
from orchestrator.messages import EngineChunk, EngineRequest
from orchestrator.metrics import FrontendMetrics
from orchestrator.request_path import RequestPath, RequestTrace
from orchestrator.routing.shape import ShapeRouter
from orchestrator.tracing import NOOP_SPAN, Span

CHUNKS_QUEUED_PER_CHOICE = 4  # chunks of a request's choices waiting for its reader, per choice


class RoutedChoice(Protocol):
    plan: ChoicePlan
    trace: RequestTrace


class ChoiceFanOut:
    def __init__(
        self,
        path: RequestPath,
        metrics: FrontendMetrics,
        clock: Callable[[], float] = time.perf_counter,
        group_paths: Mapping[str, RequestPath] | None = None,
        shape_router: ShapeRouter | None = None,
    ) -> None:
        # `path` serves every request, unless `shape_router` is given: then it
        # names, per request, the group whose path in `group_paths` serves it.
        self.path = path
        self.group_paths = dict(group_paths or {})
        self.shape_router = shape_router
        self.metrics = metrics
        self.clock = clock

    def path_for(self, request: EngineRequest) -> tuple[RequestPath, PromptBlocks | None]:
        """The path of the group the shape router names, and the prompt's blocks it computed
        (for that group's scheduler). A group with no live decode replica (starting, gone)
        hands its request to the unique group; the counter records the group that serves it."""
        if self.shape_router is None:
            return self.path, None
        decision = self.shape_router.route(request)
        group = decision.group
        if not self.group_paths[group].decode_pool.replicas():
            fallback = self.shape_router.config.unique_group
            if self.group_paths[fallback].decode_pool.replicas():
                group = fallback
        self.metrics.shape_decisions.labels(group, decision.shape.value).inc()
        self.metrics.shape_prefix_reuse.observe(decision.reuse)
        return self.group_paths[group], decision.blocks

    async def _chunks(
        self,
        p: PreparedRequest,
        plan: ChoicePlan,
        trace: RequestTrace,
        follow: str | None = None,
        span: Span = NOOP_SPAN,
    ) -> AsyncIterator[EngineChunk]:
        """One choice's chunks, with latency metrics observed as they pass (of choice 0);
        `span`: the request's, which the choice's span is a child of."""
        last = first = None
        observe = plan.index == 0
        # By SLO class (classes configured): its histograms looked up once, its gaps kept where it has targets.
        cls = p.traffic.cls if p.traffic is not None and observe else None
        class_ttft = self.metrics.class_ttft.labels(cls.name) if cls is not None else None
        class_itl = self.metrics.class_itl.labels(cls.name) if cls is not None else None
        gaps: list[float] | None = [] if cls is not None and not cls.best_effort else None
        ended = False
        path, blocks = self.path_for(plan.request)
        trace.span = span.child("choice", {"choice.index": plan.index, "choice.follows": follow})
        stream = path.stream(plan.request, trace, follow, blocks)
        if trace.span.recording:
            stream = _traced(stream, trace)
        try:
            async with contextlib.aclosing(stream) as chunks:
                async for chunk in chunks:
                    n = len(chunk.token_ids)
                    if n and observe:
                        now = self.clock()
                        if last is None:
                            first = now
                            self.metrics.ttft.observe(now - p.arrival)
                            if class_ttft is not None:
                                class_ttft.observe(now - p.arrival)
                        else:
                            gap = (now - last) / n
                            for _ in range(n):
                                self.metrics.itl.observe(gap)
                                if class_itl is not None:
                                    class_itl.observe(gap)
                            if gaps is not None:
                                gaps.extend(gap for _ in range(n))
                        last = now
                    yield chunk
            ended = True
        finally:
            trace.span.end()
            if ended and gaps is not None and first is not None:
                self._attained(p, first - p.arrival, gaps)

    def _attained(self, p: PreparedRequest, ttft: float, gaps: list[float]) -> None:
        """An SLO class's request met its targets: TTFT within ttft_p99, its median gap within itl_p50."""
        cls, tenant = p.traffic.cls, p.traffic.tenant.name
        attained = ttft <= cls.ttft_s and (not gaps or statistics.median(gaps) <= cls.itl_s)
        self.metrics.class_slo.labels(cls.name, tenant, "yes" if attained else "no").inc()

    async def choice_chunks(
        self, p: PreparedRequest, states: Sequence[RoutedChoice], span: Span = NOOP_SPAN
    ) -> AsyncIterator[tuple[int, EngineChunk]]:
        """(choice index, chunk) of every choice as they arrive; one choice is streamed as is.
        `span`: the request's span (tracing on), parent of each choice's."""
        if len(states) == 1:
            async for chunk in self._chunks(p, states[0].plan, states[0].trace, span=span):
                yield 0, chunk
            return
        # Bounded: a reader that falls behind holds each choice's pump at its next chunk (the request path and
        # the data plane merge what arrives meanwhile) rather than queueing every choice's chunks here.
        queue: asyncio.Queue[tuple[int, EngineChunk | None, Exception | None]] = asyncio.Queue(
            maxsize=CHUNKS_QUEUED_PER_CHOICE * len(states)
        )
        lead_replica = {s.plan.prompt: asyncio.get_running_loop().create_future() for s in states if s.plan.lead}

        async def pump(state: RoutedChoice) -> None:
            plan = state.plan
            followed = lead_replica[plan.prompt]
            try:
                follow = None if plan.lead else await followed
                async for chunk in self._chunks(p, plan, state.trace, follow, span):
                    if plan.lead and not followed.done() and state.trace.route is not None:
                        followed.set_result(state.trace.route.decode_replica)
                    await queue.put((plan.index, chunk, None))
            except Exception as e:
                await queue.put((plan.index, None, e))
            finally:
                if plan.lead and not followed.done():
                    followed.set_result(None)
            await queue.put((plan.index, None, None))

        tasks = [asyncio.create_task(pump(s)) for s in states]
        try:
            running = len(tasks)
            while running:
                index, chunk, error = await queue.get()
                if error is not None:
                    raise error
                if chunk is None:
                    running -= 1
                else:
                    yield index, chunk
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def _traced(stream: AsyncIterator[EngineChunk], trace: RequestTrace) -> AsyncIterator[EngineChunk]:
    """`stream`, its first token and its end recorded on the choice's span (`trace.span`, recording):
    output tokens, finish reason, cached prompt tokens (the prefilling replica's). Only while tracing."""
    span = trace.span
    output_tokens, cached, finish = 0, 0, None
    try:
        async with contextlib.aclosing(stream) as chunks:
            async for chunk in chunks:
                if chunk.token_ids and not output_tokens:
                    span.add_event("first_token")
                output_tokens += len(chunk.token_ids)
                cached += chunk.num_cached_tokens
                finish = chunk.finish_reason or finish
                yield chunk
    except BaseException as e:  # a cancellation (client gone) is marked `cancelled`, not an error
        span.record_error(e)
        raise
    finally:
        end = {
            "output_tokens": output_tokens,
            "finish_reason": finish,
            "cached_prompt_tokens": trace.prefill.num_cached_tokens if trace.prefill is not None else cached,
        }
        span.set_attributes(end)
        span.add_event("stream_end", end)
