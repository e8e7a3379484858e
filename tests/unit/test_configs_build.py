"""Every shipped config validates and builds its Serve application graph,
GPU configs included, without starting Ray or an engine."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.config import ServingMode, load_app_config, load_serve_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def test_there_are_cpu_gpu_disaggregated_and_aggregated_configs():
    names = {p.name for p in CONFIGS}
    assert {"disagg.yaml", "disagg-cpu.yaml", "agg.yaml", "agg-cpu.yaml", "disagg-sglang.yaml"} <= names


def test_the_sglang_config_is_disagg_yaml_with_sglang_engines():
    """Same model, pools and GPUs as configs/disagg.yaml; SGLang's decode
    engines cannot prefill locally, so every prompt goes to the prefill pool."""
    sglang = load_app_config(ROOT / "configs" / "disagg-sglang.yaml")
    vllm = load_app_config(ROOT / "configs" / "disagg.yaml")
    assert sglang.model == vllm.model and sglang.kv_cache == vllm.kv_cache
    for name in ("prefill_pool", "decode_pool"):
        ours, theirs = sglang.pools()[name], vllm.pools()[name]
        assert ours.engine.kind == "sglang" and ours.engine.transfer_backend.value == "nixl"
        assert (ours.replicas, ours.num_gpus) == (theirs.replicas, theirs.num_gpus)
    assert sglang.routing.local_prefill_max_tokens == 0


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_config_builds_the_application(path):
    from ray.serve.schema import ServeDeploySchema

    from deployments.app import build_app

    ServeDeploySchema.model_validate(load_serve_config(path))  # Serve's own schema for the file
    config = load_app_config(path)
    app = build_app(config)
    assert app is not None
    expected = ServingMode.AGGREGATED if path.name.startswith("agg") else ServingMode.DISAGGREGATED
    assert config.mode is expected


def test_an_unknown_engine_arg_fails_the_build(tmp_path):
    from deployments.app import build_app

    doc = load_serve_config(ROOT / "configs" / "disagg-cpu.yaml")
    doc["applications"][0]["args"]["decode_pool"]["engine"]["engine_args"] = {"max_num_seqz": 8}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match="max_num_seqz"):
        build_app(load_app_config(path))


def test_an_unknown_sglang_server_arg_fails_the_build(tmp_path):
    from deployments.app import build_app

    doc = load_serve_config(ROOT / "configs" / "disagg-sglang.yaml")
    doc["applications"][0]["args"]["decode_pool"]["engine"]["server_args"] = {"max_runing_requests": 8}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match="max_runing_requests"):
        build_app(load_app_config(path))
