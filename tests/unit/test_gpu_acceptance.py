"""The GPU acceptance script (benchmarks/gpu/vllm_acceptance.py) has never run
on a GPU; what CI can check is that it builds valid apps from the shipped GPU
configs and starts vLLM's own server with the same engine settings."""

from __future__ import annotations

from benchmarks.gpu.vllm_acceptance import bare_vllm_command, configs
from orchestrator.config import Device


def test_the_shipped_gpu_configs_shrink_to_one_aggregated_and_one_pd_pair():
    cfgs = configs("org/model")
    agg, disagg = cfgs["agg"], cfgs["disagg"]
    assert agg.prefill_pool is None and agg.decode_pool.replicas == 1
    assert disagg.prefill_pool.replicas == disagg.decode_pool.replicas == 1
    for pool in (agg.decode_pool, disagg.prefill_pool, disagg.decode_pool):
        assert pool.engine.kind == "vllm" and pool.engine.device is Device.CUDA and pool.num_gpus == 1
    assert agg.model.name == disagg.model.name == "org/model"


def test_vllms_own_server_gets_the_aggregated_pools_engine_settings():
    agg = configs("org/model")["agg"]
    cmd = bare_vllm_command(agg, 8123)
    args = cmd[3:]
    flags = {a: (b if not b.startswith("--") else "") for a, b in zip(args, args[1:] + ["--"]) if a.startswith("--")}
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert flags["--model"] == agg.model.weights_source and flags["--dtype"] == agg.model.dtype
    assert flags["--block-size"] == str(agg.kv_cache.block_size)
    assert flags["--max-model-len"] == str(agg.model.max_model_len)
    assert flags["--gpu-memory-utilization"] == str(agg.decode_pool.engine.gpu_memory_utilization)
    assert flags["--max-num-seqs"] == str(agg.decode_pool.engine.max_num_seqs)
    assert flags["--enable-prefix-caching"] == ""
