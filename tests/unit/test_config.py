"""Configuration: one pydantic tree, explicit errors naming the field."""

from __future__ import annotations

import copy

import pytest
import yaml
from pydantic import ValidationError

from orchestrator.config import AppConfig, ServingMode, load_app_config

BASE = {
    "model": {"name": "m", "source": "/models/m", "max_model_len": 1024},
    "kv_cache": {"block_size": 32},
    "prefill_pool": {"engine": {"kind": "vllm", "device": "cpu"}},
    "decode_pool": {"engine": {"kind": "vllm", "device": "cpu"}},
}


def _with(path: str, value):
    cfg = copy.deepcopy(BASE)
    node = cfg
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return cfg


def _error(cfg) -> str:
    with pytest.raises(ValidationError) as e:
        AppConfig.model_validate(cfg)
    return str(e.value)


def test_minimal_config_is_disaggregated_with_defaults():
    cfg = AppConfig.model_validate(BASE)
    assert cfg.mode is ServingMode.DISAGGREGATED
    assert set(cfg.pools()) == {"prefill_pool", "decode_pool"}
    assert cfg.decode_pool.replicas == 1 and cfg.decode_pool.num_gpus == 0
    assert cfg.frontend.prefill_timeout_s > 0


def test_without_a_prefill_pool_it_is_aggregated():
    cfg = copy.deepcopy(BASE)
    del cfg["prefill_pool"]
    assert AppConfig.model_validate(cfg).mode is ServingMode.AGGREGATED


def test_gpu_pools_ask_for_their_gpus():
    cfg = AppConfig.model_validate(_with("decode_pool.engine.device", "cuda"))
    assert cfg.decode_pool.num_gpus == 1


@pytest.mark.parametrize(
    "path, value, fragment",
    [
        ("decode_pool.engine.devise", "cpu", "decode_pool.engine.vllm.devise"),
        ("model.max_model_len", -1, "model.max_model_len"),
        ("decode_pool.replicas", 0, "decode_pool.replicas"),
        ("prefill_pool.engine.cpu.kv_cache_gib", 0, "prefill_pool.engine.vllm.cpu.kv_cache_gib"),
        ("decode_pool.engine.kind", "tensorrt", "engine.kind must be 'vllm', 'sim' or 'sglang'"),
        ("frontend.prefill_timeout_s", 0, "frontend.prefill_timeout_s"),
        ("kv_cache.block_size", 16, "block_size=16"),
        ("decode_pool.engine.engine_args", {"block_size": 64}, "engine_args may not set ['block_size']"),
        ("decode_pool.engine.tensor_parallel_size", 2, "tensor_parallel_size"),
        ("routing.policy", "random", "routing.policy"),
    ],
)
def test_bad_values_fail_naming_the_field(path, value, fragment):
    assert fragment in _error(_with(path, value))


def test_local_sources_are_resolved_and_hub_ids_kept(tmp_path):
    cfg = AppConfig.model_validate(_with("model.source", "~/models/x"))
    assert cfg.model.weights_source.startswith("/") and "~" not in cfg.model.weights_source
    hub = AppConfig.model_validate(_with("model.source", "meta-llama/Llama-3.1-8B-Instruct"))
    assert hub.model.weights_source == "meta-llama/Llama-3.1-8B-Instruct"
    assert hub.model.tokenizer_source == hub.model.weights_source


def test_load_reads_the_args_of_a_serve_config(tmp_path):
    path = tmp_path / "app.yaml"
    path.write_text(yaml.safe_dump({"applications": [{"name": "a", "import_path": "x:y", "args": BASE}]}))
    assert load_app_config(path).model.name == "m"
    bare = tmp_path / "args.yaml"
    bare.write_text(yaml.safe_dump(BASE))
    assert load_app_config(bare).kv_cache.block_size == 32
