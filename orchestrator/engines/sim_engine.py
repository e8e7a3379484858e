"""The simulated engine behind the same `Engine` interface as the vLLM adapter.

A `SimCore` (orchestrator/sim/core.py) steps in real time: each step's
duration comes from the performance model and the step's output is handed
out when that much wall time has passed. KV cache events go out over ZMQ in
vLLM's wire format, so the frontend's subscriber and index follow simulated
replicas unchanged. Output tokens come from the simulated model
(`orchestrator.sim.core.next_token`) within the tokenizer's vocabulary and
are detokenized with it; stop strings and EOS are not modelled (a request
runs to `max_tokens`).

Disaggregated handoff: a prefill keeps its blocks (HELD) after its first
token for the modelled transfer time of its prompt's KV, then frees them;
a decode request carrying a transfer waits that transfer time (link model,
orchestrator/sim/link.py) before its prompt counts as computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from orchestrator.config import SimEngineConfig
from orchestrator.engines.adapter import EngineAdapter, EngineSpec, PlannerInputs, no_config_check, no_process_env
from orchestrator.engines.base import EngineError, EngineInfo, EngineRequestRejected, EngineStats
from orchestrator.engines.vllm_kv_events import decode_batch
from orchestrator.messages import EngineChunk, EngineRequest, FinishReason, KVTransfer, PrefillResult
from orchestrator.placement import per_rank_placement
from orchestrator.sim.core import Emitted, SimCore, SimRequest
from orchestrator.sim.link import LINKS
from orchestrator.sim.lora_slots import lora_spec
from orchestrator.sim.perf_model import GPUS, MODELS, PerfModel, ProfileModel, roofline

ENGINE_KIND = "sim"
SIM_VERSION = "1"


def perf_model(cfg: SimEngineConfig) -> PerfModel:
    if cfg.profile is not None:
        return ProfileModel.load(cfg.profile)
    return roofline(cfg.gpu, cfg.model, tp=cfg.tensor_parallel_size)


def kv_capacity_blocks(cfg: SimEngineConfig, perf: PerfModel, block_size: int) -> int:
    """Blocks of KV the modelled GPU(s) hold next to the weights."""
    if cfg.num_gpu_blocks is not None:
        return cfg.num_gpu_blocks
    if isinstance(perf, ProfileModel):
        blocks = perf.meta.get("kv_capacity_tokens", 0) // block_size
        if not blocks:
            raise ValueError(f"profile {cfg.profile} records no KV capacity: set engine.num_gpu_blocks")
        return blocks
    gpu, model = GPUS[cfg.gpu], MODELS[cfg.model]
    free = gpu.memory_gib * 2**30 * cfg.gpu_memory_utilization * cfg.tensor_parallel_size - model.weights_bytes
    blocks = int(free // (model.kv_bytes_per_token * block_size))
    if blocks <= 0:
        raise ValueError(f"{cfg.model} does not fit {cfg.tensor_parallel_size}x {cfg.gpu}")
    return blocks


def own_performance(cfg: SimEngineConfig, block_size: int) -> tuple[PerfModel, int]:
    """The engine's performance model and its KV capacity in tokens."""
    perf = perf_model(cfg)
    return perf, kv_capacity_blocks(cfg, perf, block_size) * block_size


def planner_inputs(cfg: SimEngineConfig) -> PlannerInputs:
    return PlannerInputs(max_num_seqs=cfg.max_num_seqs, own_performance=functools.partial(own_performance, cfg))


def load_detokenizer(source: str):
    """The model's fast tokenizer (`tokenizer.json`), without transformers: a
    simulated replica only turns its token ids into text."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(source) / "tokenizer.json"))


def _needs_logits(request: EngineRequest) -> str | None:
    """The first output option that a simulated engine, which computes no logits, cannot honour."""
    s = request.sampling
    if s.logprobs is not None:
        return "logprobs"
    if s.prompt_logprobs is not None:
        return "prompt_logprobs"
    if s.structured is not None:
        return "a structured output"
    if s.logit_bias:
        return "logit_bias"
    if s.allowed_token_ids is not None or s.bad_words:
        return "allowed_token_ids / bad_words"
    return None


class SimEngine:
    def __init__(self, spec: EngineSpec, clock: Callable[[], float] = time.monotonic) -> None:
        self._model, self._kv_cache, self._role, self._host = spec.model, spec.kv_cache, spec.role, spec.host
        self._cfg: SimEngineConfig = spec.engine
        self._publish_kv_events = spec.publish_kv_events
        self._clock = clock
        self._engine_id = f"sim-{uuid.uuid4().hex[:12]}"
        self._perf = perf_model(self._cfg)
        self._link = LINKS[self._cfg.link]
        self._core: SimCore | None = None
        self._tokenizer = None
        self._publisher = None
        self._streams: dict[str, asyncio.Queue[Emitted]] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._t0 = 0.0
        self._transfers = {"count": 0, "bytes": 0, "seconds": 0.0}

    async def start(self) -> EngineInfo:
        self._tokenizer = await asyncio.to_thread(load_detokenizer, self._model.tokenizer_source)
        blocks = kv_capacity_blocks(self._cfg, self._perf, self._kv_cache.block_size)
        self._core = SimCore(
            self._perf,
            blocks,
            self._kv_cache.block_size,
            self._cfg.max_num_seqs,
            self._cfg.max_num_batched_tokens,
            self._kv_cache.enable_prefix_caching,
            vocab_size=self._tokenizer.get_vocab_size(),
            lora=lora_spec(self._model.lora, self._cfg.lora_load_s),
        )
        events, replay = None, None
        if self._publish_kv_events:
            from orchestrator.kv.publisher import ZmqKVEventPublisher

            self._publisher = ZmqKVEventPublisher(self._host, topic=f"kv@{self._engine_id}")
            self._publisher.start()
            events, replay = self._publisher.endpoint, self._publisher.replay_endpoint
        self._t0 = self._clock()
        self._loop_task = asyncio.create_task(self._run())
        return EngineInfo(
            role=self._role,
            engine_kind=ENGINE_KIND,
            engine_version=SIM_VERSION,
            engine_id=self._engine_id,
            model=self._model.name,
            block_size=self._kv_cache.block_size,
            max_model_len=self._model.max_model_len,
            host=self._host,
            kv_events_endpoint=events,
            kv_events_replay_endpoint=replay,
            kv_capacity_blocks=blocks,
            kv_bytes_per_token=self._perf.kv_bytes_per_token,
            pid=os.getpid(),
        )

    # -- the step loop ----------------------------------------------------------

    def _elapsed(self) -> float:
        return self._clock() - self._t0

    async def _run(self) -> None:
        """Step while there is work; each step's output is released when the
        step's modelled duration has passed in wall time."""
        core = self._core
        while True:
            if not core.has_work():
                self._wake.clear()
                await self._wake.wait()
                continue
            core.now = self._elapsed()
            result = core.step()
            if result.duration_s == 0.0:  # only transfers in flight, or waiting for blocks
                landing = core.next_transfer_at()
                await asyncio.sleep(max(landing - core.now, 0.001) if landing is not None else 0.001)
                continue
            await asyncio.sleep(max(core.now - self._elapsed(), 0.0))
            if self._publisher is not None and result.events:
                await self._publisher.publish(result.events, time.time())
            for emitted in result.emitted:
                stream = self._streams.get(emitted.request_id)
                if stream is not None:
                    stream.put_nowait(emitted)

    def _submit(self, request: SimRequest) -> asyncio.Queue[Emitted]:
        if self._loop_task is None or self._loop_task.done():
            raise EngineError("simulated engine not running")
        needed = -(-len(request.prompt) // self._kv_cache.block_size)
        if needed > self._core.blocks.num_blocks:
            raise EngineRequestRejected(
                f"prompt of {len(request.prompt)} tokens needs {needed} KV blocks; the engine has "
                f"{self._core.blocks.num_blocks}"
            )
        stream: asyncio.Queue[Emitted] = asyncio.Queue()
        self._streams[request.request_id] = stream
        self._core.add(request)
        self._wake.set()
        return stream

    def _transfer_time(self, num_tokens: int) -> float:
        return self._link.transfer_time(num_tokens * self._perf.kv_bytes_per_token)

    # -- requests ---------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        unsupported = _needs_logits(request)
        if unsupported:
            raise EngineRequestRejected(f"{unsupported} needs a model's logits; the simulated engine has none")
        if request.sampling.repetition_detection is not None:
            raise EngineRequestRejected(
                "repetition_detection reads a model's output; the simulated engine's is synthetic"
            )
        transfer_s = None
        if request.kv_transfer is not None:
            transfer_s = self._transfer_time(request.kv_transfer.num_tokens)
            self._record_transfer(request.kv_transfer.num_tokens, transfer_s)
        sim = SimRequest(
            request.request_id,
            list(request.prompt_token_ids),
            request.sampling.max_tokens,
            transfer_done_at=None if transfer_s is None else self._elapsed() + transfer_s,
            cache_salt=request.cache_salt,
            lora_name=request.lora.name if request.lora else None,
            priority=request.priority,
        )
        stream = self._submit(sim)
        finished = False
        first = True
        try:
            while not finished:
                emitted = await stream.get()
                finished = emitted.finished
                yield EngineChunk(
                    token_ids=(emitted.token_id,),
                    text=self._tokenizer.decode([emitted.token_id]),
                    finish_reason=FinishReason.LENGTH if finished else None,
                    num_prompt_tokens=len(sim.prompt) if first else 0,
                    num_cached_tokens=(sim.cached_tokens + sim.transferred_tokens) if first else 0,
                )
                first = False
        finally:
            self._streams.pop(request.request_id, None)
            if not finished:
                self._core.abort(request.request_id)

    async def prefill(self, request: EngineRequest) -> PrefillResult:
        sim = SimRequest(
            request.request_id,
            list(request.prompt_token_ids),
            1,
            hold_for_transfer=True,
            cache_salt=request.cache_salt,
            lora_name=request.lora.name if request.lora else None,
            priority=request.priority,
        )
        stream = self._submit(sim)
        try:
            await stream.get()
        except BaseException:
            self._core.abort(request.request_id)
            raise
        finally:
            self._streams.pop(request.request_id, None)
        # The blocks stay HELD for as long as the decode side takes to read them.
        lease_s = self._transfer_time(len(sim.prompt))
        asyncio.get_running_loop().call_later(lease_s, self._core.release, request.request_id)
        block_size = self._kv_cache.block_size
        return PrefillResult(
            kv_transfer=KVTransfer(
                source_engine_id=self._engine_id,
                num_blocks=-(-len(sim.prompt) // block_size),
                num_tokens=len(sim.prompt),
                engine_params={"sim_request_id": request.request_id},
            ),
            num_prompt_tokens=len(sim.prompt),
            num_cached_tokens=sim.cached_tokens,
        )

    def _record_transfer(self, num_tokens: int, seconds: float) -> None:
        self._transfers["count"] += 1
        self._transfers["bytes"] += num_tokens * self._perf.kv_bytes_per_token
        self._transfers["seconds"] += seconds

    # -- reports ----------------------------------------------------------------

    def stats(self) -> EngineStats:
        core = self._core
        if core is None:
            return EngineStats()
        return EngineStats(
            num_running=core.num_running,
            num_waiting=core.num_waiting,
            kv_cache_usage=core.blocks.usage,
            prompt_tokens_computed_total=core.prompt_tokens_computed,
            prompt_tokens_local_cache_total=core.prompt_tokens_cached,
            prompt_tokens_transferred_total=core.prompt_tokens_transferred,
            generation_tokens_total=core.generation_tokens,
            requests_finished_total=core.finished,
            lora_loads_total=core.loras.loads if core.loras is not None else 0,
            kv_transfers_total=self._transfers["count"],
            kv_transfer_bytes_total=self._transfers["bytes"],
            kv_transfer_seconds_total=self._transfers["seconds"],
        )

    async def check_health(self) -> None:
        task = self._loop_task
        if task is None:
            raise EngineError("engine not started")
        if task.done():
            error = None if task.cancelled() else task.exception()
            raise EngineError(f"simulated engine loop stopped: {error!r}")

    def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
        if self._publisher is not None:
            with contextlib.suppress(Exception):
                self._publisher.close()
            self._publisher = None


# The simulated engine publishes KV events in vLLM's wire format, and runs in
# its replica's process (no GPUs, so no placement group: `placement` unused).
ADAPTER = EngineAdapter(
    kind=ENGINE_KIND,
    create=SimEngine,
    process_env=no_process_env,
    check_config=no_config_check,
    kv_event_decoder=decode_batch,
    placement=per_rank_placement,
    planner_inputs=planner_inputs,
)
