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
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from orchestrator.api import sse
from orchestrator.api.admission import AdmissionGate
from orchestrator.api.chat_messages import TemplateTraits, content_text, template_messages
from orchestrator.api.errors import APIError, bad_request, from_validation_error, model_not_found, server_error
from orchestrator.api.logprobs import CompletionLogprobs, Unscored, chat_logprobs, prompt_logprobs_body
from orchestrator.api.protocol import ChatCompletionRequest, CompletionRequest
from orchestrator.api.reasoning_parsers import ReasoningParser
from orchestrator.api.responses import (
    Endpoint,
    ResponseHeader,
    chat_choice,
    chat_delta,
    chunk,
    completion_choice,
    role_chunk,
    usage,
    usage_chunk,
    whole_response,
)
from orchestrator.api.stream_interval import ChunkInterval
from orchestrator.api.tool_parsers import ToolCallParser
from orchestrator.api.tools import ToolMode, template_tools, tool_mode
from orchestrator.config import LimitsConfig
from orchestrator.engines.base import EngineRequestRejected
from orchestrator.messages import (
    CompletionTotals,
    EngineChunk,
    EngineRequest,
    FinishReason,
    PositionLogprobs,
    RepetitionDetection,
    SamplingSpec,
    StructuredOutput,
)
from orchestrator.metrics import FrontendMetrics
from orchestrator.prompts import ChatTemplateOptions, PromptRenderer
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
class ChoicePlan:
    """One choice of the answer. Prompt i's sample j is choice i * n + j; its
    seed is the request's + j (vLLM's rule for `n`). A prompt's first sample
    (`lead`) is routed; the others follow it to the decode replica that then
    holds the prompt's KV, and prefill there from its cache."""

    index: int
    request: EngineRequest
    prompt: int
    lead: bool
    # Written before the output: the prompt's text (completions' `echo`), or the
    # last message's content when it has the answer's role (chat's).
    echo: str = ""
    # Echo with logprobs: the prompt's first token's text (it has no log-probability).
    first_token: str = ""
    # An echo with max_tokens 0: the answer is the prompt alone (its text and log-probabilities); the one
    # token the engine sampled is left out of it, counted in usage and token ids as vLLM counts it.
    prompt_only: bool = False


@dataclass(frozen=True)
class OutputOptions:
    top_logprobs: int | None = None  # None: no log-probabilities
    return_token_ids: bool = False
    tools: ToolMode | None = None
    reasoning: ReasoningParser | None = None  # splits the model's thinking from its answer (chat)
    # The field a constraint came from, named when the engine rejects the constraint.
    constraint_param: str | None = None
    prompt_logprobs: bool = False  # the answer carries `prompt_logprobs`
    tokens_as_ids: bool = False  # log-probability tokens named "token_id:<id>"
    role: str = "assistant"  # chat: the answer's role
    # Chat with a reasoning parser and `include_reasoning: false`: the reasoning
    # is dropped, and with it logprobs and token ids, which would carry it.
    hide_reasoning: bool = False
    stream_interval: int = 1  # tokens an SSE event waits for, between a choice's first and last
    # Chat: the template's variables (chat_template_kwargs and the request's own), which a reasoning format may read.
    template_variables: tuple[tuple[str, Any], ...] = ()
    prompt_text: str | None = None  # chat with return_prompt_text: the rendered template, in the answer


@dataclass(frozen=True)
class PreparedRequest:
    endpoint: Endpoint
    header: ResponseHeader
    choices: tuple[ChoicePlan, ...]
    prompts: tuple[tuple[int, ...], ...]
    stream: bool
    include_usage: bool
    arrival: float
    # stream_options continuous_usage_stats (with include_usage): every event carries its choice's usage so far.
    continuous_usage: bool = False
    options: OutputOptions = OutputOptions()


def _sampling(
    req: CompletionRequest | ChatCompletionRequest,
    logprobs: int | None,
    prompt_logprobs: int | None,
    logit_bias: tuple[tuple[int, float], ...],
    structured: StructuredOutput | None,
    keep_special_tokens: bool,
    logprob_token_ids: tuple[int, ...] = (),
) -> SamplingSpec:
    """The request's sampling, once; each choice sets its own `max_tokens` and seed (`_for_choice`)."""
    return SamplingSpec(
        max_tokens=1,
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
        logprobs=logprobs,
        logprob_token_ids=logprob_token_ids or None,
        prompt_logprobs=prompt_logprobs,
        logit_bias=logit_bias,
        structured=structured,
        skip_special_tokens=req.skip_special_tokens and not keep_special_tokens,
        spaces_between_special_tokens=req.spaces_between_special_tokens,
        include_stop_str_in_output=req.include_stop_str_in_output,
        allowed_token_ids=tuple(req.allowed_token_ids) if req.allowed_token_ids is not None else None,
        bad_words=tuple(req.bad_words or ()),
        repetition_detection=(
            RepetitionDetection(**req.repetition_detection.model_dump()) if req.repetition_detection else None
        ),
        extra_args=tuple(
            (name, tuple(value) if isinstance(value, list) else value)
            for name, value in sorted((req.vllm_xargs or {}).items())
        ),
    )


def _for_choice(base: SamplingSpec, max_tokens: int, sample: int) -> SamplingSpec:
    """Sample j of a prompt: its seed is the request's + j (vLLM's rule for `n`)."""
    return replace(base, max_tokens=max_tokens, seed=None if base.seed is None else base.seed + sample)


def _constraint(req: CompletionRequest | ChatCompletionRequest) -> tuple[StructuredOutput | None, str | None]:
    """The output constraint a request asks for, and the field it came from."""
    if req.response_format is not None and (constraint := req.response_format.constraint()) is not None:
        return constraint, "response_format"
    if req.structured_outputs is not None:
        return req.structured_outputs.constraint(), "structured_outputs"
    return None, None


def _template_variables(req: ChatCompletionRequest) -> dict[str, Any]:
    """The template's variables as vLLM merges them: `chat_template_kwargs`,
    then the request's own fields where set (`documents`, `reasoning_effort`,
    and `enable_thinking` = effort is not "none", unless the kwargs set it)."""
    variables = dict(req.chat_template_kwargs or {})
    if req.documents is not None:
        variables["documents"] = req.documents
    if req.reasoning_effort is not None:
        variables["reasoning_effort"] = req.reasoning_effort
        variables.setdefault("enable_thinking", req.reasoning_effort != "none")
    return variables


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


def nesting_exceeds(value: Any, limit: int) -> bool:
    """Whether objects and arrays in `value` nest deeper than `limit` (the outermost is depth 1); no recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


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
    ) -> None:
        self.model = model
        self.renderer = renderer
        self.template_traits = TemplateTraits.of(renderer.template)  # how messages are given to the template
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
        self.tool_parser = tool_parser  # the model's tool-call format, for tool_choice "auto"
        self.reasoning_parser = reasoning_parser  # the model's thinking format (chat)

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
            body = _parse_json(raw_body)
            if nesting_exceeds(body, self.limits.max_json_depth):
                raise bad_request(f"request body is nested deeper than {self.limits.max_json_depth} levels")
            prepared = await self._prepare(endpoint, body)
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
            raise bad_request(unsupported[0].message, param=unsupported[0].param, code="unsupported")
        self._check_stops(req.stop or [])
        self._check_choices(req)
        if req.model != self.model.name:
            raise model_not_found(req.model)
        logit_bias = self._logit_bias(req.logit_bias)
        structured, constraint_param = _constraint(req)

        tools, keep_special, chat_echo, reasoning, hide_reasoning = None, False, "", None, False
        prompt_text: str | None = None
        variables: tuple[tuple[str, Any], ...] = ()
        if isinstance(req, CompletionRequest):
            prompts = await self._completion_prompts(req)
            requested, prompt_param, top = req.max_tokens, "prompt", req.logprobs
        else:
            try:
                tools = tool_mode(req.tools, req.effective_tool_choice, req.parallel_tool_calls, self.tool_parser)
            except ValueError as e:
                raise bad_request(str(e), param="tool_choice", code="unsupported") from None
            if tools is not None and tools.constraint is not None:
                structured, constraint_param = tools.constraint, "tools"
            keep_special = tools is not None and tools.parser is not None and tools.parser.keeps_special_tokens
            messages = template_messages(req.messages, self.template_traits)
            variables = tuple(_template_variables(req).items())
            options = ChatTemplateOptions(
                req.add_generation_prompt, req.continue_final_message, req.add_special_tokens, variables
            )
            try:
                prompt = await asyncio.to_thread(
                    self.renderer.chat_prompt, messages, template_tools(req.tools), options
                )
            except ValueError as e:
                raise bad_request(str(e), param="messages") from None
            prompts = [prompt.token_ids]
            prompt_text = prompt.text if req.return_prompt_text else None
            last = req.messages[-1]
            if req.echo and last.role == req.response_role:
                chat_echo = content_text(last)
            requested, prompt_param = req.requested_max_tokens, "messages"
            reasoning = self.reasoning_parser if structured is None else None  # a constrained output has none
            keep_special = keep_special or (reasoning is not None and reasoning.keeps_special_tokens)
            hide_reasoning = reasoning is not None and not req.include_reasoning
            # Hidden reasoning hides its logprobs too (as vLLM), so the engine is not asked for any.
            top = (req.top_logprobs or 0) if req.logprobs and not hide_reasoning else None

        rid = self.new_id()
        echo = isinstance(req, CompletionRequest) and req.echo
        prompt_only = echo and req.max_tokens == 0
        scored_echo = echo and top is not None  # the echoed prompt is scored too
        # vLLM's rule: an echo with logprobs scores the prompt with `logprobs`; a
        # stream carries prompt logprobs only as the echo's, so asks for none else.
        prompt_top = top if req.prompt_logprobs is None and scored_echo else req.prompt_logprobs
        if req.stream and not scored_echo:
            prompt_top = None
        self._check_token_ids(req.allowed_token_ids or [], "allowed_token_ids")
        scored_ids = self._logprob_token_ids(req, top)
        base = _sampling(req, top, prompt_top, logit_bias, structured, keep_special, scored_ids)
        if scored_ids:  # the answer lists every token the engine scored: the sampled one and these
            top = len(scored_ids) + (endpoint is not Endpoint.COMPLETIONS)
        prompts = [self._truncated(ids, req.truncate_prompt_tokens, req.truncation_side) for ids in prompts]
        plans = []
        for i, prompt_ids in enumerate(prompts):
            # An echo with max_tokens 0 (a prompt scored alone): the engine samples one token, left out (vLLM's).
            max_tokens = max(self._check_lengths(len(prompt_ids), requested, prompt_param), 1)
            echo_text = await asyncio.to_thread(self.renderer.text, prompt_ids) if echo else chat_echo
            first_token = self.renderer.text(prompt_ids[:1]) if scored_echo else ""
            for j in range(req.n):
                index = i * req.n + j
                request_id = rid if len(prompts) * req.n == 1 else f"{rid}-{index}"
                request = EngineRequest(
                    request_id, prompt_ids, _for_choice(base, max_tokens, j), cache_salt=req.cache_salt
                )
                plans.append(ChoicePlan(index, request, i, j == 0, echo_text, first_token, prompt_only))
        prefix = "cmpl" if endpoint is Endpoint.COMPLETIONS else "chatcmpl"
        chat = isinstance(req, ChatCompletionRequest)
        self.metrics.hop_seconds.labels("prepare").observe(self.clock() - arrival)
        return PreparedRequest(
            endpoint=endpoint,
            header=ResponseHeader(
                id=f"{prefix}-{req.request_id or rid}", created=int(self.wall_clock()), model=self.model.name
            ),
            choices=tuple(plans),
            prompts=tuple(prompts),
            stream=req.stream,
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
            continuous_usage=bool(
                req.stream_options and req.stream_options.include_usage and req.stream_options.continuous_usage_stats
            ),
            arrival=arrival,
            options=OutputOptions(
                top,
                req.return_token_ids,
                tools,
                reasoning,
                constraint_param,
                prompt_logprobs=req.prompt_logprobs is not None or scored_echo,
                tokens_as_ids=bool(req.return_tokens_as_token_ids),
                role=req.response_role if chat else "assistant",
                hide_reasoning=hide_reasoning,
                stream_interval=req.stream_interval or 1,
                template_variables=variables,
                prompt_text=prompt_text,
            ),
        )

    async def _completion_prompts(self, req: CompletionRequest) -> list[tuple[int, ...]]:
        prompts = req.prompts()
        if len(prompts) > self.limits.max_prompts:
            raise bad_request(f"at most {self.limits.max_prompts} prompts are allowed in one request", param="prompt")
        out = []
        for prompt in prompts:
            if isinstance(prompt, list):
                self._check_token_ids(prompt, "prompt")
                out.append(self.renderer.completion_prompt(prompt))  # no tokenizer: no thread hop
            else:
                out.append(await asyncio.to_thread(self.renderer.completion_prompt, prompt, req.add_special_tokens))
        return out

    def _check_choices(self, req: CompletionRequest | ChatCompletionRequest) -> None:
        lim = self.limits
        if req.n > lim.max_n:
            raise bad_request(f"n may be at most {lim.max_n} on this server", param="n")
        top = req.logprobs if isinstance(req, CompletionRequest) else req.top_logprobs
        if top is not None and top > lim.max_logprobs:
            param = "logprobs" if isinstance(req, CompletionRequest) else "top_logprobs"
            raise bad_request(f"{param} may be at most {lim.max_logprobs}", param=param)
        prompt_top = req.prompt_logprobs
        if prompt_top is not None:
            if req.stream and prompt_top != 0:  # vLLM's rule: they are sent whole, never streamed
                raise bad_request("prompt_logprobs are not available when stream=true", param="prompt_logprobs")
            if prompt_top == -1 or prompt_top > lim.max_logprobs:
                raise bad_request(f"prompt_logprobs may be at most {lim.max_logprobs}", param="prompt_logprobs")

    def _logit_bias(self, bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
        """Token id -> bias, clamped to [-100, 100] as vLLM does; ids outside the vocabulary are a 400."""
        vocab = self.renderer.vocab_size
        out = []
        for key, value in (bias or {}).items():
            token = int(key)
            if not 0 <= token < vocab:
                raise bad_request(f"logit_bias token id {token} is outside the vocabulary", param="logit_bias")
            out.append((token, min(100.0, max(-100.0, value))))
        return tuple(out)

    def _check_stops(self, stops: list[str]) -> None:
        lim = self.limits
        if len(stops) > lim.max_stop_strings:
            raise bad_request(f"at most {lim.max_stop_strings} stop strings are allowed", param="stop")
        if any(len(s) > lim.max_stop_string_chars for s in stops):
            raise bad_request(f"stop strings may have at most {lim.max_stop_string_chars} characters", param="stop")

    def _logprob_token_ids(self, req: CompletionRequest | ChatCompletionRequest, top: int | None) -> tuple[int, ...]:
        """The tokens scored at each output position instead of the top ones (vLLM's `logprob_token_ids`);
        as vLLM: chat needs `logprobs: true`, completions without `logprobs` answer none."""
        asked = req.logprob_token_ids or []
        if asked and isinstance(req, ChatCompletionRequest) and not req.logprobs:
            raise bad_request(
                "when using `logprob_token_ids`, `logprobs` must be set to true.", param="logprob_token_ids"
            )
        self._check_token_ids(asked, "logprob_token_ids")
        return tuple(asked) if top is not None else ()

    def _check_token_ids(self, token_ids: list[int], param: str) -> None:
        vocab = self.renderer.vocab_size
        bad = next((t for t in token_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise bad_request(f"token id {bad} is outside the vocabulary (0..{vocab - 1})", param=param)

    def _truncated(self, prompt_ids: tuple[int, ...], keep: int | None, side: str | None) -> tuple[int, ...]:
        """vLLM's `truncate_prompt_tokens`: the prompt's last `keep` tokens, or
        its first with `truncation_side: right` (-1: the model's length)."""
        if keep is None:
            return prompt_ids
        keep = self.model.max_model_len if keep == -1 else keep
        if keep >= len(prompt_ids):
            return prompt_ids
        return prompt_ids[:keep] if side == "right" else prompt_ids[len(prompt_ids) - keep :]

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
        if requested > limit:
            raise bad_request(
                f"max_tokens={requested} cannot be greater than max_model_len={limit}. "
                "Please request fewer output tokens.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return min(requested, limit - prompt_len)  # vLLM 0.32's: clamped to the context the prompt leaves

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

    async def _chunks(
        self, p: PreparedRequest, plan: ChoicePlan, trace: RequestTrace, follow: str | None = None
    ) -> AsyncIterator[EngineChunk]:
        """One choice's chunks, with latency metrics observed as they pass (of choice 0)."""
        last = None
        observe = plan.index == 0
        path = self._path_for(plan.request)
        async with contextlib.aclosing(path.stream(plan.request, trace, follow)) as chunks:
            async for chunk in chunks:
                n = len(chunk.token_ids)
                if n and observe:
                    now = self.clock()
                    if last is None:
                        self.metrics.ttft.observe(now - p.arrival)
                    else:
                        for _ in range(n):
                            self.metrics.itl.observe((now - last) / n)
                    last = now
                yield chunk

    async def _choice_chunks(
        self, p: PreparedRequest, states: list[_ChoiceState]
    ) -> AsyncIterator[tuple[int, EngineChunk]]:
        """(choice index, chunk) of every choice as they arrive; one choice is streamed as is."""
        if len(states) == 1:
            async for chunk in self._chunks(p, states[0].plan, states[0].trace):
                yield 0, chunk
            return
        queue: asyncio.Queue[tuple[int, EngineChunk | None, Exception | None]] = asyncio.Queue()
        lead_replica = {s.plan.prompt: asyncio.get_running_loop().create_future() for s in states if s.plan.lead}

        async def pump(state: _ChoiceState) -> None:
            plan = state.plan
            followed = lead_replica[plan.prompt]
            try:
                follow = None if plan.lead else await followed
                async for chunk in self._chunks(p, plan, state.trace, follow):
                    if plan.lead and not followed.done() and state.trace.route is not None:
                        followed.set_result(state.trace.route.decode_replica)
                    queue.put_nowait((plan.index, chunk, None))
            except Exception as e:
                queue.put_nowait((plan.index, None, e))
            finally:
                if plan.lead and not followed.done():
                    followed.set_result(None)
            queue.put_nowait((plan.index, None, None))

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

    def _finish(self, p: PreparedRequest, states: list[_ChoiceState]) -> dict[str, Any]:
        self.metrics.e2e.observe(self.clock() - p.arrival)
        prompt_tokens = sum(len(ids) for ids in p.prompts)
        generated = sum(len(s.totals.token_ids) for s in states)
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
        return usage(prompt_tokens, generated, cached)

    def _rejected(self, p: PreparedRequest, e: EngineRequestRejected) -> APIError:
        """An engine's refusal as a 400, naming the constraint's field when the engine's grammar compiler refused it."""
        cause = _cause(e)
        param = p.options.constraint_param if "grammar" in cause.lower() else None
        return bad_request(cause, param=param)

    async def _whole(self, p: PreparedRequest) -> dict[str, Any]:
        states = [_ChoiceState(plan, p) for plan in p.choices]
        try:
            async for index, chunk in self._choice_chunks(p, states):
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
        usage_body = self._finish(p, states)
        chat_prompt_ids, chat_prompt_logprobs = None, None
        if p.endpoint is Endpoint.CHAT:
            chat_prompt_ids = list(p.prompts[0]) if p.options.return_token_ids else None
            chat_prompt_logprobs = states[0].prompt_logprobs()
        choices = [s.whole_choice() for s in states]
        return whole_response(
            p.endpoint, p.header, choices, usage_body, chat_prompt_ids, chat_prompt_logprobs, p.options.prompt_text
        )

    async def _sse(self, p: PreparedRequest, slot: _Slot) -> AsyncIterator[str]:
        states = [_ChoiceState(plan, p) for plan in p.choices]
        try:
            async for event in self._sse_events(p, states):
                yield event
        finally:
            slot.release()

    async def _sse_events(self, p: PreparedRequest, states: list[_ChoiceState]) -> AsyncIterator[str]:
        try:
            if p.endpoint is Endpoint.CHAT:
                # Each choice's first chunk carries the prompt's ids and text when asked, as vLLM's.
                prompt_ids = list(p.prompts[0]) if p.options.return_token_ids else None
                for s in states:
                    role = role_chunk(p.header, s.plan.index, prompt_ids, p.options.role, p.options.prompt_text)
                    yield sse.event(s.with_usage(role, p.continuous_usage))
                for s in states:  # the echoed last message, as vLLM sends it: one chunk after the roles
                    if s.plan.echo:
                        echo = chunk(p.endpoint, p.header, [chat_delta(s.plan.index, {"content": s.plan.echo}, None)])
                        yield sse.event(s.with_usage(echo, p.continuous_usage))
            async for index, engine_chunk in self._choice_chunks(p, states):
                ready = states[index].held.take(engine_chunk)
                choice = states[index].delta(ready) if ready is not None else None
                if choice is not None:
                    yield sse.event(states[index].with_usage(chunk(p.endpoint, p.header, [choice]), p.continuous_usage))
        except (asyncio.CancelledError, GeneratorExit):
            self.metrics.requests.labels(p.endpoint.value, "cancelled").inc()
            raise
        except Exception as e:
            rejected = isinstance(e, EngineRequestRejected)
            self.metrics.requests.labels(p.endpoint.value, "client_error" if rejected else "server_error").inc()
            err = self._rejected(p, e) if rejected else server_error(f"generation failed: {_cause(e)}")
            yield sse.event(err.body())
            yield sse.DONE
            return
        usage_body = self._finish(p, states)
        if p.include_usage:
            yield sse.event(usage_chunk(p.endpoint, p.header, usage_body))
        yield sse.DONE


class _ChoiceState:
    """One choice's output so far, and its OpenAI form, whole or as stream deltas."""

    def __init__(self, plan: ChoicePlan, p: PreparedRequest) -> None:
        self.plan = plan
        self.endpoint = p.endpoint
        self.options = p.options
        self.totals = CompletionTotals()
        self.trace = RequestTrace()
        self.started = False  # a delta of this choice has been streamed
        self.call_id: str | None = None  # a named tool call's id, from its first delta
        self.call_at: int | None = None  # "auto": where the first call begins in the output
        self.sent_chars = 0  # characters of the answer's content streamed
        self.sent_reasoning = 0  # characters of the reasoning streamed
        top = p.options.top_logprobs
        self.completion_logprobs = (
            CompletionLogprobs(top, p.options.tokens_as_ids)
            if top is not None and p.endpoint is Endpoint.COMPLETIONS
            else None
        )
        self.prompt_ids = list(plan.request.prompt_token_ids) if p.options.return_token_ids else None
        self.held = ChunkInterval(p.options.stream_interval)
        reasoning = p.options.reasoning
        self.splitter = (
            reasoning.splitter(dict(p.options.template_variables), plan.request.prompt_token_ids)
            if reasoning is not None
            else None
        )

    def with_usage(self, event: dict[str, Any], continuous: bool) -> dict[str, Any]:
        """`event`, with this choice's usage so far when the stream reports it continuously (vLLM's:
        its prompt's tokens, the tokens it has generated, their sum)."""
        if not continuous:
            return event
        prompt, generated = len(self.plan.request.prompt_token_ids), len(self.totals.token_ids)
        return event | {
            "usage": {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}
        }

    def cached_tokens(self) -> int:
        prefill = self.trace.prefill
        return prefill.num_cached_tokens if prefill is not None else self.totals.num_cached_tokens

    @staticmethod
    def _finish_reason(reason: FinishReason | None) -> str | None:
        return reason.value if reason is not None else None

    def _logprobs(self, positions: Any) -> dict[str, Any] | None:
        top = self.options.top_logprobs
        if top is None:
            return None
        if self.completion_logprobs is not None:
            return self.completion_logprobs.body(positions or ())
        return chat_logprobs(positions or (), top, self.options.tokens_as_ids)

    def _token_ids(self, token_ids: Any) -> list[int] | None:
        return list(token_ids) if self.options.return_token_ids and not self.options.hide_reasoning else None

    def prompt_logprobs(self) -> list[dict[str, Any] | None] | None:
        """The `prompt_logprobs` field, when asked for."""
        if not self.options.prompt_logprobs:
            return None
        return prompt_logprobs_body(self.totals.prompt_logprobs or ())

    def _echoed_positions(self, prompt: Any) -> list[PositionLogprobs | Unscored]:
        """Echo with logprobs: the prompt's positions, its first token unscored."""
        first = Unscored(self.plan.request.prompt_token_ids[0], self.plan.first_token)
        return [first if p is None else p for p in prompt or ()]

    # -- whole ------------------------------------------------------------------

    def whole_choice(self) -> dict[str, Any]:
        t = self.totals
        finish = self._finish_reason(t.finish_reason)
        if self.endpoint is Endpoint.COMPLETIONS:
            positions = [] if self.plan.prompt_only else list(t.logprobs)
            if self.plan.echo and self.completion_logprobs is not None:
                positions = self._echoed_positions(t.prompt_logprobs) + positions
            logprobs = self._logprobs(positions)
            text = self.plan.echo + ("" if self.plan.prompt_only else t.text)
            ids = self._token_ids(t.token_ids)
            return completion_choice(
                self.plan.index, text, finish, logprobs, ids, self.prompt_ids, self.prompt_logprobs(), t.stop_reason
            )
        logprobs = self._logprobs(t.logprobs)
        tools = self.options.tools
        reasoning, answer = self._split()
        content, calls = tools.message(answer) if tools is not None else (answer, None)
        role = self.options.role
        if self.plan.echo:
            content = self.plan.echo + (content or "")
        message: dict[str, Any] = {"role": role, "content": content}
        if self.options.reasoning is not None:
            shown = None if self.options.hide_reasoning else reasoning
            message = {"role": role, "reasoning": shown, "content": content or None}
        if calls is not None and tools.parser is not None:
            message["content"] = content or None  # auto: the text before the calls, if any (as vLLM)
        if calls is not None:
            message["tool_calls"] = calls
            finish = tools.finish_reason(finish, called=True)
        return chat_choice(self.plan.index, message, finish, logprobs, self._token_ids(t.token_ids), t.stop_reason)

    # -- streamed ---------------------------------------------------------------

    def delta(self, c: EngineChunk) -> dict[str, Any] | None:
        """This chunk's choice delta, or None when it carries nothing to send."""
        self.totals.add(c)
        ids = self.options.return_token_ids
        positions: list[PositionLogprobs | Unscored] = [] if self.plan.prompt_only else list(c.logprobs or ())
        if not self.started and self.plan.echo and self.completion_logprobs is not None:
            positions = self._echoed_positions(c.prompt_logprobs) + positions
        logprobs = self._logprobs(positions) if positions else None
        if not (c.text or c.finished or logprobs or (ids and c.token_ids)):
            return None
        first = not self.started
        self.started = True
        finish = self._finish_reason(c.finish_reason)
        if self.endpoint is Endpoint.COMPLETIONS:
            text = (self.plan.echo if first else "") + ("" if self.plan.prompt_only else c.text)
            prompt_ids = self.prompt_ids if first else None
            ids = self._token_ids(c.token_ids)
            return completion_choice(
                self.plan.index, text, finish, logprobs, ids, prompt_ids, stop_reason=c.stop_reason
            )
        reasoning, content = self._split(c.finished)
        delta, finish = self._chat_delta(content, c.finished, finish)
        piece = (reasoning or "")[self.sent_reasoning :]
        if piece and not self.options.hide_reasoning:
            self.sent_reasoning += len(piece)
            delta = {"reasoning": piece, **(delta or {})}
        if delta is None and not logprobs:
            return None
        ids = self._token_ids(c.token_ids)
        return chat_delta(self.plan.index, delta or {}, finish, logprobs, ids, c.stop_reason)

    def _split(self, final: bool = True) -> tuple[str | None, str]:
        """(reasoning, content) of the output so far; without a reasoning parser all is content."""
        text = self.totals.text
        if self.splitter is None:
            return None, text
        reasoning, content = self.splitter.split(text, self.totals.token_ids, final)
        return reasoning, content or ""

    def _chat_delta(self, content: str, finished: bool, finish: str | None) -> tuple[dict[str, Any] | None, str | None]:
        """The delta of the answer's content so far (`content`), as the tool mode shapes it."""
        tools = self.options.tools
        if tools is not None and tools.parser is not None:
            return self._auto_delta(content, finished, finish)
        if tools is not None and tools.named is None:  # "required": the calls are read from the whole output
            if not finished:
                return None, None
            text, calls = tools.message(content)
            if calls is None:
                return {"content": text}, finish
            return {"tool_calls": [{"index": k, **call} for k, call in enumerate(calls)]}, tools.finish_reason(
                finish, True
            )
        piece = content[self.sent_chars :]
        self.sent_chars = len(content)
        if tools is None:
            return ({"content": piece} if piece else {}), finish
        if self.call_id is None:  # named: the arguments stream as they come, as vLLM streams a named call
            self.call_id = f"chatcmpl-tool-{uuid.uuid4().hex}"
            call = {"index": 0, "id": self.call_id, "type": "function"}
            call["function"] = {"name": tools.named, "arguments": piece}
            return {"tool_calls": [call]}, finish
        return ({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} if piece else {}), finish

    def _auto_delta(self, text: str, finished: bool, finish: str | None) -> tuple[dict[str, Any] | None, str | None]:
        """ "auto": content streams until a call begins (a suffix that may begin one held
        back); the calls are read from the whole output and sent with the finish.
        An output already streamed as content (no call began where the parser
        looks for one) stays content, as vLLM streams it."""
        tools = self.options.tools
        assert tools is not None and tools.parser is not None
        if self.call_at is None:
            self.call_at = tools.parser.start(text)
        calls = None
        content = text  # the answer's content as far as it is known; text[:end] of it may be sent
        if finished and self.call_at is not None:
            content, calls = tools.message(text)
            end = len(content)
        elif finished:
            end = len(text)
        else:
            end = self.call_at if self.call_at is not None else tools.parser.safe_prefix(text)
        delta: dict[str, Any] = {}
        # A parser's content is the text before its first call; one that trims it leaves nothing more to send.
        if end > self.sent_chars and (content is text or content.startswith(text[: self.sent_chars])):
            delta["content"] = content[self.sent_chars : end]
            self.sent_chars = end
        if calls:
            delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(calls)]
        if not finished:
            return (delta or None), None
        return delta, tools.finish_reason(finish, bool(calls))
