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
        -- the stream is parked (its client stopped reading; the replica
           aborted the request): once the client reads again, the prompt plus
           the tokens streamed continue on the replica the scheduler picks
           (any number of times; counted in `parked_streams`).

Engines whose prefill replica publishes `KVHandoff.CONCURRENT` (SGLang) hand
KV over differently: the frontend draws a rendezvous (the prefill replica's
bootstrap address, a room from `rng`) and starts the prefill call and the
decode stream together, both carrying it; the decode engine pre-allocates,
the prefill engine sends the KV there. A decode engine that cannot prefill
locally (`EngineInfo.prefills_locally` False) gets such a concurrent prefill
for every attempt, a migrated continuation included.

A failed or slow prefill never loses the request: it costs a local prefill
on the decode replica (or, where the decode engine cannot prefill, a new
concurrent prefill on another prefill replica), counted in
`prefill_fallbacks`. A failed decode replica costs a recomputation of the
context on another, counted in `migrations`, and is set aside: no new
request or migration is routed to it for `suspect_s` (a dead engine stays in
the pool's live set until Serve's health checks replace it), unless every
replica is set aside; then it is tried again. A migration never goes back to
a replica that failed the same stream while another exists: when none does
(the pool's last live replica died), it waits up to `migration_wait_s` for
Serve to start one, then tries the failed ones again.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace

from orchestrator.engines.base import (
    BOOTSTRAP_ROOM_BITS,
    EngineError,
    EngineRequestRejected,
    KVHandoff,
    rendezvous_transfer,
)
from orchestrator.kv.prompt_blocks import PromptBlocks
from orchestrator.messages import EngineChunk, EngineRequest, KVTransfer, PrefillResult
from orchestrator.metrics import FrontendMetrics
from orchestrator.pools import PoolClient, ReplicaView, StreamParked
from orchestrator.routing.base import RouteDecision, RouteKind, RouteReason, Scheduler
from orchestrator.tracing import NOOP_SPAN, Span

log = logging.getLogger(__name__)

# How long a decode replica that failed a stream gets no new request: about Serve's time to replace a dead
# replica (health checks every 5 s, a few failures in a row).
SUSPECT_S = 15.0
# How often a migration waiting for a decode replica looks at the pool again.
MIGRATION_POLL_S = 0.5


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
    parks: int = 0  # times the stream was parked and continued (its client stopped reading)
    # The choice's span (tracing on): the route and a remote prefill are its children.
    span: Span = NOOP_SPAN

    @property
    def continuations(self) -> int:
        """Engine requests after the first: migrations and parks."""
        return self.migrations + self.parks


class _ConcurrentPrefillFailed(Exception):
    """The prefill half of a concurrent handoff failed before the decode
    stream produced anything; the decode attempt was aborted."""

    def __init__(self, prefill_replica: str) -> None:
        super().__init__(prefill_replica)
        self.prefill_replica = prefill_replica


def _is_concurrent(view: ReplicaView | None) -> bool:
    return view is not None and view.info is not None and view.info.kv_handoff is KVHandoff.CONCURRENT


def _prefills_locally(view: ReplicaView | None) -> bool:
    return view is None or view.info is None or view.info.prefills_locally


def _view(views: Sequence[ReplicaView], replica_id: str | None) -> ReplicaView | None:
    """The named replica among `views` (a pool's, read once per request); None if it is not there."""
    return next((v for v in views if v.replica_id == replica_id), None) if replica_id is not None else None


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
        rng: random.Random | None = None,
        suspect_s: float = SUSPECT_S,
        migration_wait_s: float = 0.0,
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
        # Draws KV rendezvous rooms and the prefill replica a decode engine
        # that cannot prefill locally falls back to.
        self.rng = rng or random.Random()
        self.suspect_s = suspect_s
        self.migration_wait_s = migration_wait_s
        self._suspect_until: dict[str, float] = {}  # decode replica -> when it may take new requests again

    async def stream(
        self,
        request: EngineRequest,
        trace: RequestTrace,
        follow: str | None = None,
        blocks: PromptBlocks | None = None,
    ) -> AsyncIterator[EngineChunk]:
        """`follow`: a decode replica that holds this prompt's KV (another sample of the
        same prompt streams there): the request prefills there, from its cache, if the
        replica is still in the pool. `blocks`: the prompt's blocks, if the shape router
        computed them. The pools' replicas are read once: the views routed on are the
        views the calls go to."""
        prefill_replicas = self.prefill_pool.replicas() if self.prefill_pool is not None else None
        live_decode = self.decode_pool.replicas()
        decode_replicas = self._trusted(live_decode)
        followed = [v for v in decode_replicas if v.replica_id == follow]
        start = self.clock()
        route_span = trace.span.child("route")
        # Routed as if aggregated (the scheduler accounts a local prefill), then named for why.
        local_reason = None
        if followed:
            decode_replicas, local_reason = followed, RouteReason.SIBLING_SAMPLE
        elif request.prefills_where_it_decodes:
            local_reason = RouteReason.PROMPT_LOGPROBS
        try:
            if local_reason is not None:
                route = self.scheduler.route_request(request, None, decode_replicas, blocks)
                if prefill_replicas is not None:
                    route = replace(route, kind=RouteKind.LOCAL_PREFILL, reason=local_reason)
            else:
                route = self.scheduler.route_request(request, prefill_replicas, decode_replicas, blocks)
            if route_span.recording:
                route_span.set_attributes(
                    {
                        "route.kind": route.kind,
                        "route.reason": route.reason,
                        "route.decode_replica": route.decode_replica,
                        "route.prefill_replica": route.prefill_replica,
                        "route.predicted_cached_tokens": route.predicted_cached_tokens,
                    }
                )
        except BaseException as e:
            route_span.record_error(e)
            raise
        finally:
            route_span.end()
        decided = self.clock() - start
        self.metrics.decision_seconds.observe(decided)
        self.metrics.hop_seconds.labels("route").observe(decided)
        trace.route = route
        self.metrics.route_decisions.labels(route.kind.value, route.reason.value if route.reason else "").inc()
        if route.balanced:
            self.metrics.balance_guard_routes.inc()
        try:
            kv = None
            concurrent_with = None
            prefill_accounted = False
            if route.remote_prefill:
                view = _view(prefill_replicas or (), route.prefill_replica)
                if _is_concurrent(view):
                    concurrent_with = view
                else:
                    kv = await self._remote_prefill(request.for_prefill(route.prefill_replica), view, trace)
                    self.scheduler.on_prefill_done(request.request_id)
                    prefill_accounted = True
            decode = self._decode(
                request,
                request.for_decode(route.decode_replica, kv),
                _view(live_decode, route.decode_replica),
                trace,
                concurrent_with,
                prefill_accounted,
            )
            async for chunk in decode:
                yield chunk
        finally:
            self.scheduler.on_request_finished(request.request_id)

    async def _decode(
        self,
        original: EngineRequest,
        request: EngineRequest,
        view: ReplicaView | None,
        trace: RequestTrace,
        concurrent_with: ReplicaView | None = None,
        prefill_accounted: bool = False,
    ) -> AsyncIterator[EngineChunk]:
        """Stream `request` from its decode replica (`view`, as routed); `concurrent_with` is a
        CONCURRENT prefill replica to hand the prompt's KV over from while the decode runs.
        `prefill_accounted`: the scheduler was told the prompt is computed (a remote prefill)."""
        generated: list[int] = []
        sent_text = ""
        failed: set[str] = set()
        failed_prefills: set[str] = set()
        while True:
            needs_prefill = request.kv_transfer is None and not _prefills_locally(view)
            if concurrent_with is None and needs_prefill:
                concurrent_with = self._fallback_prefill_view(failed_prefills)
            source = (
                self.decode_pool.generate(request, view)
                if concurrent_with is None
                else self._concurrent_handoff(request, view, concurrent_with, trace)
            )
            sent = self.clock()
            try:
                async with contextlib.aclosing(source) as chunks:
                    async for chunk in chunks:
                        if chunk.num_prompt_tokens:
                            if not trace.continuations:  # once per request: a continuation's first chunk is not TTFT
                                self.metrics.hop_seconds.labels("first_chunk").observe(self.clock() - sent)
                            if not prefill_accounted:
                                self.scheduler.on_prefill_done(original.request_id)
                                prefill_accounted = True
                        generated.extend(chunk.token_ids)
                        if trace.continuations and self.detokenize is not None:
                            chunk = replace(chunk, text=self._continued_text(generated, sent_text, chunk.finished))
                        sent_text += chunk.text
                        yield chunk
                return
            except EngineRequestRejected:
                raise  # the request is at fault, not the replica
            except _ConcurrentPrefillFailed as e:
                failed_prefills.add(e.prefill_replica)
                concurrent_with = None  # the decode replica prefills itself, or another prefill replica does
                continue
            except StreamParked:
                # The client reads again (it asked for the next chunk); no replica is at fault.
                trace.parks += 1
                self.metrics.parked_streams.inc()
                trace.span.add_event("parked", {"replica": request.target_replica, "after_tokens": len(generated)})
                request, view = await self._migrate(original, generated, failed, trace.continuations)
                concurrent_with = None
                continue
            except Exception as e:
                if (
                    trace.migrations >= self.max_migrations
                    or len(generated) >= original.sampling.max_tokens
                    or not original.resumable_after(generated)
                ):
                    raise
                trace.migrations += 1
                self.metrics.migrations.inc()
                trace.span.add_event("migration", {"replica": request.target_replica, "after_tokens": len(generated)})
                if request.target_replica is not None:
                    failed.add(request.target_replica)
                    self._set_aside(request.target_replica)
                log.warning(
                    "decode of %s failed after %d tokens (%s: %s); migrating (attempt %d)",
                    original.request_id,
                    len(generated),
                    type(e).__name__,
                    e,
                    trace.migrations,
                )
                request, view = await self._migrate(original, generated, failed, trace.continuations)
                concurrent_with = None

    # -- replicas set aside after a failed stream ---------------------------------

    def _trusted(self, views: list[ReplicaView]) -> list[ReplicaView]:
        """The decode pool's replicas (`views`) less those set aside; all of them when none is left."""
        if not self._suspect_until:
            return views
        now = self.clock()
        self._suspect_until = {r: t for r, t in self._suspect_until.items() if t > now}
        trusted = [v for v in views if v.replica_id not in self._suspect_until]
        return trusted or views

    def _set_aside(self, replica_id: str) -> None:
        if replica_id not in self._suspect_until:
            self.metrics.decode_replicas_set_aside.inc()
            log.warning("decode replica %s failed a stream: no new requests for %.0f s", replica_id, self.suspect_s)
        self._suspect_until[replica_id] = self.clock() + self.suspect_s

    def _continued_text(self, generated: list[int], sent_text: str, finished: bool) -> str:
        """What the uninterrupted stream would add now: the text of every token
        so far past what was sent, held back while it ends in an incomplete
        character (as vLLM's incremental detokenizer does)."""
        text = self.detokenize(generated)
        if not finished and text.endswith("\ufffd"):
            return ""
        return text[len(sent_text) :]

    async def _migrate(
        self, original: EngineRequest, generated: list[int], failed: set[str], attempt: int
    ) -> tuple[EngineRequest, ReplicaView | None]:
        """The continuation (engine request `attempt` + 1), routed to a decode replica that has not failed it,
        and that replica."""
        continued = original.continued(generated, attempt)
        candidates = await self._migration_candidates(failed)
        route = self.scheduler.route_request(continued, None, candidates)
        self.scheduler.on_request_finished(continued.request_id)  # accounted under the original id
        return continued.for_decode(route.decode_replica, None), _view(candidates, route.decode_replica)

    async def _migration_candidates(self, failed: set[str]) -> list[ReplicaView]:
        """Replicas that have not failed this stream, those not set aside first.
        None: wait up to `migration_wait_s` for one to appear, then every replica."""
        deadline = self.clock() + self.migration_wait_s
        while True:
            live = self.decode_pool.replicas()
            untried = [v for v in self._trusted(live) if v.replica_id not in failed] or [
                v for v in live if v.replica_id not in failed
            ]
            if untried or self.clock() >= deadline:
                return untried or live
            await asyncio.sleep(MIGRATION_POLL_S)

    # -- concurrent KV handoff (KVHandoff.CONCURRENT) -------------------------

    def _fallback_prefill_view(self, exclude: set[str]) -> ReplicaView:
        """A CONCURRENT prefill replica for a decode engine that cannot prefill
        locally, drawn from those not yet failed for this request."""
        views = self.prefill_pool.replicas() if self.prefill_pool is not None else []
        candidates = [v for v in views if _is_concurrent(v) and v.replica_id not in exclude]
        if not candidates:
            raise EngineError("the decode replica cannot prefill locally and no prefill replica is left to do it")
        return self.rng.choice(candidates)

    async def _concurrent_handoff(
        self, request: EngineRequest, decode: ReplicaView | None, prefill: ReplicaView, trace: RequestTrace
    ) -> AsyncIterator[EngineChunk]:
        """Prefill on `prefill` and decode `request` at once, through a fresh
        rendezvous. Raises `_ConcurrentPrefillFailed` (decode aborted) when the
        prefill fails or times out before the decode stream yields a chunk; a
        prefill failing after that is moot (the decode already has the KV)."""
        assert prefill.info is not None
        kv = rendezvous_transfer(prefill.info, len(request.prompt_token_ids), self.rng.getrandbits(BOOTSTRAP_ROOM_BITS))
        prefill_call = asyncio.ensure_future(
            self._remote_prefill(
                replace(request.for_prefill(prefill.replica_id, samples_first_token=True), kv_transfer=kv),
                prefill,
                trace,
            )
        )
        try:
            decoding = self.decode_pool.generate(replace(request, kv_transfer=kv), decode)
            async with contextlib.aclosing(decoding) as chunks:
                first = asyncio.ensure_future(anext(chunks))
                try:
                    await asyncio.wait({prefill_call, first}, return_when=asyncio.FIRST_COMPLETED)
                    if not first.done() and prefill_call.result() is None:
                        raise _ConcurrentPrefillFailed(prefill.replica_id)
                    chunk = await first
                except StopAsyncIteration:
                    return
                except BaseException:
                    if not first.done():
                        first.cancel()  # aborts the decode request on its replica
                        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                            await first
                    raise
                yield chunk
                async for chunk in chunks:
                    yield chunk
            await prefill_call  # done by now in practice: the decode had the KV
        finally:
            if not prefill_call.done():
                prefill_call.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await prefill_call

    # -- sequential KV handoff (KVHandoff.AFTER_PREFILL) ------------------------

    async def _remote_prefill(
        self, request: EngineRequest, view: ReplicaView | None, trace: RequestTrace
    ) -> KVTransfer | None:
        """Run a prefill request on its replica (`view`); None (and a counted fallback) when it fails or times out."""
        span = trace.span.child("remote_prefill", {"prefill.replica": request.target_replica})
        try:
            return await self._prefill_on(request, view, trace, span)
        except BaseException as e:
            span.record_error(e)
            raise
        finally:
            span.end()

    async def _prefill_on(
        self, request: EngineRequest, view: ReplicaView | None, trace: RequestTrace, span: Span
    ) -> KVTransfer | None:
        assert self.prefill_pool is not None
        start = self.clock()
        try:
            result = await asyncio.wait_for(self.prefill_pool.prefill(request, view), self.prefill_timeout_s)
        except EngineRequestRejected:
            raise  # the request itself is invalid; a local prefill would refuse it too
        except TimeoutError:
            trace.fallback = FallbackReason.TIMEOUT
        except Exception as e:  # a dead or failing prefill replica
            span.record_error(e)
            log.warning(
                "remote prefill of %s failed (%s: %s); prefilling on the decode replica",
                request.request_id,
                type(e).__name__,
                e,
            )
            trace.fallback = FallbackReason.ERROR
        else:
            took = self.clock() - start
            self.metrics.prefill_latency.observe(took)
            self.metrics.hop_seconds.labels("prefill").observe(took)
            self.metrics.kv_handoffs.inc()
            self.metrics.kv_handoff_blocks.inc(result.kv_transfer.num_blocks)
            trace.prefill = result
            span.set_attributes(
                {"prefill.cached_tokens": result.num_cached_tokens, "prefill.kv_blocks": result.kv_transfer.num_blocks}
            )
            return result.kv_transfer
        self.metrics.prefill_fallbacks.labels(trace.fallback.value).inc()
        span.set_attributes({"prefill.fallback": trace.fallback})
        return None
