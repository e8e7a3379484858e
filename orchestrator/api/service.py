"""Completions and chat completions: validate, tokenize, run, format.

    body -> validated request -> token ids -> EngineRequest
         -> RequestPath.stream -> whole JSON response, or SSE events

Everything a client can get wrong is rejected here, with an OpenAI-style
error, before any engine sees the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from orchestrator.api import sse
from orchestrator.api.admission import AdmissionGate
from orchestrator.api.errors import APIError, bad_request, from_validation_error, model_not_found, server_error
from orchestrator.api.protocol import ChatCompletionRequest, CompletionRequest
from orchestrator.api.responses import (
    Endpoint,
    ResponseHeader,
    delta_chunk,
    role_chunk,
    usage,
    usage_chunk,
    whole_response,
)
from orchestrator.config import LimitsConfig
from orchestrator.engines.base import EngineRequestRejected
from orchestrator.messages import CompletionTotals, EngineChunk, EngineRequest, SamplingSpec
from orchestrator.metrics import FrontendMetrics
from orchestrator.prompts import PromptRenderer
from orchestrator.request_path import RequestPath, RequestTrace
from orchestrator.routing.shape import ShapeRouter


@dataclass(frozen=True)
class ModelCard:
    name: str
    max_model_len: int
    created: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.name,
            "object": "model",
            "created": self.created,
            "owned_by": "orchestrator",
            "max_model_len": self.max_model_len,
        }


@dataclass(frozen=True)
class PreparedRequest:
    endpoint: Endpoint
    header: ResponseHeader
    engine_request: EngineRequest
    stream: bool
    include_usage: bool
    arrival: float
    return_token_ids: bool = False


def _sampling(req: CompletionRequest | ChatCompletionRequest, max_tokens: int) -> SamplingSpec:
    return SamplingSpec(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=None if req.top_k in (None, -1, 0) else req.top_k,
        min_p=req.min_p or 0.0,
        seed=req.seed,
        stop=tuple(req.stop or ()),
        stop_token_ids=tuple(req.stop_token_ids or ()),
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=1.0 if req.repetition_penalty is None else req.repetition_penalty,
    )


class _Slot:
    """One admitted request's place in the gate; released exactly once."""

    def __init__(self, gate: AdmissionGate) -> None:
        self._gate = gate
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._gate.leave()


def _cause(e: BaseException) -> str:
    """The message of the error a replica raised, without the remote traceback
    the transport may wrap around it."""
    cause = getattr(e, "cause", None)
    return str(cause if isinstance(cause, BaseException) else e)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _parse_json(raw: bytes) -> Any:
    """Strict JSON: no NaN or infinities (spelled or by overflow). Every failure is a 400."""
    try:
        return json.loads(raw, parse_float=_finite_float, parse_constant=_no_constant)
    except RecursionError:  # the body's size is bounded, its depth is not
        raise bad_request("request body is nested too deeply") from None
    except ValueError as e:  # malformed, invalid UTF-8, NaN/Infinity, integers past Python's digit limit
        raise bad_request(f"request body is not valid JSON: {str(e)[:200]}") from None


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
    ) -> None:
        self.model = model
        self.renderer = renderer
        # `path` serves every request, unless `shape_router` is given: then it
        # names, per request, the group whose path in `group_paths` serves it.
        self.path = path
        self.group_paths = dict(group_paths or {})
        self.shape_router = shape_router
        self.metrics = metrics
        self.limits = limits
        self.gate = gate or AdmissionGate(limit=1 << 30)
        self.retry_after_s = retry_after_s
        self.clock = clock
        self.wall_clock = wall_clock
        self.new_id = new_id

    # -- public ---------------------------------------------------------------

    async def handle(self, endpoint: Endpoint, raw_body: bytes) -> dict[str, Any] | AsyncIterator[str]:
        """A whole response body, or (for `stream: true`) an iterator of SSE events.
        Raises APIError for anything the client must fix, and 429 when the
        frontend is at its admission limit."""
        if not self.gate.try_enter():
            self.metrics.requests.labels(endpoint.value, "rejected").inc()
            raise APIError(
                429,
                "The server is at capacity; retry later.",
                type="requests",
                code="rate_limit_exceeded",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        slot = _Slot(self.gate)
        try:
            prepared = await self._prepare(endpoint, _parse_json(raw_body))
        except APIError:
            slot.release()
            self.metrics.requests.labels(endpoint.value, "client_error").inc()
            raise
        except BaseException:
            slot.release()
            raise
        if prepared.stream:
            stream = self._sse(prepared, slot)
            weakref.finalize(stream, slot.release)  # a stream never iterated still gives its slot back
            return stream
        try:
            return await self._whole(prepared)
        finally:
            slot.release()

    # -- preparation ----------------------------------------------------------

    async def _prepare(self, endpoint: Endpoint, body: Any) -> PreparedRequest:
        arrival = self.clock()
        if not isinstance(body, dict):
            raise bad_request("request body must be a JSON object")
        model_cls = CompletionRequest if endpoint is Endpoint.COMPLETIONS else ChatCompletionRequest
        try:
            req = model_cls.model_validate(body)
        except ValidationError as e:
            raise from_validation_error(e) from None
        unsupported = req.unsupported_fields()
        if unsupported:
            raise bad_request(
                f"{unsupported[0]} is not supported by this server", param=unsupported[0], code="unsupported"
            )
        self._check_stops(req.stop or [])
        if req.model != self.model.name:
            raise model_not_found(req.model)

        if isinstance(req, CompletionRequest):
            if isinstance(req.prompt, list):
                self._check_token_ids(req.prompt)
                prompt_ids = self.renderer.completion_prompt(req.prompt)  # no tokenizer: no thread hop
            else:
                prompt_ids = await asyncio.to_thread(self.renderer.completion_prompt, req.prompt)
            requested, prompt_param = req.max_tokens, "prompt"
        else:
            messages = [{"role": m.role, "content": m.text()} for m in req.messages]
            prompt_ids = await asyncio.to_thread(self.renderer.chat_prompt, messages)
            requested, prompt_param = req.requested_max_tokens, "messages"
        max_tokens = self._check_lengths(len(prompt_ids), requested, prompt_param)

        rid = self.new_id()
        prefix = "cmpl" if endpoint is Endpoint.COMPLETIONS else "chatcmpl"
        self.metrics.hop_seconds.labels("prepare").observe(self.clock() - arrival)
        return PreparedRequest(
            endpoint=endpoint,
            header=ResponseHeader(id=f"{prefix}-{rid}", created=int(self.wall_clock()), model=self.model.name),
            engine_request=EngineRequest(
                request_id=rid, prompt_token_ids=prompt_ids, sampling=_sampling(req, max_tokens)
            ),
            stream=req.stream,
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
            arrival=arrival,
            return_token_ids=req.return_token_ids,
        )

    def _check_stops(self, stops: list[str]) -> None:
        lim = self.limits
        if len(stops) > lim.max_stop_strings:
            raise bad_request(f"at most {lim.max_stop_strings} stop strings are allowed", param="stop")
        if any(len(s) > lim.max_stop_string_chars for s in stops):
            raise bad_request(f"stop strings may have at most {lim.max_stop_string_chars} characters", param="stop")

    def _check_token_ids(self, token_ids: list[int]) -> None:
        vocab = self.renderer.vocab_size
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(f"token id {bad} is outside the vocabulary (0..{vocab - 1})", param="prompt")

    def _check_lengths(self, prompt_len: int, requested: int | None, prompt_param: str) -> int:
        limit = self.model.max_model_len
        if prompt_len == 0:
            raise bad_request("the prompt is empty", param=prompt_param)
        max_prompt = self.limits.max_prompt_tokens
        if max_prompt is not None and prompt_len > max_prompt:
            raise bad_request(
                f"the prompt has {prompt_len} tokens; this server accepts at most {max_prompt}",
                param=prompt_param,
                code="prompt_too_long",
            )
        max_output = self.limits.max_output_tokens
        if requested is not None and max_output is not None and requested > max_output:
            raise bad_request(f"max_tokens may be at most {max_output} on this server", param="max_tokens")
        if prompt_len >= limit:
            raise bad_request(
                f"This model's maximum context length is {limit} tokens; the prompt has {prompt_len} tokens "
                "and leaves no room for a completion.",
                param=prompt_param,
                code="context_length_exceeded",
            )
        if requested is None:
            return min(limit - prompt_len, max_output or limit)
        if prompt_len + requested > limit:
            raise bad_request(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_len + requested} tokens ({prompt_len} in the prompt, {requested} for the completion).",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return requested

    # -- running --------------------------------------------------------------

    def _path_for(self, request: EngineRequest) -> RequestPath:
        """The path of the group the shape router names. A group with no live
        decode replica (starting, gone) hands its request to the unique group;
        the counter records the group that serves it."""
        if self.shape_router is None:
            return self.path
        decision = self.shape_router.route(request)
        group = decision.group
        if not self.group_paths[group].decode_pool.replicas():
            fallback = self.shape_router.config.unique_group
            if self.group_paths[fallback].decode_pool.replicas():
                group = fallback
        self.metrics.shape_decisions.labels(group, decision.shape.value).inc()
        self.metrics.shape_prefix_reuse.observe(decision.reuse)
        return self.group_paths[group]

    async def _chunks(self, p: PreparedRequest, trace: RequestTrace) -> AsyncIterator[EngineChunk]:
        """The engine's chunks, with latency metrics observed as they pass."""
        last = None
        path = self._path_for(p.engine_request)
        async with contextlib.aclosing(path.stream(p.engine_request, trace)) as chunks:
            async for chunk in chunks:
                n = len(chunk.token_ids)
                if n:
                    now = self.clock()
                    if last is None:
                        self.metrics.ttft.observe(now - p.arrival)
                    else:
                        for _ in range(n):
                            self.metrics.itl.observe((now - last) / n)
                    last = now
                yield chunk

    def _finish(self, p: PreparedRequest, totals: CompletionTotals, trace: RequestTrace) -> dict[str, Any]:
        self.metrics.e2e.observe(self.clock() - p.arrival)
        self.metrics.prompt_tokens.inc(len(p.engine_request.prompt_token_ids))
        self.metrics.generation_tokens.inc(len(totals.token_ids))
        self.metrics.cached_prompt_tokens.inc(totals.num_cached_tokens)
        self.metrics.requests.labels(p.endpoint.value, "success").inc()
        # Prompt tokens a cache spared: on the prefill replica when it computed
        # the prompt, else on the decode replica (whose count would otherwise
        # include the transferred tokens).
        cached = trace.prefill.num_cached_tokens if trace.prefill is not None else totals.num_cached_tokens
        self.metrics.engine_cached_tokens.inc(cached)
        if trace.route is not None:
            self.metrics.predicted_cached_tokens.inc(trace.route.predicted_cached_tokens)
        return usage(len(p.engine_request.prompt_token_ids), len(totals.token_ids), cached)

    async def _whole(self, p: PreparedRequest) -> dict[str, Any]:
        totals, trace = CompletionTotals(), RequestTrace()
        try:
            async for chunk in self._chunks(p, trace):
                totals.add(chunk)
        except EngineRequestRejected as e:
            self.metrics.requests.labels(p.endpoint.value, "client_error").inc()
            raise bad_request(_cause(e)) from None
        except asyncio.CancelledError:
            self.metrics.requests.labels(p.endpoint.value, "cancelled").inc()
            raise
        except Exception as e:
            self.metrics.requests.labels(p.endpoint.value, "server_error").inc()
            raise server_error(f"generation failed: {_cause(e)}") from None
        prompt_ids = p.engine_request.prompt_token_ids if p.return_token_ids else None
        return whole_response(p.endpoint, p.header, totals, self._finish(p, totals, trace), prompt_ids)

    async def _sse(self, p: PreparedRequest, slot: _Slot) -> AsyncIterator[str]:
        totals, trace = CompletionTotals(), RequestTrace()
        try:
            async for event in self._sse_events(p, totals, trace):
                yield event
        finally:
            slot.release()

    async def _sse_events(
        self, p: PreparedRequest, totals: CompletionTotals, trace: RequestTrace
    ) -> AsyncIterator[str]:
        try:
            ids = p.return_token_ids
            prompt_ids = p.engine_request.prompt_token_ids if ids else None
            if p.endpoint is Endpoint.CHAT:
                yield sse.event(role_chunk(p.header, prompt_ids))
                prompt_ids = None
            async for chunk in self._chunks(p, trace):
                totals.add(chunk)
                if chunk.text or chunk.finish_reason is not None or (ids and chunk.token_ids):
                    token_ids = chunk.token_ids if ids else None
                    yield sse.event(
                        delta_chunk(p.endpoint, p.header, chunk.text, chunk.finish_reason, token_ids, prompt_ids)
                    )
                    prompt_ids = None
        except (asyncio.CancelledError, GeneratorExit):
            self.metrics.requests.labels(p.endpoint.value, "cancelled").inc()
            raise
        except Exception as e:
            outcome = "client_error" if isinstance(e, EngineRequestRejected) else "server_error"
            self.metrics.requests.labels(p.endpoint.value, outcome).inc()
            err = (
                bad_request(_cause(e)) if outcome == "client_error" else server_error(f"generation failed: {_cause(e)}")
            )
            yield sse.event(err.body())
            yield sse.DONE
            return
        usage_body = self._finish(p, totals, trace)
        if p.include_usage:
            yield sse.event(usage_chunk(p.endpoint, p.header, usage_body))
        yield sse.DONE
