"""vLLM adapter: one `AsyncLLM` in one pool replica.

With vllm_plugin.py (loaded into vLLM's engine processes) and vllm_tool_parsers.py,
vllm_reasoning_parsers.py (vLLM's output parsers, in the frontend), the only modules
that touch vLLM.
vLLM is imported inside functions so that the application builder can read
engine settings without paying for the import.

KV transfer uses vLLM's NixlConnector (pull mode): the prefill engine runs the
prompt with `do_remote_decode`, keeps the blocks and returns their ids and its
NIXL side-channel address; the decode engine, given those params, reads the
blocks over NIXL before its first step. The prefill engine frees the blocks
when the read completes or its lease on them lapses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from orchestrator.config import Device, LoraConfig, NetworkConfig, VllmEngineConfig
from orchestrator.engines import vllm_reasoning_parsers, vllm_tool_parsers
from orchestrator.engines.adapter import EngineAdapter, EngineParsers, EngineSpec, PlannerInputs
from orchestrator.engines.adapter_loads import AdapterLoads
from orchestrator.engines.base import (
    EngineError,
    EngineInfo,
    EngineRequestRejected,
    EngineRole,
    EngineStats,
)
from orchestrator.engines.ports import listen_port
from orchestrator.engines.vllm_kv_events import decode_batch, events_config
from orchestrator.engines.vllm_plugin import (
    EXIT_WITH_PARENT_ENV,
    NIXL_PROGRESS_DELAY_ENV,
    SHM_POLL_ENV,
    SHM_POLL_MAX_ENV,
)
from orchestrator.lora.adapter import LoraAdapter
from orchestrator.messages import (
    EngineChunk,
    EngineRequest,
    FinishReason,
    KVTransfer,
    PositionLogprobs,
    PrefillResult,
    RepetitionDetection,
    StructuredKind,
    StructuredOutput,
    TokenLogprob,
)
from orchestrator.placement import per_rank_placement

ENGINE_KIND = "vllm"

# kv_transfer_params that ask a prefill engine to keep the prompt's KV for a remote decode.
_REMOTE_DECODE_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}

_ROLE_TO_KV_ROLE = {EngineRole.PREFILL: "kv_producer", EngineRole.DECODE: "kv_consumer"}


def process_env(engine: VllmEngineConfig, network: NetworkConfig) -> dict[str, str]:
    """Environment a replica process needs before vLLM or torch is imported.

    Always: engine processes exit when their parent does (our vLLM plugin,
    orchestrator/engines/vllm_plugin.py), plus the plugin's NIXL progress
    delay when configured. On CPU: a bounded KV cache, and neither OpenMP
    threads bound to every core and spin-waiting nor engine processes spinning
    on their queues (the plugin's shared-memory poll), so that several engines
    and their servers can share a machine."""
    env = {EXIT_WITH_PARENT_ENV: "1"}
    if network.nixl_progress_delay_us is not None:
        env[NIXL_PROGRESS_DELAY_ENV] = str(network.nixl_progress_delay_us)
    if network.kv_handshake_timeout_s is not None:
        env["VLLM_P2P_HANDSHAKE_TIMEOUT_S"] = str(network.kv_handshake_timeout_s)
    if engine.device is Device.CPU:
        env |= {
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": str(engine.cpu.threads),
            "OMP_WAIT_POLICY": "PASSIVE",
            "KMP_BLOCKTIME": "0",
        }
        if engine.cpu.shm_poll_us is not None:
            env[SHM_POLL_ENV] = str(engine.cpu.shm_poll_us)
            env[SHM_POLL_MAX_ENV] = str(engine.cpu.shm_poll_max_us)
    return env


def cpu_kv_cache_bytes(engine: VllmEngineConfig) -> int | None:
    """The KV cache budget in bytes on CPU (`cpu.kv_cache_gib`); None on GPU,
    where vLLM sizes it as a share of device memory."""
    return int(engine.cpu.kv_cache_gib * 2**30) if engine.device is Device.CPU else None


def planner_inputs(engine: VllmEngineConfig) -> PlannerInputs:
    return PlannerInputs(max_num_seqs=engine.max_num_seqs, kv_cache_bytes=cpu_kv_cache_bytes(engine))


# AsyncEngineArgs this adapter sets from model, kv_cache and pool settings (`VllmEngine._engine_args`):
# `engine_args` may not name them (vLLM would take the keyword twice).
OWNED_ENGINE_ARGS = frozenset(
    {
        "model",
        "tokenizer",
        "served_model_name",
        "dtype",
        "seed",
        "max_model_len",
        "block_size",
        "enable_prefix_caching",
        "tensor_parallel_size",
        "gpu_memory_utilization",
        "enforce_eager",
        "kv_transfer_config",
        "kv_events_config",
        "max_num_seqs",
        "max_num_batched_tokens",
        "kv_cache_memory_bytes",
        "distributed_executor_backend",
        "enable_lora",
        "max_loras",
        "max_lora_rank",
        "max_cpu_loras",
        "scheduling_policy",
    }
)


def check_engine_args(engine: VllmEngineConfig) -> None:
    """Raise ValueError naming any `engine_args` key this adapter sets itself, or that vLLM does not have."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    owned = sorted(OWNED_ENGINE_ARGS & set(engine.engine_args))
    if owned:
        raise ValueError(f"engine_args may not set {owned}: they come from model/kv_cache/pool settings")
    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    unknown = sorted(set(engine.engine_args) - known)
    if unknown:
        raise ValueError(f"engine.engine_args: vLLM's AsyncEngineArgs has no field(s) {unknown}")


def _lora_args(lora: LoraConfig | None) -> dict[str, Any]:
    if lora is None:
        return {}
    return {
        "enable_lora": True,
        "max_loras": lora.max_loras,
        "max_lora_rank": lora.max_lora_rank,
        "max_cpu_loras": lora.max_cpu_loras,
    }


def _lora_request(adapter: LoraAdapter | None) -> Any:
    """vLLM's LoRARequest: the engine loads the adapter from its path on first use, keyed by its id."""
    if adapter is None:
        return None
    from vllm.lora.request import LoRARequest

    return LoRARequest(adapter.name, adapter.engine_id, adapter.source)


def _load_error(e: BaseException) -> str:
    """vLLM's reason, without its pointer to a worker's stack trace."""
    message = str(e).removeprefix("Call to add_lora method failed: ")
    return message.split(", please check the stack trace")[0]


def _repetition_detection(spec: RepetitionDetection | None) -> Any:
    from vllm.sampling_params import RepetitionDetectionParams

    return None if spec is None else RepetitionDetectionParams(**dataclasses.asdict(spec))


def _extra_args(request_args: tuple[tuple[str, Any], ...], kv_transfer_params: dict[str, Any] | None) -> Any:
    """The request's own extra arguments (vllm_xargs), and the KV transfer's, which no request sets."""
    args = {name: list(value) if isinstance(value, tuple) else value for name, value in request_args}
    if kv_transfer_params:
        args["kv_transfer_params"] = kv_transfer_params
    return args or None


def _finish_reason(reason: str | None) -> FinishReason | None:
    """vLLM's finish reason as ours. vLLM's "error" (a retryable internal failure: a KV load that failed,
    ...; its own server answers a 500) is an EngineError, which the request path answers as any engine
    failure: the prefill falls back, the decode migrates. It was once read as "stop", ending the answer
    short with a normal finish."""
    if reason is None:
        return None
    if reason == "error":
        raise EngineError("the engine ended the request with an internal error (vLLM finish_reason 'error')")
    return FinishReason(reason) if reason in FinishReason._value2member_map_ else FinishReason.STOP


def structured_outputs_params(structured: StructuredOutput | None):
    """vLLM's `StructuredOutputsParams` for a constraint (None for none)."""
    if structured is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    value: object = structured.value
    if structured.kind is StructuredKind.JSON_OBJECT:
        value = True
    elif structured.kind is StructuredKind.CHOICE:
        value = list(structured.value)
    return StructuredOutputsParams(
        **{structured.kind.value: value},
        disable_any_whitespace=structured.disable_any_whitespace,
        disable_additional_properties=structured.disable_additional_properties,
        whitespace_pattern=structured.whitespace_pattern,
    )


def position_logprobs(token_ids: Any, logprobs: Any) -> tuple[PositionLogprobs, ...] | None:
    """vLLM's per-position {token id: Logprob} dicts (sampled token first, then
    the top ranks) as plain objects, in vLLM's order."""
    if logprobs is None:
        return None
    return tuple(_position(t, candidates) for t, candidates in zip(token_ids, logprobs, strict=True))


def prompt_position_logprobs(token_ids: Any, logprobs: Any) -> tuple[PositionLogprobs | None, ...] | None:
    """vLLM's prompt logprobs: as `position_logprobs`, the prompt token in the
    sampled token's place, None where vLLM has none (the first position)."""
    if logprobs is None:
        return None
    return tuple(
        None if candidates is None else _position(t, candidates)
        for t, candidates in zip(token_ids, logprobs, strict=True)
    )


def _position(token_id: int, candidates: Any) -> PositionLogprobs:
    ranked = tuple(TokenLogprob(t, float(lp.logprob), lp.decoded_token or "", lp.rank) for t, lp in candidates.items())
    sampled = next(c for c in ranked if c.token_id == token_id)
    return PositionLogprobs(sampled=sampled, candidates=ranked)


class _StatsSink:
    """Folds vLLM's per-step scheduler and iteration stats into EngineStats counters."""

    def __init__(self, lora_cache_size: int = 0) -> None:
        self.values: dict[str, Any] = EngineStats().to_dict()
        # The engine's host cache of adapters as vLLM's LRU keeps it, replayed from each step's running adapters.
        self._lora_cache: OrderedDict[str, None] = OrderedDict()
        self._lora_cache_size = lora_cache_size

    def _lora_running(self, running: dict[str, int]) -> None:
        cache = self._lora_cache
        for name, requests in running.items():
            if not requests:
                continue
            if name in cache:
                cache.move_to_end(name)
                continue
            cache[name] = None
            self.values["lora_loads_total"] += 1
            if len(cache) > self._lora_cache_size:
                cache.popitem(last=False)

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        v = self.values
        if scheduler_stats is not None:
            if scheduler_stats.running_lora_adapters:
                self._lora_running(scheduler_stats.running_lora_adapters)
            v["num_running"] = scheduler_stats.num_running_reqs
            v["num_waiting"] = scheduler_stats.num_waiting_reqs
            v["kv_cache_usage"] = scheduler_stats.kv_cache_usage
            nixl = scheduler_stats.kv_connector_stats or {}
            v["kv_transfers_total"] += len(nixl.get("transfer_duration", ()))
            v["kv_transfer_seconds_total"] += float(sum(nixl.get("transfer_duration", ())))
            v["kv_transfer_bytes_total"] += int(sum(nixl.get("bytes_transferred", ())))
            v["kv_transfer_failures_total"] += sum(
                len(nixl.get(k, ()))
                for k in ("num_failed_transfers", "num_failed_handshakes", "num_failed_notifications")
            )
        if iteration_stats is not None:
            prompt = iteration_stats.prompt_token_stats
            v["prompt_tokens_computed_total"] += prompt.computed
            v["prompt_tokens_local_cache_total"] += prompt.local_cache_hit
            v["prompt_tokens_transferred_total"] += prompt.external_kv_transfer
            v["generation_tokens_total"] += iteration_stats.num_generation_tokens
            v["requests_finished_total"] += len(iteration_stats.finished_requests)
            for finished in iteration_stats.finished_requests:
                v["decode_seconds_total"] += finished.decode_time
                v["decode_tokens_total"] += max(finished.num_generation_tokens - 1, 0)

    def snapshot(self) -> EngineStats:
        return EngineStats.from_dict(self.values)


def _stat_logger_factory(sink: _StatsSink):
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _SinkLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
            sink.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return _SinkLogger


class VllmEngine:
    def __init__(self, spec: EngineSpec) -> None:
        self._model = spec.model
        self._kv_cache = spec.kv_cache
        self._engine_cfg: VllmEngineConfig = spec.engine
        self._role = spec.role
        self._host = spec.host
        self._network = spec.network
        self._publish_kv_events = spec.publish_kv_events
        self._priority_scheduling = spec.priority_scheduling
        lora = spec.model.lora
        self._stats = _StatsSink((lora.max_cpu_loras or lora.max_loras) if lora is not None else 0)
        self._llm: Any = None
        self._info: EngineInfo | None = None
        # Each adapter loaded once (add_lora, which fails cleanly) before a request with it reaches generate.
        self._adapters = AdapterLoads(lambda a: self._llm.add_lora(_lora_request(a)), _load_error)

    # -- life cycle -----------------------------------------------------------

    def _engine_args(self, kv_events: dict[str, Any] | None):
        from vllm.engine.arg_utils import AsyncEngineArgs

        return AsyncEngineArgs(**self._owned_args(kv_events), **self._engine_cfg.engine_args)

    def _owned_args(self, kv_events: dict[str, Any] | None) -> dict[str, Any]:
        """The AsyncEngineArgs this adapter sets (keys within `OWNED_ENGINE_ARGS`)."""
        from vllm.config import KVEventsConfig, KVTransferConfig

        cfg = self._engine_cfg
        kv_transfer = None
        if self._role is not EngineRole.AGGREGATED:
            kv_transfer = KVTransferConfig(
                kv_connector="NixlConnector",
                kv_role=_ROLE_TO_KV_ROLE[self._role],
                kv_buffer_device="cpu" if cfg.device is Device.CPU else "cuda",
                kv_connector_extra_config={
                    "backends": list(self._network.nixl_backends),
                    "kv_lease_duration": self._network.kv_lease_s,
                },
                # A decode engine whose KV read fails (prefill replica gone, transfer
                # error) computes the prompt itself instead of failing the request.
                kv_load_failure_policy="recompute",
            )
        optional = {
            "max_num_seqs": cfg.max_num_seqs,
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
            # On CPU the KV cache is sized in bytes, not as a share of device memory.
            "kv_cache_memory_bytes": cpu_kv_cache_bytes(cfg),
            # Tensor-parallel workers go into the replica's placement group (deployments/app.py).
            "distributed_executor_backend": "ray" if cfg.tensor_parallel_size > 1 else None,
            **_lora_args(self._model.lora),
        }
        owned = {
            "model": self._model.weights_source,
            "tokenizer": self._model.tokenizer_source,
            "served_model_name": [self._model.name],
            "dtype": self._model.dtype,
            "seed": self._model.seed,
            "max_model_len": self._model.max_model_len,
            "block_size": self._kv_cache.block_size,
            "enable_prefix_caching": self._kv_cache.enable_prefix_caching,
            "tensor_parallel_size": cfg.tensor_parallel_size,
            "gpu_memory_utilization": cfg.gpu_memory_utilization,
            "enforce_eager": cfg.enforce_eager,
            "kv_transfer_config": kv_transfer,
            "kv_events_config": KVEventsConfig(**kv_events) if kv_events else None,
            # SLO classes: the request's priority orders the waiting queue and picks who is preempted.
            "scheduling_policy": "priority" if self._priority_scheduling else "fcfs",
            **{k: v for k, v in optional.items() if v is not None},
        }
        return owned

    async def start(self) -> EngineInfo:
        import vllm
        from vllm.v1.engine.async_llm import AsyncLLM

        # The node address vLLM binds its own sockets to (KV events among them).
        os.environ["VLLM_HOST_IP"] = self._host
        nixl_port = None
        if self._role is not EngineRole.AGGREGATED:
            # Read by the connector in the engine-core process, which inherits
            # this environment when it is spawned below.
            nixl_port = listen_port(self._host)
            os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] = self._host
            os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(nixl_port)
        args = self._engine_args(events_config(topic="kv") if self._publish_kv_events else None)
        # Creating the engine blocks for the whole model load; keep the loop free.
        # Its output handler starts on this loop at the first request.
        self._llm = await asyncio.to_thread(
            AsyncLLM.from_engine_args, args, stat_loggers=[_stat_logger_factory(self._stats)]
        )
        kv_transfer_config = self._llm.vllm_config.kv_transfer_config
        engine_id = kv_transfer_config.engine_id if kv_transfer_config is not None else str(uuid.uuid4())
        publisher = self._llm.get_kv_event_sources().get(0)  # as bound, by data-parallel rank
        self._info = EngineInfo(
            role=self._role,
            engine_kind=ENGINE_KIND,
            engine_version=vllm.__version__,
            engine_id=engine_id,
            model=self._model.name,
            block_size=self._kv_cache.block_size,
            max_model_len=self._model.max_model_len,
            host=self._host,
            kv_events_endpoint=publisher.endpoint if publisher else None,
            kv_events_replay_endpoint=publisher.replay_endpoint if publisher else None,
            nixl_side_channel_port=nixl_port,
            kv_capacity_blocks=self._llm.vllm_config.cache_config.num_gpu_blocks,
            pid=os.getpid(),
        )
        return self._info

    def shutdown(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None

    async def check_health(self) -> None:
        if self._llm is None:
            raise EngineError("engine not started")
        try:
            await self._llm.check_health()
        except Exception as e:  # EngineDeadError and whatever the core died of
            raise EngineError(f"engine unhealthy: {e}") from e

    def stats(self) -> EngineStats:
        return self._stats.snapshot()

    # -- requests -------------------------------------------------------------

    def _sampling_params(self, request: EngineRequest, kv_transfer_params: dict[str, Any] | None):
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        s = request.sampling
        return SamplingParams(
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k if s.top_k is not None else 0,
            min_p=s.min_p,
            seed=s.seed,
            stop=list(s.stop) or None,
            stop_token_ids=list(s.stop_token_ids) or None,
            ignore_eos=s.ignore_eos,
            min_tokens=s.min_tokens,
            presence_penalty=s.presence_penalty,
            frequency_penalty=s.frequency_penalty,
            repetition_penalty=s.repetition_penalty,
            logprobs=None if s.logprob_token_ids else s.logprobs,
            logprob_token_ids=list(s.logprob_token_ids) if s.logprob_token_ids else None,
            prompt_logprobs=s.prompt_logprobs,
            logit_bias=dict(s.logit_bias) or None,
            structured_outputs=structured_outputs_params(s.structured),
            skip_special_tokens=s.skip_special_tokens,
            spaces_between_special_tokens=s.spaces_between_special_tokens,
            include_stop_str_in_output=s.include_stop_str_in_output,
            allowed_token_ids=list(s.allowed_token_ids) if s.allowed_token_ids is not None else None,
            bad_words=list(s.bad_words) or None,
            output_kind=RequestOutputKind.DELTA,
            repetition_detection=_repetition_detection(s.repetition_detection),
            extra_args=_extra_args(s.extra_args, kv_transfer_params),
        )

    async def _outputs(self, request: EngineRequest, kv_transfer_params: dict[str, Any] | None):
        from vllm import TokensPrompt
        from vllm.exceptions import VLLMClientError

        if self._llm is None:
            raise EngineError("engine not started")
        params = self._sampling_params(request, kv_transfer_params)
        prompt = TokensPrompt(prompt_token_ids=list(request.prompt_token_ids))
        if request.cache_salt is not None:
            prompt["cache_salt"] = request.cache_salt
        # The frontend's trace context, where this engine exports traces (vLLM drops it, warning, where not).
        traced = request.trace_context is not None and self._engine_cfg.engine_args.get("otlp_traces_endpoint")
        extra = {"trace_headers": {"traceparent": request.trace_context}} if traced else {}
        if self._priority_scheduling:
            extra["priority"] = request.priority
        if request.lora is not None:
            await self._adapters.ensure(request.lora)
            extra["lora_request"] = _lora_request(request.lora)
        try:
            async for out in self._llm.generate(prompt, params, request.request_id, **extra):
                yield out
        except (VLLMClientError, ValueError) as e:
            raise EngineRequestRejected(str(e)) from e
        except Exception as e:  # engine death, generate errors
            raise EngineError(f"{type(e).__name__}: {e}") from e

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        kv_params = request.kv_transfer.engine_params if request.kv_transfer else None
        first = True
        async for out in self._outputs(request, kv_params):
            completion = out.outputs[0]
            yield EngineChunk(
                token_ids=tuple(completion.token_ids),
                text=completion.text,
                finish_reason=_finish_reason(completion.finish_reason),
                stop_reason=completion.stop_reason,
                num_prompt_tokens=len(request.prompt_token_ids) if first else 0,
                num_cached_tokens=(out.num_cached_tokens or 0) if first else 0,
                logprobs=position_logprobs(completion.token_ids, completion.logprobs),
                # vLLM sends them once, whole, with the output that ends the prefill.
                prompt_logprobs=prompt_position_logprobs(request.prompt_token_ids, out.prompt_logprobs or None),
            )
            first = False

    async def prefill(self, request: EngineRequest) -> PrefillResult:
        last = None
        async for out in self._outputs(request, dict(_REMOTE_DECODE_PARAMS)):
            last = out
        params = last.kv_transfer_params if last is not None else None
        if not params or not params.get("remote_block_ids"):
            raise EngineError("prefill finished without KV transfer metadata")
        block_groups = params["remote_block_ids"]
        return PrefillResult(
            kv_transfer=KVTransfer(
                source_engine_id=str(params.get("remote_engine_id")),
                num_blocks=sum(len(g) for g in block_groups),
                num_tokens=int(params.get("remote_num_tokens") or len(request.prompt_token_ids)),
                engine_params=params,
            ),
            num_prompt_tokens=len(request.prompt_token_ids),
            num_cached_tokens=last.num_cached_tokens or 0,
        )


ADAPTER = EngineAdapter(
    kind=ENGINE_KIND,
    create=VllmEngine,
    process_env=process_env,
    check_config=check_engine_args,
    kv_event_decoder=decode_batch,
    placement=per_rank_placement,
    planner_inputs=planner_inputs,
    parsers=EngineParsers(
        tool_names=vllm_tool_parsers.names,
        tool_parser=vllm_tool_parsers.VllmToolParser,
        reasoning_names=vllm_reasoning_parsers.names,
        reasoning_parser=vllm_reasoning_parsers.VllmReasoningParser,
    ),
)
