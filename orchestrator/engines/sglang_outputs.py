"""What SGLang's `generate` yields, read into our boundary types: outputs and finish reasons, the
EngineChunks of a stream (SGLang's cumulative or incremental text), the stats folded from finished
requests, and the EngineInfo of a started engine."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config import KVCacheConfig, ModelConfig
from orchestrator.engines.base import (
    EngineError,
    EngineInfo,
    EngineRequestRejected,
    EngineRole,
    EngineStats,
    KVHandoff,
)
from orchestrator.engines.sglang_logprobs import TokenTexts, output_logprobs, prompt_logprobs
from orchestrator.engines.sglang_server_args import ENGINE_KIND, EnginePorts
from orchestrator.messages import (
    EngineChunk,
    EngineRequest,
    FinishReason,
    SamplingSpec,
)

# -- outputs ---------------------------------------------------------------------


class StreamMode(str, enum.Enum):
    """What each streamed output dict holds (SGLang's TokenizerManager)."""

    CUMULATIVE = "cumulative"  # text and output_ids so far (SGLang's default)
    INCREMENTAL = "incremental"  # both new since the last dict (`incremental_streaming_output`)


def stream_mode(server_args: Mapping[str, Any]) -> StreamMode:
    return StreamMode.INCREMENTAL if server_args.get("incremental_streaming_output") else StreamMode.CUMULATIVE


@dataclass(frozen=True)
class Finish:
    """`meta_info.finish_reason`: SGLang's BaseFinishReason.to_json()."""

    reason: FinishReason
    matched: int | str | None = None  # the stop token (EOS included) or stop string
    message: str | None = None  # an abort's
    status_code: int | None = None  # an abort's HTTP status


def parse_finish(raw: Mapping[str, Any] | None) -> Finish | None:
    if raw is None:
        return None
    kind = raw.get("type")
    if kind == "abort":
        code = raw.get("status_code")
        return Finish(
            FinishReason.ABORT, message=raw.get("message"), status_code=int(code) if code is not None else None
        )
    if kind == "length":
        return Finish(FinishReason.LENGTH)
    matched = raw.get("matched")
    return Finish(FinishReason.STOP, matched=matched if isinstance(matched, (int, str)) else None)


@dataclass(frozen=True)
class SglangOutput:
    """One output dict of `async_generate` (stream or not), typed."""

    text: str
    output_ids: tuple[int, ...]
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish: Finish | None
    # The whole meta_info, whose log-probability lists `sglang_logprobs` reads for what the request asked.
    meta: Mapping[str, Any] = field(default_factory=dict)


def parse_output(out: Mapping[str, Any]) -> SglangOutput:
    meta = out.get("meta_info") or {}
    return SglangOutput(
        text=out.get("text") or "",
        output_ids=tuple(out.get("output_ids") or ()),
        prompt_tokens=int(meta.get("prompt_tokens") or 0),
        completion_tokens=int(meta.get("completion_tokens") or 0),
        cached_tokens=int(meta.get("cached_tokens") or 0),
        finish=parse_finish(meta.get("finish_reason")),
        meta=meta,
    )


def abort_error(finish: Finish) -> Exception:
    """What an engine-side abort means to the caller: a 4xx is the request's
    fault; anything else (a KV transfer that failed or timed out, the engine
    shutting down) the engine's, which the request path survives by migrating."""
    message = finish.message or "aborted by the engine"
    if finish.status_code is not None and 400 <= finish.status_code < 500:
        return EngineRequestRejected(message)
    return EngineError(f"SGLang aborted the request: {message}")


def stop_reason(finish: Finish, spec: SamplingSpec) -> int | str | None:
    """vLLM's meaning: the stop string or stop token that ended the output;
    None for EOS (SGLang reports EOS as a matched token too)."""
    if finish.reason is not FinishReason.STOP:
        return None
    if isinstance(finish.matched, str):
        return finish.matched
    return finish.matched if finish.matched in spec.stop_token_ids else None


def _no_tokenizer(token_ids: Sequence[int]) -> list[str]:
    raise EngineError("log-probabilities need the engine's tokenizer to name their tokens")


@dataclass
class ChunkDecoder:
    """Turns one request's stream of SGLang output dicts into our chunks (new
    output only). An abort raises (`abort_error`); an output that adds nothing
    and does not finish yields nothing."""

    request: EngineRequest
    mode: StreamMode = StreamMode.CUMULATIVE
    token_texts: TokenTexts = _no_tokenizer  # names the tokens of log-probabilities: the engine's tokenizer
    ids_seen: int = 0
    text_seen: int = 0
    first: bool = True

    def feed(self, out: SglangOutput) -> EngineChunk | None:
        if out.finish is not None and out.finish.reason is FinishReason.ABORT:
            raise abort_error(out.finish)
        incremental = self.mode is StreamMode.INCREMENTAL
        new_ids = out.output_ids if incremental else out.output_ids[self.ids_seen :]
        new_text = out.text if incremental else out.text[self.text_seen :]
        # The new tokens' places in meta_info's per-position lists, which stream as output_ids do.
        start = 0 if incremental else self.ids_seen
        logprobs = output_logprobs(out.meta, self.request.sampling, start, len(new_ids), self.token_texts)
        self.ids_seen += len(new_ids)
        self.text_seen += len(new_text)
        if not new_ids and not new_text and out.finish is None:
            return None
        first, self.first = self.first, False
        return EngineChunk(
            token_ids=new_ids,
            text=new_text,
            finish_reason=out.finish.reason if out.finish else None,
            stop_reason=stop_reason(out.finish, self.request.sampling) if out.finish else None,
            num_prompt_tokens=(out.prompt_tokens or len(self.request.prompt_token_ids)) if first else 0,
            num_cached_tokens=cached_tokens(self.request, out) if first else 0,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs(out.meta, self.request.sampling, self.token_texts) if first else None,
        )


def cached_tokens(request: EngineRequest, out: SglangOutput) -> int:
    """Prompt tokens the engine did not compute. A decode engine with a
    rendezvous computes none: it either received them all or aborted."""
    if request.kv_transfer is not None:
        return out.prompt_tokens or len(request.prompt_token_ids)
    return out.cached_tokens


# -- stats -----------------------------------------------------------------------


@dataclass
class StatsSink:
    """EngineStats folded from the requests this adapter sees: SGLang's engine
    object exposes no per-step stats callback, so the counters come from each
    request's final meta_info, the gauges from the adapter's own in-flight
    count (`num_waiting` and `kv_cache_usage` are not reported: 0). KV
    transfers count on the decode side, as vLLM's do: a decode with a
    rendezvous that produced output is one transfer, one that aborted before
    any output a failure (bytes and seconds are not reported)."""

    role: EngineRole
    values: dict[str, Any] = field(default_factory=lambda: EngineStats().to_dict())

    def started(self) -> None:
        self.values["num_running"] += 1

    def ended(self) -> None:
        self.values["num_running"] -= 1

    def finished(self, request: EngineRequest, out: SglangOutput) -> None:
        v = self.values
        prompt = out.prompt_tokens or len(request.prompt_token_ids)
        if request.kv_transfer is not None and self.role is not EngineRole.PREFILL:
            v["prompt_tokens_transferred_total"] += prompt
            v["kv_transfers_total"] += 1
        else:
            v["prompt_tokens_computed_total"] += prompt - out.cached_tokens
            v["prompt_tokens_local_cache_total"] += out.cached_tokens
        if self.role is not EngineRole.PREFILL:
            v["generation_tokens_total"] += out.completion_tokens
        v["requests_finished_total"] += 1

    def transfer_failed(self) -> None:
        self.values["kv_transfer_failures_total"] += 1

    def snapshot(self) -> EngineStats:
        return EngineStats.from_dict(self.values)


# -- engine info -----------------------------------------------------------------


def kv_capacity_blocks(scheduler_info: Mapping[str, Any], page_size: int) -> int | None:
    """KV capacity from SGLang's scheduler info (`max_total_num_tokens`)."""
    tokens = scheduler_info.get("max_total_num_tokens")
    return int(tokens) // page_size if tokens else None


def engine_info(
    role: EngineRole,
    version: str,
    engine_id: str,
    model: ModelConfig,
    kv_cache: KVCacheConfig,
    host: str,
    ports: EnginePorts,
    scheduler_info: Mapping[str, Any],
    pid: int | None = None,
) -> EngineInfo:
    return EngineInfo(
        role=role,
        engine_kind=ENGINE_KIND,
        engine_version=version,
        engine_id=engine_id,
        model=model.name,
        block_size=kv_cache.block_size,
        max_model_len=model.max_model_len,
        host=host,
        kv_events_endpoint=f"tcp://{host}:{ports.kv_events}" if ports.kv_events is not None else None,
        kv_events_replay_endpoint=(
            f"tcp://{host}:{ports.kv_events_replay}" if ports.kv_events_replay is not None else None
        ),
        kv_capacity_blocks=kv_capacity_blocks(scheduler_info, kv_cache.block_size),
        pid=pid,
        kv_handoff=KVHandoff.CONCURRENT,
        bootstrap_port=ports.bootstrap,
        prefills_locally=role is not EngineRole.DECODE,
    )
