"""Multi-node layouts: tensor-parallel replicas as STRICT_PACK placement
groups, and the build-time check that the pools fit the cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from orchestrator.config import AppConfig, load_app_config, load_serve_config
from orchestrator.placement import check_layout, replica_bundles

ROOT = Path(__file__).resolve().parents[2]


def gpu_app(
    prefill_tp: int = 4,
    prefill_replicas: int = 2,
    decode_tp: int = 8,
    decode_replicas: int = 1,
    nodes: int | None = 2,
    engine: str = "vllm",
    **extra,
) -> AppConfig:
    def pool(tp: int, replicas: int) -> dict:
        eng = {"kind": engine, "tensor_parallel_size": tp}
        if engine == "vllm":
            eng["device"] = "cuda"
        return {"replicas": replicas, "num_cpus": 4, "engine": eng}

    return AppConfig.model_validate(
        {
            "model": {"name": "m", "source": "org/m", "max_model_len": 4096},
            "prefill_pool": pool(prefill_tp, prefill_replicas),
            "decode_pool": pool(decode_tp, decode_replicas),
            "cluster": {"gpus_per_node": 8, "nodes": nodes},
            **extra,
        }
    )


def test_a_replica_gets_one_bundle_per_rank_with_the_actor_in_the_first():
    assert replica_bundles(4, 4, {"h100_node": 1}) == [
        {"CPU": 4, "GPU": 1.0, "h100_node": 1},
        {"GPU": 1.0},
        {"GPU": 1.0},
        {"GPU": 1.0},
    ]
    assert replica_bundles(1, 0, {}) == [{"CPU": 1, "GPU": 0.0}]


def test_layouts_that_fit_pass():
    check_layout({"prefill_pool": (4, 2), "decode_pool": (8, 1)}, gpus_per_node=8, nodes=2)
    check_layout({"prefill_pool": (2, 3), "decode_pool": (1, 10)}, gpus_per_node=8, nodes=2)
    check_layout({"decode_pool": (8, 100)}, gpus_per_node=8, nodes=None)  # no total given: per-node check only


def test_a_replica_larger_than_a_node_is_refused_naming_the_pool():
    with pytest.raises(ValueError, match=r"prefill_pool: a replica needs 16 GPUs .* a node has 8"):
        check_layout({"prefill_pool": (16, 1)}, gpus_per_node=8, nodes=4)


def test_more_gpus_than_the_cluster_has_is_refused():
    with pytest.raises(ValueError, match=r"need 24 GPUs .* 2 node\(s\) x 8 GPUs"):
        check_layout({"prefill_pool": (4, 4), "decode_pool": (8, 1)}, gpus_per_node=8, nodes=2)


def test_fragmentation_counts_whole_replicas_per_node():
    # 3 x TP3 = 9 GPUs on 2 nodes of 8 (16 GPUs): only two replicas fit a node each... 3+3 on one, 3 on the other.
    check_layout({"decode_pool": (3, 3)}, gpus_per_node=8, nodes=2)
    # 3 x TP6: 18 GPUs > 16 anyway; 2 x TP6 + 1 x TP4 = 16 GPUs but 6+4 > 8: no node takes the TP4 replica.
    with pytest.raises(ValueError, match="whole replicas"):
        check_layout({"prefill_pool": (6, 2), "decode_pool": (4, 1)}, gpus_per_node=8, nodes=2)


def test_the_app_config_checks_its_layout_with_a_clear_message():
    gpu_app()  # 2 x TP4 + 1 x TP8 on 2 nodes
    with pytest.raises(ValidationError, match="decode_pool: a replica needs 16 GPUs"):
        gpu_app(decode_tp=16)
    with pytest.raises(ValidationError, match="need 24 GPUs"):
        gpu_app(prefill_replicas=4)


def test_the_planner_s_max_replicas_count_against_the_cluster():
    planner = {"mode": "act", "prefill": {"max_replicas": 4}, "decode": {"max_replicas": 1}}
    sla = {"ttft_p99_ms": 500, "itl_p50_ms": 30}
    with pytest.raises(ValidationError, match="need 24 GPUs"):
        gpu_app(planner={**planner, "profile": "p.json"}, sla=sla)


def test_tensor_parallel_needs_cuda():
    with pytest.raises(ValidationError, match="tensor_parallel_size > 1 needs device cuda"):
        AppConfig.model_validate(
            {
                "model": {"name": "m", "source": "org/m", "max_model_len": 4096},
                "decode_pool": {"engine": {"kind": "vllm", "device": "cpu", "tensor_parallel_size": 2}},
            }
        )


def _pool_deployments(config: AppConfig) -> dict:
    from deployments.app import build_app

    frontend = build_app(config)._bound_deployment
    pools = [a._bound_deployment for a in frontend.init_args[1:] if a is not None]
    return {d.name: d for d in pools}


def test_tensor_parallel_replicas_get_strict_pack_placement_groups():
    pools = _pool_deployments(load_app_config(ROOT / "configs" / "disagg-70b.yaml"))
    for name, tp in (("prefill_pool", 4), ("decode_pool", 8)):
        replica = pools[name]._replica_config
        assert replica.placement_group_strategy == "STRICT_PACK"
        assert len(replica.placement_group_bundles) == tp
        assert replica.placement_group_bundles[0]["h100_node"] == 1
        # vLLM's Ray executor places the ranks; the replica actor holds no GPU itself.
        assert pools[name].ray_actor_options["num_gpus"] == 0


def test_an_sglang_replica_holds_all_its_gpus_in_one_bundle():
    pools = _pool_deployments(gpu_app(engine="sglang"))
    replica = pools["decode_pool"]._replica_config
    assert replica.placement_group_bundles == [{"CPU": 4.0, "GPU": 8.0}]
    assert pools["decode_pool"].ray_actor_options["num_gpus"] == 8


def test_single_gpu_replicas_need_no_placement_group():
    pools = _pool_deployments(load_app_config(ROOT / "configs" / "disagg.yaml"))
    assert pools["decode_pool"]._replica_config.placement_group_bundles is None
    assert pools["decode_pool"].ray_actor_options["num_gpus"] == 1


def test_transport_environment_reaches_the_engine_processes():
    doc = load_serve_config(ROOT / "configs" / "disagg-70b.yaml")["applications"][0]["args"]
    pools = _pool_deployments(AppConfig.model_validate(doc))
    env = pools["prefill_pool"].ray_actor_options["runtime_env"]["env_vars"]
    assert env["FI_PROVIDER"] == "efa"


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster-onprem.yaml"])
def test_cluster_launcher_configs_are_valid_ray_cluster_configs(name):
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(yaml.safe_load((ROOT / name).read_text())))
