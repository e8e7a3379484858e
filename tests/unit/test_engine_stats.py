"""The vLLM adapter's folding of per-step engine stats into counters, fed vLLM 0.32's own stats
objects: `SchedulerStats` carrying the NIXL connector's stats as the scheduler ships them,
and `IterationStats` filled by vLLM's update methods from engine-core outputs, so a renamed
or re-meant vLLM field fails here rather than reading as zero in production."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass

import pytest
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats
from vllm.v1.engine import EngineCoreOutput, FinishReason
from vllm.v1.metrics.loggers import PerEngineStatLoggerAdapter
from vllm.v1.metrics.stats import IterationStats, LoRARequestStates, PrefillStats, RequestStateStats, SchedulerStats

from orchestrator.config import NetworkConfig, VllmEngineConfig
from orchestrator.engines.base import EngineInfo, EngineRole, EngineStats
from orchestrator.engines.vllm_engine import _stat_logger_factory, _StatsSink, process_env


def _engine_stat_logger(sink: _StatsSink) -> PerEngineStatLoggerAdapter:
    """Our stat logger as AsyncLLM holds it: vLLM wraps each `stat_loggers` factory in this
    per-engine adapter (which hands the config to the factory untouched) and calls its
    `record` once per engine step."""
    return PerEngineStatLoggerAdapter(
        vllm_config=None, engine_indexes=[0], per_engine_stat_logger_factory=_stat_logger_factory(sink)
    )


@dataclass(frozen=True)
class _NixlTelemetry:
    """What `NixlKVConnectorStats.record_transfer` reads of one transfer: nixl's `nixlXferTelemetry`,
    whose fields are read-only and filled only by a real transfer (durations in microseconds)."""

    xferDuration: float
    postDuration: float
    totalBytes: int
    descCount: int


def _nixl_payload(transfers=(), failed_transfers=0, failed_handshakes=0, failed_notifications=0, expired=0):
    """The NIXL connector's stats for one step, as the scheduler puts them in `SchedulerStats`:
    recorded through the connector's own methods, then `to_dict()`. `transfers`: (seconds, bytes);
    `expired`: requests whose KV expired on the prefill side, each with a notification arriving after."""
    stats = NixlKVConnectorStats()
    for seconds, nbytes in transfers:
        stats.record_transfer(_NixlTelemetry(seconds * 1e6, 5.0, nbytes, 4))
    for _ in range(failed_transfers):
        stats.record_failed_transfer()
    for _ in range(failed_handshakes):
        stats.record_failed_handshake()
    for _ in range(failed_notifications):
        stats.record_failed_notification()
    for _ in range(expired):
        stats.record_kv_expired_req()
        stats.record_notification_after_expiry()
    return stats.to_dict()


class _Request:
    """One request's stats as vLLM's output processor keeps them between engine steps: its
    `RequestStateStats`, and whether its next output is the one that ends its prefill."""

    def __init__(self, request_id: str, prompt: int, local_cache_hit: int = 0, transferred: int = 0) -> None:
        self.request_id = request_id
        self.prefill = PrefillStats()
        self.prefill.set(prompt, local_cache_hit, transferred)
        self.stats = RequestStateStats(arrival_time=0.0)
        self.prefilling = True

    def emits(self, iteration: IterationStats, at: float, tokens: int = 1) -> None:
        """An engine-core output of `tokens` new tokens stamped `at` (engine-core time), folded into
        `iteration` by vLLM; the first carries the prefill's breakdown of the prompt."""
        output = EngineCoreOutput(
            request_id=self.request_id,
            new_token_ids=list(range(tokens)),
            prefill_stats=self.prefill if self.prefilling else None,
        )
        iteration.update_from_output(output, at, self.prefilling, self.stats, LoRARequestStates(), None)
        self.prefilling = False

    def finishes(self, iteration: IterationStats, reason: FinishReason = FinishReason.LENGTH) -> None:
        """vLLM's `FinishedRequestStats` for this request, appended to `iteration`."""
        iteration.update_from_finished_request(
            reason, self.request_id, self.prefill.num_prompt_tokens, None, self.stats
        )


def test_sink_keeps_latest_gauges_and_sums_counters():
    """Gauges are the last scheduler stats reported (a step without them keeps them); counters sum
    every step's prompt breakdown, generated tokens, finished requests and NIXL transfers, whose
    failures are the transfer, handshake and notification failures vLLM itself groups as failed
    transfers (KV expiry is not one)."""
    sink = _StatsSink()
    logger = _engine_stat_logger(sink)
    remote = _Request("remote", prompt=300, transferred=299)  # its KV pulled from a prefill engine
    cached = _Request("cached", prompt=40, local_cache_hit=32)
    short = _Request("short", prompt=5)
    aborted = _Request("aborted", prompt=7)  # waits, then is cancelled before its first token

    step = IterationStats()
    remote.emits(step, at=10.00)
    cached.emits(step, at=10.00)
    nixl = _nixl_payload(
        transfers=[(0.01, 1000), (0.02, 3000)],
        failed_transfers=1,
        failed_handshakes=2,
        failed_notifications=3,
        expired=4,
    )
    logger.record(
        SchedulerStats(num_running_reqs=2, num_waiting_reqs=2, kv_cache_usage=0.25, kv_connector_stats=nixl), step
    )

    step = IterationStats()
    remote.emits(step, at=10.01)
    cached.emits(step, at=10.01)
    logger.record(SchedulerStats(num_running_reqs=3, num_waiting_reqs=1, kv_cache_usage=0.3), step)

    step = IterationStats()
    remote.emits(step, at=10.03)
    remote.finishes(step)
    cached.emits(step, at=10.03)
    short.emits(step, at=10.03)
    short.finishes(step, FinishReason.STOP)
    aborted.finishes(step, FinishReason.ABORT)
    # Two new requests queue behind the one left running.
    logger.record(SchedulerStats(num_running_reqs=1, num_waiting_reqs=2, kv_cache_usage=0.1), step)

    step = IterationStats()
    cached.emits(step, at=10.05, tokens=2)  # a step may carry more than one token of a request
    cached.finishes(step)
    logger.record(None, step)
    logger.record(None, None)

    s = sink.snapshot()
    assert (s.num_running, s.num_waiting, s.kv_cache_usage) == (1, 2, 0.1)
    assert s.kv_transfers_total == 2 and s.kv_transfer_bytes_total == 4000
    assert s.kv_transfer_seconds_total == pytest.approx(0.03)
    assert s.kv_transfer_failures_total == 1 + 2 + 3
    assert (s.prompt_tokens_computed_total, s.prompt_tokens_transferred_total, s.prompt_tokens_local_cache_total) == (
        1 + 8 + 5,
        299,
        32,
    )
    assert s.generation_tokens_total == 3 + 5 + 1 and s.requests_finished_total == 4
    # Engine-side decode: each finished request's tokens after its first (none for one aborted
    # before it had any), and the engine-core time from its first token to its last.
    assert s.decode_tokens_total == 2 + 4 + 0 + 0
    assert s.decode_seconds_total == pytest.approx(0.03 + 0.05)


def test_stats_and_info_survive_the_dict_round_trip():
    stats = EngineStats(num_running=3, kv_transfer_bytes_total=10)
    assert EngineStats.from_dict(stats.to_dict() | {"unknown": 1}) == stats
    info = EngineInfo(EngineRole.DECODE, "vllm", "0.32.0", "e", "m", 32, 4096, "127.0.0.1", None, 5600)
    assert EngineInfo.from_dict(info.to_dict()) == info


def test_cpu_engines_get_quiet_openmp_settings_and_gpu_engines_none():
    cpu = process_env(VllmEngineConfig(device="cpu", cpu={"kv_cache_gib": 2, "threads": 1}), NetworkConfig())
    assert cpu["OMP_WAIT_POLICY"] == "PASSIVE" and cpu["KMP_BLOCKTIME"] == "0"
    assert cpu["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and cpu["OMP_NUM_THREADS"] == "1"
    assert cpu["ORCHESTRATOR_SHM_POLL_US"] == "50" and cpu["ORCHESTRATOR_SHM_POLL_MAX_US"] == "1000"
    spinning = process_env(VllmEngineConfig(device="cpu", cpu={"shm_poll_us": None}), NetworkConfig())
    assert "ORCHESTRATOR_SHM_POLL_US" not in spinning
    assert process_env(VllmEngineConfig(device="cuda"), NetworkConfig()) == {"ORCHESTRATOR_EXIT_WITH_PARENT": "1"}


def test_a_nixl_progress_delay_reaches_the_engine_processes():
    env = process_env(VllmEngineConfig(device="cuda"), NetworkConfig(nixl_progress_delay_us=500))
    assert env["ORCHESTRATOR_NIXL_PROGRESS_DELAY_US"] == "500"


def test_engine_args_may_not_name_what_the_adapter_sets():
    """With every optional setting given, the adapter writes exactly `OWNED_ENGINE_ARGS`: the
    build-time check and the engine's construction cannot drift apart."""
    from orchestrator.config import KVCacheConfig, LoraConfig, ModelConfig
    from orchestrator.engines.adapter import EngineSpec
    from orchestrator.engines.vllm_engine import OWNED_ENGINE_ARGS, VllmEngine, check_engine_args
    from orchestrator.engines.vllm_kv_events import events_config

    engine = VllmEngineConfig(device="cpu", max_num_seqs=8, max_num_batched_tokens=512, tensor_parallel_size=1)
    model = ModelConfig(name="m", source="/models/m", max_model_len=1024, lora=LoraConfig(max_cpu_loras=4))
    for role in (EngineRole.PREFILL, EngineRole.AGGREGATED):
        spec = EngineSpec(model, KVCacheConfig(block_size=32), engine, role, "127.0.0.1", NetworkConfig())
        owned = set(VllmEngine(spec)._owned_args(events_config(topic="kv")))
        assert owned == OWNED_ENGINE_ARGS - {"distributed_executor_backend"}  # set for tensor parallel > 1 only
        assert VllmEngine(spec)._owned_args(None)["scheduling_policy"] == "fcfs"
        classes = dataclasses.replace(spec, priority_scheduling=True)  # traffic.classes configured
        assert VllmEngine(classes)._owned_args(None)["scheduling_policy"] == "priority"
    check_engine_args(VllmEngineConfig(engine_args={"long_prefill_token_threshold": 256}))
    for key in sorted(OWNED_ENGINE_ARGS):
        with pytest.raises(ValueError, match=re.escape(f"engine_args may not set ['{key}']")):
            check_engine_args(VllmEngineConfig(engine_args={key: 1}))


def test_adapter_loads_replay_vllms_host_cache_from_the_adapters_each_step_runs():
    """vLLM counts no adapter loads; the sink replays its LRU host cache (max_cpu_loras entries) over the
    running adapters vLLM's own LoRARequestStates writes into each step's SchedulerStats."""
    sink = _StatsSink(lora_cache_size=2)
    logger = _engine_stat_logger(sink)
    loras = LoRARequestStates(log_stats=True)
    steps = [["a"], ["a", "b"], ["b"], ["c"], ["a"], ["b"]]  # c evicts a; a then evicts b: 5 loads
    for i, running in enumerate(steps):
        for name in running:
            loras.request_running(f"{name}-{i}", name)
        stats = SchedulerStats(num_running_reqs=len(running))
        loras.update_scheduler_stats(stats)
        logger.record(stats, None)
        for name in running:
            loras.request_finished(f"{name}-{i}", name)
    assert sink.snapshot().lora_loads_total == 5
