"""Request preparation: a request body in, the answer's plan (`PreparedRequest`) out.

    body -> strict JSON -> validated request (CompletionRequest | ChatCompletionRequest)
         -> limits checked -> prompt token ids (completion prompts, or the chat template
            rendered with the request's messages, tools and variables)
         -> sampling once -> one EngineRequest per choice (prompt i's sample j)

Everything a client can get wrong is rejected here, with an OpenAI-style
error, before any engine sees the request.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from orchestrator.api.chat_messages import TemplateTraits, content_text, template_messages
from orchestrator.api.errors import bad_request, from_validation_error, model_not_found
from orchestrator.api.prepared import ChoicePlan, ModelCard, OutputOptions, PreparedRequest
from orchestrator.api.protocol import ChatCompletionRequest, CompletionRequest
from orchestrator.api.reasoning_parsers import ReasoningParser
from orchestrator.api.responses import Endpoint, ResponseHeader
from orchestrator.api.tool_parsers import ToolCallParser
from orchestrator.api.tools import template_tools, tool_mode
from orchestrator.config import LimitsConfig
from orchestrator.lora.adapter import LoraAdapter
from orchestrator.lora.catalog import AdapterCatalog, AdapterNotFound
from orchestrator.messages import EngineRequest, RepetitionDetection, SamplingSpec, StructuredOutput
from orchestrator.metrics import FrontendMetrics
from orchestrator.prompts import ChatTemplateOptions, PromptRenderer


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


class RequestPreparer:
    def __init__(
        self,
        model: ModelCard,
        renderer: PromptRenderer,
        metrics: FrontendMetrics,
        limits: LimitsConfig = LimitsConfig(),
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
        new_id: Callable[[], str] = lambda: uuid.uuid4().hex,
        tool_parser: ToolCallParser | None = None,
        reasoning_parser: ReasoningParser | None = None,
        catalog: AdapterCatalog | None = None,
    ) -> None:
        self.model = model
        self.catalog = catalog  # the model's LoRA adapters; None: the base model alone
        self.renderer = renderer
        self.template_traits = TemplateTraits.of(renderer.template)  # how messages are given to the template
        self.metrics = metrics
        self.limits = limits
        self.clock = clock
        self.wall_clock = wall_clock
        self.new_id = new_id
        self.tool_parser = tool_parser  # the model's tool-call format, for tool_choice "auto"
        self.reasoning_parser = reasoning_parser  # the model's thinking format (chat)

    async def prepare(self, endpoint: Endpoint, raw_body: bytes) -> PreparedRequest:
        """The request's plan; APIError for anything the client must fix."""
        arrival = self.clock()
        body = _parse_json(raw_body)
        if nesting_exceeds(body, self.limits.max_json_depth):
            raise bad_request(f"request body is nested deeper than {self.limits.max_json_depth} levels")
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
        lora = await self._adapter(req.model)
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
                    request_id, prompt_ids, _for_choice(base, max_tokens, j), cache_salt=req.cache_salt, lora=lora
                )
                plans.append(ChoicePlan(index, request, i, j == 0, echo_text, first_token, prompt_only))
        prefix = "cmpl" if endpoint is Endpoint.COMPLETIONS else "chatcmpl"
        chat = isinstance(req, ChatCompletionRequest)
        self.metrics.hop_seconds.labels("prepare").observe(self.clock() - arrival)
        return PreparedRequest(
            endpoint=endpoint,
            header=ResponseHeader(
                id=f"{prefix}-{req.request_id or rid}", created=int(self.wall_clock()), model=req.model
            ),
            choices=tuple(plans),
            prompts=tuple(prompts),
            stream=req.stream,
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
            continuous_usage=bool(
                req.stream_options and req.stream_options.include_usage and req.stream_options.continuous_usage_stats
            ),
            arrival=arrival,
            slo_class=req.slo_class,
            priority=req.priority,
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

    async def _adapter(self, model: str) -> LoraAdapter | None:
        """The adapter `model` names (None: the base model); a 404 for a name not served."""
        if self.catalog is None:
            if model != self.model.name:
                raise model_not_found(model)
            return None
        try:
            return await self.catalog.lookup(model)
        except AdapterNotFound:
            raise model_not_found(model) from None

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
