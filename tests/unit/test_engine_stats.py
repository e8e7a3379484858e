"""The vLLM adapter's folding of per-step engine stats into counters, fed with
the shapes vLLM 0.32 reports (scheduler stats, NIXL connector stats,
iteration stats)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from orchestrator.config import NetworkConfig, VllmEngineConfig
from orchestrator.engines.base import EngineInfo, EngineRole, EngineStats
from orchestrator.engines.vllm_engine import _StatsSink, process_env


def _scheduler(running=0, waiting=0, usage=0.0, nixl=None):
    return SimpleNamespace(
        num_running_reqs=running, num_waiting_reqs=waiting, kv_cache_usage=usage, kv_connector_stats=nixl
    )


def _finished(tokens: int, decode_s: float):
    return SimpleNamespace(num_generation_tokens=tokens, decode_time=decode_s)


def _iteration(computed=0, local=0, external=0, generated=0, finished=()):
    prompt = SimpleNamespace(computed=computed, local_cache_hit=local, external_kv_transfer=external)
    return SimpleNamespace(prompt_token_stats=prompt, num_generation_tokens=generated, finished_requests=list(finished))


def test_sink_keeps_latest_gauges_and_sums_counters():
    sink = _StatsSink()
    nixl = {
        "transfer_duration": [0.01, 0.02],
        "bytes_transferred": [1000, 3000],
        "num_failed_transfers": [1],
        "num_failed_handshakes": [],
        "num_failed_notifications": [1],
    }
    sink.record(
        _scheduler(running=2, waiting=1, usage=0.25, nixl=nixl), _iteration(computed=1, external=299, generated=2)
    )
    sink.record(_scheduler(running=1, usage=0.1), _iteration(local=32, generated=1, finished=[_finished(3, 0.02)]))
    sink.record(None, _iteration(finished=[_finished(1, 0.0), _finished(5, 0.08)]))
    sink.record(None, None)
    s = sink.snapshot()
    assert (s.num_running, s.num_waiting, s.kv_cache_usage) == (1, 0, 0.1)
    assert s.kv_transfers_total == 2 and s.kv_transfer_bytes_total == 4000
    assert abs(s.kv_transfer_seconds_total - 0.03) < 1e-9 and s.kv_transfer_failures_total == 2
    assert (s.prompt_tokens_computed_total, s.prompt_tokens_transferred_total, s.prompt_tokens_local_cache_total) == (
        1,
        299,
        32,
    )
    assert s.generation_tokens_total == 3 and s.requests_finished_total == 3
    # Engine-side decode: tokens after each request's first, and the time they took.
    assert s.decode_tokens_total == 2 + 0 + 4 and abs(s.decode_seconds_total - 0.1) < 1e-9


def test_stats_and_info_survive_the_dict_round_trip():
    stats = EngineStats(num_running=3, kv_transfer_bytes_total=10)
    assert EngineStats.from_dict(stats.to_dict() | {"unknown": 1}) == stats
    info = EngineInfo(EngineRole.DECODE, "vllm", "0.32.0", "e", "m", 32, 4096, "127.0.0.1", None, 5600)
    assert EngineInfo.from_dict(info.to_dict()) == info


def test_cpu_engines_get_quiet_openmp_settings_and_gpu_engines_none():
    cpu = process_env(VllmEngineConfig(device="cpu", cpu={"kv_cache_gib": 2, "threads": 1}), NetworkConfig())
    assert cpu["OMP_WAIT_POLICY"] == "PASSIVE" and cpu["KMP_BLOCKTIME"] == "0"
    assert cpu["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and cpu["OMP_NUM_THREADS"] == "1"
    assert cpu["ORCHESTRATOR_SHM_POLL_US"] == "50"
    spinning = process_env(VllmEngineConfig(device="cpu", cpu={"shm_poll_us": None}), NetworkConfig())
    assert "ORCHESTRATOR_SHM_POLL_US" not in spinning
    assert process_env(VllmEngineConfig(device="cuda"), NetworkConfig()) == {"ORCHESTRATOR_EXIT_WITH_PARENT": "1"}


def test_a_nixl_progress_delay_reaches_the_engine_processes():
    env = process_env(VllmEngineConfig(device="cuda"), NetworkConfig(nixl_progress_delay_us=500))
    assert env["ORCHESTRATOR_NIXL_PROGRESS_DELAY_US"] == "500"


def test_engine_args_may_not_name_what_the_adapter_sets():
    """With every optional setting given, the adapter writes exactly `OWNED_ENGINE_ARGS`: the
    build-time check and the engine's construction cannot drift apart."""
    from orchestrator.config import KVCacheConfig, ModelConfig
    from orchestrator.engines.adapter import EngineSpec
    from orchestrator.engines.vllm_engine import OWNED_ENGINE_ARGS, VllmEngine, check_engine_args
    from orchestrator.engines.vllm_kv_events import events_config

    engine = VllmEngineConfig(device="cpu", max_num_seqs=8, max_num_batched_tokens=512, tensor_parallel_size=1)
    model = ModelConfig(name="m", source="/models/m", max_model_len=1024)
    for role in (EngineRole.PREFILL, EngineRole.AGGREGATED):
        spec = EngineSpec(model, KVCacheConfig(block_size=32), engine, role, "127.0.0.1", NetworkConfig())
        owned = set(VllmEngine(spec)._owned_args(events_config(topic="kv")))
        assert owned == OWNED_ENGINE_ARGS - {"distributed_executor_backend"}  # set for tensor parallel > 1 only
    check_engine_args(VllmEngineConfig(engine_args={"long_prefill_token_threshold": 256}))
    for key in sorted(OWNED_ENGINE_ARGS):
        with pytest.raises(ValueError, match=re.escape(f"engine_args may not set ['{key}']")):
            check_engine_args(VllmEngineConfig(engine_args={key: 1}))
