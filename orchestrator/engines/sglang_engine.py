"""SGLang adapter: one `sglang.Engine` in one pool replica, in SGLang's
disaggregation role (prefill / decode / aggregated = "null").

The runtime: the engine's life cycle, its streams and aborts. The adapter's
other parts translate without SGLang: `sglang_server_args` (settings ->
ServerArgs, ports, environment, checks), `sglang_requests` (EngineRequest ->
`generate` arguments), `sglang_outputs` (outputs -> EngineChunks, stats,
EngineInfo), `sglang_kv_events`, `sglang_logprobs`. This module alone touches
SGLang, imported inside methods. SGLang needs CUDA: this adapter runs only on
GPU machines (benchmarks/gpu/sglang_pd.py); on CPU machines its translations
are tested against the pinned SGLang's own classes (installed without its
dependencies) and, where those cannot be imported without CUDA, against
payloads recorded from its source (tests/fixtures/sglang/).

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
import os
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from orchestrator.engines.adapter import EngineAdapter, EngineSpec
from orchestrator.engines.adapter_loads import AdapterLoads
from orchestrator.engines.base import (
    EngineError,
    EngineInfo,
    EngineRequestRejected,
    EngineStats,
    KVHandoff,
)
from orchestrator.engines.ports import PortReservation
from orchestrator.engines.sglang_kv_events import decode_batch
from orchestrator.engines.sglang_outputs import (
    ChunkDecoder,
    SglangOutput,
    StatsSink,
    abort_error,
    engine_info,
    parse_output,
    stream_mode,
)
from orchestrator.engines.sglang_requests import generate_kwargs
from orchestrator.engines.sglang_server_args import (
    ENGINE_KIND,
    check_config,
    draw_ports,
    planner_inputs,
    process_env,
    server_args_kwargs,
)
from orchestrator.lora.adapter import LoraAdapter
from orchestrator.messages import (
    EngineChunk,
    EngineRequest,
    FinishReason,
    PrefillResult,
)
from orchestrator.placement import one_bundle_placement

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
        # Each adapter loaded once (SGLang's async_load_lora_adapter) before a request names it.
        self._adapters = AdapterLoads(self._load_adapter, str)

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

    async def _load_adapter(self, adapter: LoraAdapter) -> None:
        """SGLang's dynamic load; its refusal (`success` false) raised with its own message."""
        result = await self._engine.async_load_lora_adapter(adapter.name, adapter.source)
        if not getattr(result, "success", False):
            raise EngineRequestRejected(getattr(result, "error_message", None) or "SGLang refused the adapter")

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
        if request.lora is not None:
            await self._adapters.ensure(request.lora)
        rid = f"{request.request_id}-{uuid.uuid4().hex[:8]}"
        done = False
        self._stats.started()
        try:
            kwargs = generate_kwargs(request, rid, stream, self._spec.priority_scheduling)
            result = await self._engine.async_generate(**kwargs)
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
