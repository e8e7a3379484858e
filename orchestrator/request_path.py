"""One request's way through the pools: route, remote prefill, decode stream.

    route = scheduler.route_request(request, prefill replicas, decode replicas)
    if route is remote prefill:
        kv = prefill pool.prefill(request)          # KV stays on the prefill replica
             -- on error or timeout: kv = None      # decode replica prefills locally
    stream decode pool.generate(request + kv)       # decode replica pulls the KV
        -- the decode replica fails mid-stream: migrate. The prompt plus the
           tokens already streamed go to another decode replica, which
           computes their KV and continues; the client sees one unbroken
           stream (at most `max_migrations` times, then the error).

A failed or slow prefill never loses the request: it costs a local prefill
on the decode replica, counted in `prefill_fallbacks`. A failed decode
replica costs a recomputation of the context on another, counted in
`migrations`.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace

from orchestrator.engines.base import EngineRequestRejected
from orchestrator.metrics import FrontendMetrics
from orchestrator.pools import PoolClient
from orchestrator.requests import EngineChunk, EngineRequest, KVTransfer, PrefillResult
from orchestrator.routing.base import RouteDecision, Scheduler

log = logging.getLogger(__name__)


class FallbackReason(str, enum.Enum):
    TIMEOUT = "timeout"
    ERROR = "error"


@dataclass
class RequestTrace:
    """What happened to one request on its way, for usage reporting and metrics."""

    route: RouteDecision | None = None
    prefill: PrefillResult | None = None
    fallback: FallbackReason | None = None
    migrations: int = 0


class RequestPath:
    def __init__(
        self,
        decode_pool: PoolClient,
        prefill_pool: PoolClient | None,
        scheduler: Scheduler,
        metrics: FrontendMetrics,
        prefill_timeout_s: float,
        max_migrations: int = 2,
        clock: Callable[[], float] = time.perf_counter,
        detokenize: Callable[[Sequence[int]], str] | None = None,
    ) -> None:
        self.decode_pool = decode_pool
        self.prefill_pool = prefill_pool
        self.scheduler = scheduler
        self.metrics = metrics
        self.prefill_timeout_s = prefill_timeout_s
        self.max_migrations = max_migrations
        self.clock = clock
        # Text of a migrated stream's continuation: a new engine request does
        # not know the text already sent, so its own detokenizer can disagree
        # at the seam (a character split across tokens). None: trust the engine.
        self.detokenize = detokenize

    async def stream(self, request: EngineRequest, trace: RequestTrace) -> AsyncIterator[EngineChunk]:
        prefill_replicas = self.prefill_pool.replicas() if self.prefill_pool is not None else None
        decode_replicas = self.decode_pool.replicas()
        start = self.clock()
        route = self.scheduler.route_request(request, prefill_replicas, decode_replicas)
        self.metrics.decision_seconds.observe(self.clock() - start)
        trace.route = route
        self.metrics.route_decisions.labels(route.kind.value, route.reason.value if route.reason else "").inc()
        try:
            kv = None
            if route.remote_prefill:
                kv = await self._remote_prefill(request, route, trace)
                self.scheduler.on_prefill_done(request.request_id)
            async for chunk in self._decode(request, request.for_decode(route.decode_replica, kv), trace):
                yield chunk
        finally:
            self.scheduler.on_request_finished(request.request_id)

    async def _decode(self, original: EngineRequest, request: EngineRequest, trace: RequestTrace) -> AsyncIterator[EngineChunk]:
        generated: list[int] = []
        sent_text = ""
        failed: set[str] = set()
        while True:
            try:
                async with contextlib.aclosing(self.decode_pool.generate(request)) as chunks:
                    async for chunk in chunks:
                        if chunk.num_prompt_tokens:
                            self.scheduler.on_prefill_done(original.request_id)
                        generated.extend(chunk.token_ids)
                        if trace.migrations and self.detokenize is not None:
                            chunk = replace(chunk, text=self._continued_text(generated, sent_text, chunk.finished))
                        sent_text += chunk.text
                        yield chunk
                return
            except EngineRequestRejected:
                raise  # the request is at fault, not the replica
            except Exception as e:
                if trace.migrations >= self.max_migrations or len(generated) >= original.sampling.max_tokens:
                    raise
                trace.migrations += 1
                self.metrics.migrations.inc()
                if request.target_replica is not None:
                    failed.add(request.target_replica)
                log.warning("decode of %s failed after %d tokens (%s: %s); migrating (attempt %d)",
                            original.request_id, len(generated), type(e).__name__, e, trace.migrations)
                request = self._migrate(original, generated, failed, trace.migrations)

    def _continued_text(self, generated: list[int], sent_text: str, finished: bool) -> str:
        """What the uninterrupted stream would add now: the text of every token
        so far past what was sent, held back while it ends in an incomplete
        character (as vLLM's incremental detokenizer does)."""
        text = self.detokenize(generated)
        if not finished and text.endswith("\ufffd"):
            return ""
        return text[len(sent_text):]

    def _migrate(self, original: EngineRequest, generated: list[int], failed: set[str], attempt: int) -> EngineRequest:
        """The continuation, routed to a decode replica that has not failed it."""
        continued = original.continued(generated, attempt)
        candidates = [v for v in self.decode_pool.replicas() if v.replica_id not in failed]
        route = self.scheduler.route_request(continued, None, candidates)
        self.scheduler.on_request_finished(continued.request_id)  # accounted under the original id
        return continued.for_decode(route.decode_replica, None)

    async def _remote_prefill(self, request: EngineRequest, route: RouteDecision, trace: RequestTrace) -> KVTransfer | None:
        assert self.prefill_pool is not None
        start = self.clock()
        try:
            result = await asyncio.wait_for(
                self.prefill_pool.prefill(request.for_prefill(route.prefill_replica)), self.prefill_timeout_s
            )
        except EngineRequestRejected:
            raise  # the request itself is invalid; a local prefill would refuse it too
        except asyncio.TimeoutError:
            trace.fallback = FallbackReason.TIMEOUT
        except Exception as e:  # a dead or failing prefill replica
            log.warning("remote prefill of %s failed (%s: %s); prefilling on the decode replica",
                        request.request_id, type(e).__name__, e)
            trace.fallback = FallbackReason.ERROR
        else:
            self.metrics.prefill_latency.observe(self.clock() - start)
            self.metrics.kv_handoffs.inc()
            self.metrics.kv_handoff_blocks.inc(result.kv_transfer.num_blocks)
            trace.prefill = result
            return result.kv_transfer
        self.metrics.prefill_fallbacks.labels(trace.fallback.value).inc()
        return None
