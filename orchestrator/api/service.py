"""Completions and chat completions: admit, prepare, run, format.

body -> admitted (AdmissionGate: 429 past the limit)
     -> RequestPreparer.prepare -> PreparedRequest (a plan per choice)
     -> ChoiceFanOut: each choice on its request path -> chunks
     -> ChoiceState per choice -> whole JSON response, or SSE events

With tracing on (orchestrator/tracing.py), a `request` span (under the client's
`traceparent`) covers it all: `prepare` (admission and preparation), then a
`choice` span per choice (fan_out.py) with its `route` and `remote_prefill`
(request_path.py). Every engine request carries the request span's traceparent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from orchestrator.api import sse
from orchestrator.api.admission import AdmissionGate, Slot
from orchestrator.api.choice_state import ChoiceState
from orchestrator.api.errors import APIError, bad_request, server_error
from orchestrator.api.fan_out import ChoiceFanOut
from orchestrator.api.lora_admin import LoraAdmin
from orchestrator.api.preparation import RequestPreparer
from orchestrator.api.prepared import ModelCard, PreparedRequest
from orchestrator.api.reasoning_parsers import ReasoningParser
from orchestrator.api.responses import Endpoint, chat_delta, chunk, role_chunk, usage, usage_chunk, whole_response
from orchestrator.api.tool_parsers import ToolCallParser
from orchestrator.api.traffic_admission import TrafficAdmission
from orchestrator.config import LimitsConfig, TrafficConfig
from orchestrator.engines.base import EngineRequestRejected
from orchestrator.lora.catalog import AdapterCatalog
from orchestrator.metrics import FrontendMetrics
from orchestrator.prompts import PromptRenderer
from orchestrator.request_path import RequestPath
from orchestrator.routing.shape import ShapeRouter
from orchestrator.tracing import NOOP_TRACER, Span, Tracer
from orchestrator.traffic.policy import DEFAULT_TENANT, TrafficPolicy, TrafficRefusal

__all__ = ["CompletionService", "ModelCard"]


def _cause(e: BaseException) -> str:
    """The message of the error a replica raised, without the remote traceback
    the transport may wrap around it."""
    cause = getattr(e, "cause", None)
    return str(cause if isinstance(cause, BaseException) else e)


class CompletionService:
    def __init__(
        self,
        model: ModelCard,
        renderer: PromptRenderer,
        path: RequestPath,
        metrics: FrontendMetrics,
        limits: LimitsConfig = LimitsConfig(),
        gate: AdmissionGate | None = None,
        retry_after_s: int = 1,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
        group_paths: Mapping[str, RequestPath] | None = None,
        shape_router: ShapeRouter | None = None,
        tool_parser: ToolCallParser | None = None,
        reasoning_parser: ReasoningParser | None = None,
        tracer: Tracer = NOOP_TRACER,  # tracing off
        catalog: AdapterCatalog | None = None,  # the model's LoRA adapters; None: none
        policy: TrafficPolicy | None = None,  # SLO classes and tenants; None: none configured
    ) -> None:
        self.model = model
        self.policy = policy or TrafficPolicy(TrafficConfig(), gate.limit if gate is not None else 1 << 30)
        # The class gate runs where classes or tenant limits are configured; else a request only resolves.
        limited = any(t.max_in_flight or t.tokens_per_minute for t in self.policy.tenants.values())
        self.traffic = TrafficAdmission(self.policy, metrics, retry_after_s) if self.policy.enabled or limited else None
        self.catalog = catalog
        self.lora_admin = LoraAdmin(catalog)
        self.tracer = tracer
        self.metrics = metrics
        self.gate = gate or AdmissionGate(limit=1 << 30)
        self.retry_after_s = retry_after_s
        self.clock = clock
        self.preparer = RequestPreparer(
            model, renderer, metrics, limits, clock, wall_clock, new_id, tool_parser, reasoning_parser, catalog
        )
        self.fan_out = ChoiceFanOut(path, metrics, clock, group_paths, shape_router)

    def model_cards(self) -> list[dict[str, Any]]:
        """/v1/models: the base model, then each adapter with it as parent."""
        adapters = self.catalog.adapters() if self.catalog is not None else []
        return [self.model.to_dict(), *(self.model.adapter_card(a) for a in adapters)]

    async def handle(
        self,
        endpoint: Endpoint,
        raw_body: bytes,
        traceparent: str | None = None,
        tenant: str = DEFAULT_TENANT,
        slo_class: str | None = None,
        framed: bool = True,
    ) -> dict[str, Any] | AsyncIterator[Any]:
        """A whole response body, or (for `stream: true`) an iterator of SSE events; `framed` False: of the
        events' payloads (each chunk's dict, or an error's body, ending where `[DONE]` would be sent), for the
        APIs that answer a stream in their own events (`anthropic_messages`, `openai_responses_stream`).
        Raises APIError for anything the client must fix, and 429 when the
        frontend, the request's SLO class or its tenant is at its limit. `traceparent`: the client's W3C trace
        context, which the request's span continues (tracing on); `tenant`: whose API key it came with;
        `slo_class`: the class its `x-slo-class` header names."""
        span = self.tracer.start("request", traceparent, {"endpoint": endpoint.value, "model": self.model.name})
        stage = span.child("prepare")
        try:
            prepared, slot = await self._admit(endpoint, raw_body, tenant, slo_class)
        except BaseException as e:
            for s in (stage, span):
                s.record_error(e)
                s.end()
            raise
        if stage.recording:
            stage.set_attributes({"prompt_tokens": sum(map(len, prepared.prompts)), "choices": len(prepared.choices)})
            span.set_attributes({"stream": prepared.stream, "choices": len(prepared.choices)})
        stage.end()
        if span.traceparent is not None:
            prepared = _with_trace_context(prepared, span.traceparent)
        if prepared.stream:
            stream = self._stream(prepared, slot, span, framed)
            weakref.finalize(stream, slot.release)  # a stream never iterated still gives its slot back
            if span.recording:
                weakref.finalize(stream, span.end)  # and ends its span
            return stream
        with _held(slot, span):
            return await self._whole(prepared, slot, span)

    async def _admit(
        self, endpoint: Endpoint, raw_body: bytes, tenant: str, slo_class: str | None
    ) -> tuple[PreparedRequest, Slot]:
        """The prepared request and its admission slot, widened to its engine streams, holding its class."""
        if not self.gate.try_enter():
            raise self._at_capacity(endpoint)
        slot = Slot(self.gate)
        try:
            prepared = await self.preparer.prepare(endpoint, raw_body)
            prepared = await self._admit_class(prepared, slot, tenant, slo_class)
        except APIError as e:
            slot.release()
            outcome = "rejected" if e.status == 429 else "client_error"
            self.metrics.requests.labels(endpoint.value, outcome).inc()
            raise
        except BaseException:
            slot.release()
            raise
        if not slot.widen(len(prepared.choices)):  # prompts × n engine streams
            slot.spent(0)  # nothing ran: the tenant's whole charge back
            slot.release()
            raise self._at_capacity(endpoint)
        return prepared, slot

    async def _admit_class(self, p: PreparedRequest, slot: Slot, tenant: str, slo_class: str | None) -> PreparedRequest:
        """`p` in its SLO class (its engine requests at the class's priority), once the class gate admits it."""
        try:
            resolved = self.policy.resolve(tenant, slo_class, p.slo_class, p.priority)
        except TrafficRefusal as e:
            kind = "permission_error" if e.status == 403 else "invalid_request_error"
            raise APIError(e.status, e.message, type=kind, param=e.param, code=e.code) from None
        if self.traffic is not None:
            tokens = sum(len(c.request.prompt_token_ids) + c.request.sampling.max_tokens for c in p.choices)
            slot.attach(await self.traffic.enter(resolved, len(p.choices), tokens))
        if not self.policy.enabled:
            return p
        choices = p.choices
        if resolved.engine_priority != 0:
            choices = tuple(replace(c, request=replace(c.request, priority=resolved.engine_priority)) for c in choices)
        return replace(p, choices=choices, traffic=resolved)

    def _at_capacity(self, endpoint: Endpoint) -> APIError:
        self.metrics.requests.labels(endpoint.value, "rejected").inc()
        return APIError(
            429,
            "The server is at capacity; retry later.",
            type="requests",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(self.retry_after_s)},
        )

    def _finish(self, p: PreparedRequest, states: list[ChoiceState], slot: Slot, span: Span) -> dict[str, Any]:
        self.metrics.e2e.observe(self.clock() - p.arrival)
        prompt_tokens = sum(len(ids) for ids in p.prompts)
        generated = sum(len(s.totals.token_ids) for s in states)
        slot.spent(sum(len(c.request.prompt_token_ids) for c in p.choices) + generated)
        if p.traffic is not None:
            self.metrics.class_tokens.labels(p.traffic.cls.name, p.traffic.tenant.name).inc(generated)
        leads = [s for s in states if s.plan.lead]
        self.metrics.prompt_tokens.inc(prompt_tokens)
        self.metrics.generation_tokens.inc(generated)
        self.metrics.cached_prompt_tokens.inc(sum(s.totals.num_cached_tokens for s in leads))
        self.metrics.requests.labels(p.endpoint.value, "success").inc()
        # Prompt tokens a cache spared: on the prefill replica when it computed
        # the prompt, else on the decode replica (whose count would otherwise
        # include the transferred tokens). Counted once a prompt, at its lead.
        cached = sum(s.cached_tokens() for s in leads)
        self.metrics.engine_cached_tokens.inc(cached)
        for s in leads:
            if s.trace.route is not None:
                self.metrics.predicted_cached_tokens.inc(s.trace.route.predicted_cached_tokens)
        if span.recording:
            span.set_attributes(
                {"prompt_tokens": prompt_tokens, "output_tokens": generated, "cached_prompt_tokens": cached}
            )
        return usage(prompt_tokens, generated, cached)

    def _rejected(self, p: PreparedRequest, e: EngineRequestRejected) -> APIError:
        """An engine's refusal as a 400, naming the constraint's field when the engine's grammar compiler refused it."""
        cause = _cause(e)
        param = p.options.constraint_param if "grammar" in cause.lower() else None
        return bad_request(cause, param=param)

    async def _whole(self, p: PreparedRequest, slot: Slot, span: Span) -> dict[str, Any]:
        states = [ChoiceState(plan, p) for plan in p.choices]
        try:
            async for index, chunk in self.fan_out.choice_chunks(p, states, span):
                states[index].totals.add(chunk)
        except EngineRequestRejected as e:
            self.metrics.requests.labels(p.endpoint.value, "client_error").inc()
            raise self._rejected(p, e) from None
        except asyncio.CancelledError:
            self.metrics.requests.labels(p.endpoint.value, "cancelled").inc()
            raise
        except Exception as e:
            self.metrics.requests.labels(p.endpoint.value, "server_error").inc()
            raise server_error(f"generation failed: {_cause(e)}") from None
        usage_body = self._finish(p, states, slot, span)
        chat_prompt_ids, chat_prompt_logprobs = None, None
        if p.endpoint is Endpoint.CHAT:
            chat_prompt_ids = list(p.prompts[0]) if p.options.return_token_ids else None
            chat_prompt_logprobs = states[0].prompt_logprobs()
        choices = [s.whole_choice() for s in states]
        return whole_response(
            p.endpoint, p.header, choices, usage_body, chat_prompt_ids, chat_prompt_logprobs, p.options.prompt_text
        )

    async def _stream(self, p: PreparedRequest, slot: Slot, span: Span, framed: bool) -> AsyncIterator[Any]:
        """Each event's payload, as an SSE event when `framed` (then `[DONE]` at the end)."""
        states = [ChoiceState(plan, p) for plan in p.choices]
        with _held(slot, span):
            async for payload in self._payloads(p, states, slot, span):
                yield sse.event(payload) if framed else payload
            if framed:
                yield sse.DONE

    async def _payloads(
        self, p: PreparedRequest, states: list[ChoiceState], slot: Slot, span: Span
    ) -> AsyncIterator[dict[str, Any]]:
        try:
            if p.endpoint is Endpoint.CHAT:
                # Each choice's first chunk carries the prompt's ids and text when asked, as vLLM's.
                prompt_ids = list(p.prompts[0]) if p.options.return_token_ids else None
                for s in states:
                    role = role_chunk(p.header, s.plan.index, prompt_ids, p.options.role, p.options.prompt_text)
                    yield s.with_usage(role, p.continuous_usage)
                for s in states:  # the echoed last message, as vLLM sends it: one chunk after the roles
                    if s.plan.echo:
                        echo = chunk(p.endpoint, p.header, [chat_delta(s.plan.index, {"content": s.plan.echo}, None)])
                        yield s.with_usage(echo, p.continuous_usage)
            async for index, engine_chunk in self.fan_out.choice_chunks(p, states, span):
                ready = states[index].held.take(engine_chunk)
                choice = states[index].delta(ready) if ready is not None else None
                if choice is not None:
                    yield states[index].with_usage(chunk(p.endpoint, p.header, [choice]), p.continuous_usage)
        except (asyncio.CancelledError, GeneratorExit):
            self.metrics.requests.labels(p.endpoint.value, "cancelled").inc()
            raise
        except Exception as e:
            rejected = isinstance(e, EngineRequestRejected)
            span.record_error(e)
            self.metrics.requests.labels(p.endpoint.value, "client_error" if rejected else "server_error").inc()
            err = self._rejected(p, e) if rejected else server_error(f"generation failed: {_cause(e)}")
            yield err.body()
            return
        usage_body = self._finish(p, states, slot, span)
        if p.include_usage:
            yield usage_chunk(p.endpoint, p.header, usage_body)


def _with_trace_context(p: PreparedRequest, traceparent: str) -> PreparedRequest:
    """`p`, every engine request of it carrying `traceparent` (the request span's)."""
    choices = tuple(replace(c, request=replace(c.request, trace_context=traceparent)) for c in p.choices)
    return replace(p, choices=choices)


@contextlib.contextmanager
def _held(slot: Slot, span: Span) -> Iterator[None]:
    """While a response is produced: on leaving, its admission slot is released and its span ended (marked with
    the error or cancellation that ended it)."""
    try:
        yield
    except BaseException as e:
        span.record_error(e)
        raise
    finally:
        slot.release()
        span.end()
