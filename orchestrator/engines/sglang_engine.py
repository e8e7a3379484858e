"""SGLang adapter: one `sglang.Engine` in one pool replica, in SGLang's
disaggregation role (prefill / decode / aggregated = "null").

The only module that touches SGLang; it is imported inside methods. SGLang
needs CUDA: this adapter runs only on GPU machines (benchmarks/gpu/sglang_pd.py);
on CPU machines its translations are tested against the pinned SGLang's own
classes (installed without its dependencies) and, where those cannot be
imported without CUDA, against payloads recorded from its source
(tests/fixtures/sglang/).

KV handoff (`KVHandoff.CONCURRENT`): SGLang pairs a prefill and a decode
request by a rendezvous, not by a result. The frontend draws a room and sends
both requests at once, each carrying {bootstrap_host, bootstrap_port,
bootstrap_room} (the prefill replica's bootstrap server). The decode engine
asks that server for the prefill engine's KV layout, pre-allocates the
prompt's KV and registers it under the room; the prefill engine computes the
prompt and writes the KV there (NIXL or Mooncake), then finishes its request.
A decode engine in SGLang's decode mode never computes a prompt itself
(`EngineInfo.prefills_locally` False): every request it serves, a migrated
continuation included, comes with a rendezvous.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import json
import os
import random
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.config import KVCacheConfig, ModelConfig, NetworkConfig, SglangEngineConfig
from orchestrator.engines.adapter import EngineAdapter, EngineSpec, PlannerInputs
from orchestrator.engines.base import (
    BOOTSTRAP_HOST,
    BOOTSTRAP_PORT,
    BOOTSTRAP_ROOM,
    EngineError,
    EngineInfo,
    EngineRequestRejected,
    EngineRole,
    EngineStats,
    KVHandoff,
)
from orchestrator.engines.ports import PortReservation, listen_port, reserve_listen_port
from orchestrator.engines.sglang_kv_events import decode_batch, events_config
from orchestrator.engines.sglang_logprobs import TokenTexts, logprob_kwargs, output_logprobs, prompt_logprobs
from orchestrator.messages import (
    EngineChunk,
    EngineRequest,
    FinishReason,
    PrefillResult,
    SamplingSpec,
    StructuredKind,
    StructuredOutput,
)
from orchestrator.placement import one_bundle_placement

ENGINE_KIND = "sglang"

# ServerArgs.disaggregation_mode by role.
_DISAGGREGATION_MODE = {EngineRole.PREFILL: "prefill", EngineRole.DECODE: "decode", EngineRole.AGGREGATED: "null"}
# SGLang's top_k meaning "no top-k".
_NO_TOP_K = -1
# Environment variables SGLang's disaggregation reads (seconds): how long a
# prefill engine waits for its decode peer, and a decode engine for the KV.
BOOTSTRAP_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"
WAITING_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"


# -- configuration -------------------------------------------------------------


@dataclass(frozen=True)
class EnginePorts:
    """Ports one replica's engine listens on, chosen before it starts."""

    server: int  # ServerArgs.port: SGLang derives its internal ports from it
    bootstrap: int | None = None  # prefill only: the rendezvous server
    kv_events: int | None = None  # ZMQ PUB; None: not publishing
    kv_events_replay: int | None = None  # ZMQ ROUTER


def draw_ports(
    host: str, role: EngineRole, publish_kv_events: bool, rng: random.Random | None = None
) -> tuple[EnginePorts, PortReservation | None]:
    """One replica's ports, drawn as `ports.listen_port` draws them. A prefill
    replica's bootstrap port is also reserved on the node (returned; the
    replica holds it while its engine lives): SGLang's bootstrap server only
    logs a port it cannot bind, and a replica that lost its port would then
    register with another replica's server and mix their requests."""
    bootstrap = reserve_listen_port(host, rng) if role is EngineRole.PREFILL else None
    ports = EnginePorts(
        server=listen_port(host, rng),
        bootstrap=bootstrap.port if bootstrap is not None else None,
        kv_events=listen_port(host, rng) if publish_kv_events else None,
        kv_events_replay=listen_port(host, rng) if publish_kv_events else None,
    )
    return ports, bootstrap


def server_args_kwargs(spec: EngineSpec, ports: EnginePorts) -> dict[str, Any]:
    """`sglang.Engine(**kwargs)` (= ServerArgs fields) for one replica.
    Nothing of `spec.network` maps onto ServerArgs: SGLang's transfer engines
    take their own settings (`ib_device`, environment)."""
    model, kv_cache, role, host = spec.model, spec.kv_cache, spec.role, spec.host
    engine: SglangEngineConfig = spec.engine
    kwargs: dict[str, Any] = {
        "model_path": model.weights_source,
        "tokenizer_path": model.tokenizer_source,
        "served_model_name": model.name,
        "dtype": model.dtype,
        "context_length": model.max_model_len,
        "random_seed": model.seed,
        "page_size": kv_cache.block_size,
        "disable_radix_cache": not kv_cache.enable_prefix_caching,
        "tp_size": engine.tensor_parallel_size,
        "host": host,
        "port": ports.server,
        "disaggregation_mode": _DISAGGREGATION_MODE[role],
    }
    if role is not EngineRole.AGGREGATED:
        kwargs["disaggregation_transfer_backend"] = engine.transfer_backend.value
        if engine.ib_device is not None:
            kwargs["disaggregation_ib_device"] = engine.ib_device
    if role is EngineRole.PREFILL:
        if ports.bootstrap is None:
            raise ValueError("a prefill engine needs a bootstrap port")
        kwargs["disaggregation_bootstrap_port"] = ports.bootstrap
    if spec.publish_kv_events:
        if ports.kv_events is None or ports.kv_events_replay is None:
            raise ValueError("publishing KV events needs their ports")
        kwargs["kv_events_config"] = json.dumps(events_config("kv", ports.kv_events, ports.kv_events_replay))
    optional = {
        "mem_fraction_static": engine.mem_fraction_static,
        "max_running_requests": engine.max_running_requests,
        "chunked_prefill_size": engine.chunked_prefill_size,
    }
    kwargs |= {k: v for k, v in optional.items() if v is not None}
    return kwargs | dict(engine.server_args)


def process_env(engine: SglangEngineConfig, network: NetworkConfig) -> dict[str, str]:
    """Environment a replica process needs before SGLang starts.
    `network.kv_handshake_timeout_s` bounds both of SGLang's disaggregation
    waits; `nixl_progress_delay_us` and `nixl_backends` are our vLLM plugin's
    and vLLM's, with no SGLang counterpart."""
    del engine
    if network.kv_handshake_timeout_s is None:
        return {}
    timeout = str(network.kv_handshake_timeout_s)
    return {BOOTSTRAP_TIMEOUT_ENV: timeout, WAITING_TIMEOUT_ENV: timeout}


# ServerArgs field names of sglang 0.5.23 (python/sglang/srt/server_args.py and
# the namespaces of srt/arg_groups/fields/): what `server_args` is checked
# against where SGLang is not installed. A subset of the real class;
# tests/unit/test_sglang_adapter.py checks it against the pinned SGLang's.
RECORDED_SERVER_ARGS_FIELDS = frozenset(
    {
        # set by this adapter
        "model_path",
        "tokenizer_path",
        "served_model_name",
        "dtype",
        "context_length",
        "random_seed",
        "page_size",
        "disable_radix_cache",
        "tp_size",
        "host",
        "port",
        "disaggregation_mode",
        "disaggregation_transfer_backend",
        "disaggregation_bootstrap_port",
        "disaggregation_ib_device",
        "kv_events_config",
        "mem_fraction_static",
        "max_running_requests",
        "chunked_prefill_size",
        # commonly tuned
        "tokenizer_mode",
        "skip_tokenizer_init",
        "load_format",
        "trust_remote_code",
        "revision",
        "download_dir",
        "kv_cache_dtype",
        "quantization",
        "chat_template",
        "completion_template",
        "dp_size",
        "pp_size",
        "nnodes",
        "node_rank",
        "dist_init_addr",
        "base_gpu_id",
        "gpu_id_step",
        "max_total_tokens",
        "max_prefill_tokens",
        "max_queued_requests",
        "schedule_policy",
        "schedule_conservativeness",
        "stream_interval",
        "incremental_streaming_output",
        "attention_backend",
        "sampling_backend",
        "grammar_backend",
        "disable_cuda_graph",
        "cuda_graph_max_bs_decode",
        "cuda_graph_max_bs_prefill",
        "enable_torch_compile",
        "enable_mixed_chunk",
        "enable_dp_attention",
        "enable_deterministic_inference",
        "speculative_algorithm",
        "enable_lora",
        "lora_paths",
        "max_loras_per_batch",
        "allow_auto_truncate",
        "preferred_sampling_params",
        "log_level",
        "enable_metrics",
        "enable_trace",
        "watchdog_timeout",
        "skip_server_warmup",
        "tokenizer_worker_num",
        "reasoning_parser",
        "tool_call_parser",
        "enable_hierarchical_cache",
        "hicache_ratio",
        "radix_eviction_policy",
        "weight_version",
    }
)


# Prints the field names of the installed SGLang's ServerArgs (a msgspec
# struct in 0.5.23) as a JSON list, on the last line of its output.
_LIST_SERVER_ARGS_FIELDS = """
import json, msgspec
from sglang.srt.server_args import ServerArgs
print(json.dumps([f.name for f in msgspec.structs.fields(ServerArgs)]))
"""


@functools.cache
def server_args_fields() -> frozenset[str]:
    """Field names of SGLang's ServerArgs: the installed SGLang's, else
    `RECORDED_SERVER_ARGS_FIELDS`. Read in a child process: importing SGLang
    patches transformers and redirects torch's and Triton's caches (process
    environment) in the importing process, which is the caller's, not an
    engine's."""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        return RECORDED_SERVER_ARGS_FIELDS
    listed = subprocess.run(
        [sys.executable, "-c", _LIST_SERVER_ARGS_FIELDS], capture_output=True, text=True, check=False
    )
    if listed.returncode != 0:
        raise RuntimeError(f"cannot read SGLang's ServerArgs fields: {listed.stderr.strip()[-2000:]}")
    return frozenset(json.loads(listed.stdout.splitlines()[-1]))


def check_server_args(engine: SglangEngineConfig, known_fields: frozenset[str]) -> None:
    """Raise ValueError naming any `server_args` key not in `known_fields`."""
    unknown = sorted(set(engine.server_args) - known_fields)
    if unknown:
        raise ValueError(f"engine.server_args: SGLang's ServerArgs has no field(s) {unknown}")


def check_config(engine: SglangEngineConfig) -> None:
    """`server_args` against the fields of SGLang's ServerArgs where SGLang is
    installed (GPU machines); elsewhere against `RECORDED_SERVER_ARGS_FIELDS`
    (a subset: a key outside it fails here and may still be valid, so check
    it where SGLang is installed)."""
    check_server_args(engine, server_args_fields())


def planner_inputs(engine: SglangEngineConfig) -> PlannerInputs:
    """No running-sequence limit read: SGLang's is `max_running_requests`,
    which the planner has never been given (it assumes 256)."""
    del engine
    return PlannerInputs(max_num_seqs=None)


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


def generate_kwargs(request: EngineRequest, rid: str, stream: bool) -> dict[str, Any]:
    """`Engine.async_generate(**kwargs)` for one request: token ids in (the
    frontend tokenizes), SGLang's request id `rid`, the rendezvous if any."""
    return {
        "input_ids": list(request.prompt_token_ids),
        "sampling_params": sampling_params(request.sampling),
        "stream": stream,
        "rid": rid,
        **logprob_kwargs(request.sampling),
        **({"cache_salt": request.cache_salt} if request.cache_salt is not None else {}),
        **rendezvous_params(request),
    }


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


# -- the engine ------------------------------------------------------------------


def _scheduler_info(engine: Any) -> Mapping[str, Any]:
    """The first scheduler's start-up report; where it lives varies by SGLang release."""
    result = getattr(engine, "_scheduler_init_result", None)
    if result is not None and getattr(result, "scheduler_infos", None):
        return result.scheduler_infos[0]
    return getattr(engine, "scheduler_info", None) or {}


class SglangEngine:
    def __init__(self, spec: EngineSpec) -> None:
        self._spec = spec
        self._model = spec.model
        self._kv_cache = spec.kv_cache
        self._role = spec.role
        self._host = spec.host
        self._mode = stream_mode(spec.engine.server_args)
        self._stats = StatsSink(spec.role)
        self._engine: Any = None
        self._info: EngineInfo | None = None
        self._bootstrap_reservation: PortReservation | None = None

    # -- life cycle -----------------------------------------------------------

    async def start(self) -> EngineInfo:
        import sglang

        ports, self._bootstrap_reservation = draw_ports(self._host, self._role, self._spec.publish_kv_events)
        kwargs = server_args_kwargs(self._spec, ports)
        # Loading the model blocks for minutes; keep the replica's loop free.
        # SGLang's tokenizer manager starts its output loop on the loop of the
        # first request, i.e. this replica's.
        self._engine = await asyncio.to_thread(lambda: sglang.Engine(**kwargs))
        self._info = engine_info(
            self._role,
            sglang.__version__,
            str(uuid.uuid4()),
            self._model,
            self._kv_cache,
            self._host,
            ports,
            _scheduler_info(self._engine),
            pid=os.getpid(),
        )
        return self._info

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None
        if self._bootstrap_reservation is not None:
            self._bootstrap_reservation.release()
            self._bootstrap_reservation = None

    async def check_health(self) -> None:
        if self._engine is None:
            raise EngineError("engine not started")
        # SGLang's SubprocessWatchdog (`_processes`: the schedulers and
        # detokenizer) also SIGQUITs this process when one dies; checking here
        # reports it before that lands.
        watchdog = getattr(self._engine.tokenizer_manager, "_subprocess_watchdog", None)
        if not all(p.is_alive() for p in getattr(watchdog, "_processes", ())):
            raise EngineError("an SGLang scheduler or detokenizer process died")

    def stats(self) -> EngineStats:
        return self._stats.snapshot()

    # -- requests -------------------------------------------------------------

    def _abort(self, rid: str) -> None:
        if self._engine is not None:
            self._engine.tokenizer_manager.abort_request(rid=rid)

    async def _outputs(self, request: EngineRequest, stream: bool) -> AsyncIterator[SglangOutput]:
        """The request's output dicts, typed; aborts the request in SGLang
        when the caller stops early. Each call has its own SGLang rid, so a
        retried request id never meets the previous attempt's state."""
        if self._engine is None:
            raise EngineError("engine not started")
        if request.sampling.prompt_logprobs is not None and request.kv_transfer is not None:
            raise EngineRequestRejected(
                "prompt_logprobs on disaggregated SGLang engines: the prefill engine computes the prompt, and "
                "its scores are not carried to the answer (an aggregated SGLang pool serves them)"
            )
        if request.sampling.allowed_token_ids is not None or request.sampling.bad_words:
            raise EngineRequestRejected("allowed_token_ids and bad_words are vLLM's; SGLang has no equivalent")
        if request.sampling.structured is not None and request.sampling.structured.has_options:
            raise EngineRequestRejected(
                "disable_any_whitespace, disable_additional_properties and whitespace_pattern are vLLM's; "
                "SGLang has no equivalent"
            )
        if request.sampling.repetition_detection is not None or request.sampling.extra_args:
            raise EngineRequestRejected("repetition_detection and vllm_xargs are vLLM's; not wired to SGLang")
        rid = f"{request.request_id}-{uuid.uuid4().hex[:8]}"
        done = False
        self._stats.started()
        try:
            result = await self._engine.async_generate(**generate_kwargs(request, rid, stream))
            if not stream:
                done = True
                yield parse_output(result)
                return
            async for out in result:
                parsed = parse_output(out)
                done = parsed.finish is not None
                yield parsed
        except (EngineError, EngineRequestRejected):
            raise
        except ValueError as e:  # SGLang's validation: prompt too long, bad sampling params
            done = True
            raise EngineRequestRejected(str(e)) from e
        except Exception as e:
            raise EngineError(f"{type(e).__name__}: {e}") from e
        finally:
            self._stats.ended()
            if not done:
                self._abort(rid)

    def _token_texts(self, token_ids: Sequence[int]) -> list[str]:
        """Each token's own text, as SGLang's tokenizer manager decodes a log-probability's token."""
        return self._engine.tokenizer_manager.tokenizer.batch_decode([[t] for t in token_ids])

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        decoder = ChunkDecoder(request, self._mode, self._token_texts)
        produced = False
        async with contextlib.aclosing(self._outputs(request, stream=True)) as outputs:
            async for out in outputs:
                try:
                    chunk = decoder.feed(out)
                except EngineError:
                    if request.kv_transfer is not None and not produced:
                        self._stats.transfer_failed()
                    raise
                if out.finish is not None:
                    self._stats.finished(request, out)
                if chunk is not None:
                    produced = True
                    yield chunk

    async def prefill(self, request: EngineRequest) -> PrefillResult:
        """Compute the prompt and send its KV to the decode engine waiting in
        the request's rendezvous; returns once SGLang reports the request done
        (the KV sent)."""
        if request.kv_transfer is None:
            raise EngineError("an SGLang prefill needs a KV rendezvous (KVHandoff.CONCURRENT)")
        last = None
        async with contextlib.aclosing(self._outputs(request, stream=False)) as outputs:
            async for out in outputs:
                last = out
        if last is None or last.finish is None:
            raise EngineError("SGLang prefill ended without a result")
        if last.finish.reason is FinishReason.ABORT:
            raise abort_error(last.finish)
        self._stats.finished(request, last)
        return PrefillResult(
            kv_transfer=request.kv_transfer,
            num_prompt_tokens=last.prompt_tokens or len(request.prompt_token_ids),
            num_cached_tokens=last.cached_tokens,
        )


ADAPTER = EngineAdapter(
    kind=ENGINE_KIND,
    create=SglangEngine,
    process_env=process_env,
    check_config=check_config,
    kv_event_decoder=decode_batch,  # vLLM's frames and replay protocol, SGLang's payload encoding
    placement=one_bundle_placement,
    planner_inputs=planner_inputs,
    kv_handoff=KVHandoff.CONCURRENT,
)
