"""SGLang's `generate` arguments from an EngineRequest: sampling parameters, structured output, the
KV rendezvous of a disaggregated request, the LoRA adapter."""

from __future__ import annotations

import re
from typing import Any

from orchestrator.engines.base import (
    BOOTSTRAP_HOST,
    BOOTSTRAP_PORT,
    BOOTSTRAP_ROOM,
    EngineRequestRejected,
)
from orchestrator.engines.sglang_logprobs import logprob_kwargs
from orchestrator.messages import (
    EngineRequest,
    SamplingSpec,
    StructuredKind,
    StructuredOutput,
)

# SGLang's top_k meaning "no top-k".
_NO_TOP_K = -1


# -- requests --------------------------------------------------------------------


def sampling_params(spec: SamplingSpec) -> dict[str, Any]:
    """SGLang's `sampling_params` dict for our sampling spec (the keyword
    arguments of its SamplingParams). SGLang uses `sampling_seed` only with
    `enable_deterministic_inference` set, an engine-wide mode (batch-invariant
    kernels); without it a seeded request is not reproducible."""
    params: dict[str, Any] = {
        "max_new_tokens": spec.max_tokens,
        "min_new_tokens": spec.min_tokens,
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        "top_k": spec.top_k if spec.top_k is not None else _NO_TOP_K,
        "min_p": spec.min_p,
        "ignore_eos": spec.ignore_eos,
        "presence_penalty": spec.presence_penalty,
        "frequency_penalty": spec.frequency_penalty,
        "repetition_penalty": spec.repetition_penalty,
    }
    if spec.stop:
        params["stop"] = list(spec.stop)
    if spec.stop_token_ids:
        params["stop_token_ids"] = list(spec.stop_token_ids)
    if spec.seed is not None:
        params["sampling_seed"] = spec.seed
    if not spec.skip_special_tokens:
        params["skip_special_tokens"] = False
    if not spec.spaces_between_special_tokens:
        params["spaces_between_special_tokens"] = False
    if spec.include_stop_str_in_output:
        params["no_stop_trim"] = True  # SGLang's name for it
    if spec.logit_bias:
        params["logit_bias"] = {str(t): b for t, b in spec.logit_bias}
    if spec.structured is not None:
        params.update(structured_params(spec.structured))
    return params


def structured_params(structured: StructuredOutput) -> dict[str, str]:
    """SGLang's constraint keys (`json_schema`, `regex`, `ebnf`, `structural_tag`) for a constraint."""
    kind, value = structured.kind, structured.value
    if kind is StructuredKind.STRUCTURAL_TAG:
        return {"structural_tag": str(value)}
    if kind is StructuredKind.JSON:
        return {"json_schema": str(value)}
    if kind is StructuredKind.JSON_OBJECT:
        return {"json_schema": '{"type": "object"}'}
    if kind is StructuredKind.CHOICE:
        return {"regex": "(" + "|".join(re.escape(c) for c in value) + ")"}
    if kind is StructuredKind.REGEX:
        return {"regex": str(value)}
    return {"ebnf": str(value)}


def rendezvous_params(request: EngineRequest) -> dict[str, Any]:
    """{bootstrap_host, bootstrap_port, bootstrap_room} of the request's KV
    transfer; empty when it has none."""
    if request.kv_transfer is None:
        return {}
    p = request.kv_transfer.engine_params
    try:
        return {
            BOOTSTRAP_HOST: str(p[BOOTSTRAP_HOST]),
            BOOTSTRAP_PORT: int(p[BOOTSTRAP_PORT]),
            BOOTSTRAP_ROOM: int(p[BOOTSTRAP_ROOM]),
        }
    except (KeyError, TypeError, ValueError) as e:
        raise EngineRequestRejected(f"KV transfer is not an SGLang rendezvous: {p!r}") from e


def generate_kwargs(
    request: EngineRequest, rid: str, stream: bool, priority_scheduling: bool = False
) -> dict[str, Any]:
    """`Engine.async_generate(**kwargs)` for one request: token ids in (the
    frontend tokenizes), SGLang's request id `rid`, the rendezvous if any, its
    SLO class's priority where the engine schedules by priority."""
    return {
        "input_ids": list(request.prompt_token_ids),
        "sampling_params": sampling_params(request.sampling),
        "stream": stream,
        "rid": rid,
        **logprob_kwargs(request.sampling),
        **({"cache_salt": request.cache_salt} if request.cache_salt is not None else {}),
        # SGLang names a loaded adapter by its name here (`lora_path`), resolved to its id by its registry.
        **({"lora_path": request.lora.name} if request.lora is not None else {}),
        **rendezvous_params(request),
        **({"priority": request.priority} if priority_scheduling else {}),
    }
