"""Configuration: one pydantic tree, explicit errors naming the field."""

from __future__ import annotations

import copy
import re

import pytest
import yaml
from pydantic import ValidationError

from orchestrator.config import AppConfig, ServingMode, load_app_config
from orchestrator.engines import check_app

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
        ("decode_pool.engine.tensor_parallel_size", 2, "tensor_parallel_size"),
        ("routing.policy", "random", "routing.policy"),
        ("decode_pool.engine.cpu.shm_poll_max_us", 10, "cpu.shm_poll_max_us (10) is below cpu.shm_poll_us (50)"),
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


# -- pool groups and shape routing (issue 9) -------------------------------------

SIM_GROUP = {"name": "sim", "prefill_pool": {"engine": {"kind": "sim"}}, "decode_pool": {"engine": {"kind": "sim"}}}
SHAPE = {"prefix_group": "sim", "unique_group": "primary"}


def _mixed(**routing):
    cfg = copy.deepcopy(BASE)
    cfg["pool_groups"] = [copy.deepcopy(SIM_GROUP)]
    cfg["routing"] = {"shape": dict(SHAPE), **routing}
    return cfg


def test_existing_configs_have_one_group_and_no_shape_routing():
    cfg = AppConfig.model_validate(BASE)
    assert cfg.pool_groups == [] and cfg.routing.shape is None
    assert cfg.group_names() == ["primary"] and cfg.all_pools() == cfg.pools()


def test_pool_groups_add_uniquely_named_deployments():
    cfg = AppConfig.model_validate(_mixed())
    assert cfg.group_names() == ["primary", "sim"]
    assert set(cfg.all_pools()) == {"prefill_pool", "decode_pool", "sim_prefill_pool", "sim_decode_pool"}
    assert set(cfg.pools()) == {"prefill_pool", "decode_pool"}  # the primary group, as before
    assert cfg.routing.shape.min_prefix_reuse == 0.5 and cfg.routing.shape.policy.value == "shape"


def test_a_group_config_is_the_app_with_the_groups_pools_on_top():
    cfg = AppConfig.model_validate(_mixed())
    sim = cfg.for_group("sim")
    assert sim.decode_pool.engine.kind == "sim" and sim.prefill_pool.engine.kind == "sim"
    assert sim.pool_groups == [] and sim.routing.shape is None
    assert (sim.model, sim.kv_cache, sim.network) == (cfg.model, cfg.kv_cache, cfg.network)
    assert cfg.for_group("primary").decode_pool == cfg.decode_pool
    with pytest.raises(KeyError, match="nope"):
        cfg.for_group("nope")


def test_an_aggregated_group_has_no_prefill_pool():
    cfg = _mixed()
    del cfg["pool_groups"][0]["prefill_pool"]
    parsed = AppConfig.model_validate(cfg)
    assert parsed.pool_groups[0].mode is ServingMode.AGGREGATED
    assert set(parsed.all_pools()) == {"prefill_pool", "decode_pool", "sim_decode_pool"}


def test_group_names_must_be_unique_and_not_primary():
    cfg = _mixed()
    cfg["pool_groups"].append(copy.deepcopy(SIM_GROUP))
    assert "'sim' is used twice" in _error(cfg)
    cfg = _mixed()
    cfg["pool_groups"][0]["name"] = "primary"
    cfg["routing"]["shape"]["prefix_group"] = "primary"
    assert "'primary' is reserved" in _error(cfg)
    cfg = _mixed()
    cfg["pool_groups"][0]["name"] = "Bad-Name"
    assert "pool_groups.0.name" in _error(cfg)


def test_shape_routing_must_name_existing_groups():
    cfg = _mixed()
    cfg["routing"]["shape"]["prefix_group"] = "sglang"
    assert "routing.shape.prefix_group: no pool group 'sglang'" in _error(cfg)
    cfg = _mixed()
    cfg["routing"]["shape"]["unique_group"] = "vllm"
    assert "routing.shape.unique_group: no pool group 'vllm'" in _error(cfg)


def test_shape_routing_needs_the_kv_index():
    assert "needs routing.policy kv_aware" in _error(_mixed(policy="round_robin"))
    # Shape-blind round robin over the groups needs no index.
    cfg = _mixed(policy="round_robin")
    cfg["routing"]["shape"]["policy"] = "round_robin"
    AppConfig.model_validate(cfg)


def test_shape_thresholds_are_checked():
    cfg = _mixed()
    cfg["routing"]["shape"]["min_prefix_reuse"] = 1.5
    assert "min_prefix_reuse" in _error(cfg)
    cfg = _mixed()
    cfg["routing"]["shape"]["max_output_tokens"] = 0
    assert "max_output_tokens" in _error(cfg)
    cfg = _mixed()
    cfg["routing"]["shape"]["prefix_heavy_group"] = "sim"
    assert "prefix_heavy_group" in _error(cfg)


def test_groups_share_the_block_size_check():
    cfg = _mixed()
    cfg["kv_cache"]["block_size"] = 16
    cfg["prefill_pool"] = cfg["decode_pool"] = {"engine": {"kind": "sim"}}
    cfg["pool_groups"][0]["decode_pool"] = {"engine": {"kind": "vllm", "device": "cpu"}}
    assert "sim_decode_pool runs on CPU" in _error(cfg)


def test_the_planner_is_refused_with_pool_groups():
    cfg = _mixed()
    cfg["sla"] = {"ttft_p99_ms": 500, "itl_p50_ms": 30}
    cfg["planner"] = {"mode": "act", "profile": "/p.json"}
    assert "planner.mode must be off when pool_groups are configured" in _error(cfg)


def test_an_sglang_group_must_be_sglang_on_both_sides():
    cfg = _mixed()
    cfg["pool_groups"][0]["prefill_pool"] = {"engine": {"kind": "sglang"}}
    with pytest.raises(ValueError, match=re.escape("pool_groups[sim]")):
        check_app(AppConfig.model_validate(cfg))


def test_the_layout_check_counts_every_group():
    cfg = copy.deepcopy(BASE)
    cfg["prefill_pool"] = {"replicas": 4, "engine": {"kind": "vllm"}}
    cfg["decode_pool"] = {"replicas": 4, "engine": {"kind": "vllm"}}
    cfg["cluster"] = {"gpus_per_node": 8, "nodes": 1}
    AppConfig.model_validate(cfg)
    cfg["pool_groups"] = [{"name": "sg", "decode_pool": {"engine": {"kind": "sglang"}}}]
    assert "need 9 GPUs" in _error(cfg) and "sg_decode_pool 1x1" in _error(cfg)


@pytest.mark.parametrize("in_group", [False, True], ids=["primary", "group"])
def test_an_sglang_pool_pairs_only_with_an_sglang_pool(in_group):
    from orchestrator.config import AppConfig

    mixed = {"prefill_pool": {"engine": {"kind": "sglang"}}, "decode_pool": {"engine": {"kind": "vllm"}}}
    gpu = {"engine": {"kind": "vllm"}}
    args = {"model": {"name": "m", "source": "org/m", "max_model_len": 4096}}
    args |= {"decode_pool": gpu, "pool_groups": [{"name": "sg", **mixed}]} if in_group else mixed
    with pytest.raises(ValueError, match="hand KV over differently") as e:
        check_app(AppConfig.model_validate(args))
    assert ("pool_groups[sg]" in str(e.value)) is in_group


@pytest.mark.parametrize(
    "path, value, fragment",
    [
        # what the adapters set themselves, named again in the pass-through settings
        ("decode_pool.engine.engine_args", {"block_size": 64}, "engine_args may not set ['block_size']"),
        ("decode_pool.engine.engine_args", {"enforce_eager": True}, "engine_args may not set ['enforce_eager']"),
        ("decode_pool.engine.engine_args", {"max_num_seqs": 8}, "engine_args may not set ['max_num_seqs']"),
        ("decode_pool.engine.engine_args", {"max_num_sequences": 8}, "has no field(s) ['max_num_sequences']"),
        ("planner", {"mode": "act"}, "planner.profile is required for vllm pools"),
    ],
)
def test_what_needs_the_engine_adapters_fails_when_the_app_is_built(path, value, fragment):
    """config.py validates without the adapters (test_layering); these fail in `check_app`, which
    `build_app` and `orchestrator check-config` run."""
    args = _with(path, value)
    if path == "planner":
        args["sla"] = {"ttft_p99_ms": 500, "itl_p50_ms": 30}
    config = AppConfig.model_validate(args)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        check_app(config)
