"""Every shipped config validates and builds the Serve application it describes, GPU
configs included, without starting Ray or an engine: the deployments, their
replicas, resources and environment, and the arguments each engine would be
started with, all checked against the config file's own values."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from orchestrator.config import (
    CpuEngineSettings,
    FrontendConfig,
    KVCacheConfig,
    ModelConfig,
    NetworkConfig,
    PoolConfig,
    RoutingConfig,
    ServeAutoscaling,
    ServingMode,
    SglangEngineConfig,
    VllmEngineConfig,
    load_app_config,
    load_serve_config,
    resolve_source,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
# The node address a replica would advertise; any will do for its arguments.
HOST = "10.0.0.7"
ENGINE_SETTINGS = {"vllm": VllmEngineConfig, "sglang": SglangEngineConfig}


# -- the config file, as written ---------------------------------------------------------------


def _args(path: Path) -> dict[str, Any]:
    """The `args` Serve hands `build_app`, straight from the file."""
    return load_serve_config(path)["applications"][0]["args"]


def _setting(section: Mapping[str, Any], model: type[BaseModel], key: str) -> Any:
    """The file's value for `key`, or the config model's default where the file leaves it out."""
    if key in section:
        return section[key]
    return model.model_fields[key].get_default(call_default_factory=True)


def _pools_in_file(args: Mapping[str, Any]) -> dict[str, tuple[dict[str, Any], str]]:
    """Deployment name -> (the pool's section of the file, the role its replicas run in).
    The primary group's pools are `prefill_pool`/`decode_pool`, a further group's
    `<group>_prefill_pool`/`<group>_decode_pool`; a group with a prefill pool is
    disaggregated (its decode pool decodes), one without is aggregated."""
    groups = {"": args} | {f"{g['name']}_": g for g in args.get("pool_groups", [])}
    pools = {}
    for prefix, group in groups.items():
        disaggregated = "prefill_pool" in group
        pools[f"{prefix}decode_pool"] = (group["decode_pool"], "decode" if disaggregated else "aggregated")
        if disaggregated:
            pools[f"{prefix}prefill_pool"] = (group["prefill_pool"], "prefill")
    return pools


def _pools(kind: str | None = None) -> list[tuple[Path, str]]:
    """(config, deployment name) of every shipped pool, or of those whose engine is `kind`."""
    return [
        (path, name)
        for path in CONFIGS
        for name, (pool, _) in _pools_in_file(_args(path)).items()
        if kind is None or pool["engine"]["kind"] == kind
    ]


def _gpus_per_replica(engine: Mapping[str, Any]) -> int:
    """One GPU per tensor-parallel rank for an engine on CUDA (vLLM's default
    device; SGLang's only one); none for a simulated or CPU engine."""
    kind = engine["kind"]
    if kind == "sim" or (kind == "vllm" and _setting(engine, VllmEngineConfig, "device") != "cuda"):
        return 0
    return _setting(engine, ENGINE_SETTINGS[kind], "tensor_parallel_size")


def _publishes_kv_events(args: Mapping[str, Any]) -> bool:
    """Engines publish KV events when the frontend's KV-aware scheduler follows them."""
    routing = args.get("routing", {})
    return _setting(routing, RoutingConfig, "policy") == "kv_aware" and _setting(routing, RoutingConfig, "kv_events")


def _env_in_file(args: Mapping[str, Any], pool: Mapping[str, Any]) -> dict[str, str]:
    """What the file asks of a pool replica's process environment (a subset of what it gets)."""
    network, engine = args.get("network", {}), pool["engine"]
    env = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0", **network.get("transport_env", {})}
    timeout = network.get("kv_handshake_timeout_s")
    if engine["kind"] == "vllm":
        env["ORCHESTRATOR_EXIT_WITH_PARENT"] = "1"  # the engine's processes die with the replica
        if "nixl_progress_delay_us" in network:
            env["ORCHESTRATOR_NIXL_PROGRESS_DELAY_US"] = str(network["nixl_progress_delay_us"])
        if timeout is not None:
            env["VLLM_P2P_HANDSHAKE_TIMEOUT_S"] = str(timeout)
        if _setting(engine, VllmEngineConfig, "device") == "cpu":
            env["OMP_NUM_THREADS"] = str(_setting(engine.get("cpu", {}), CpuEngineSettings, "threads"))
    if engine["kind"] == "sglang" and timeout is not None:
        env["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"] = env["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"] = str(timeout)
    return env


# -- the built application ---------------------------------------------------------------------


def _deployments(app) -> dict:
    """Every deployment of a built application, by name: the ingress and, recursively, every
    application bound into its init args (Serve has no public accessor for an Application's
    deployment; `_bound_deployment` is what its own `build_app` reads)."""
    from ray.serve import Application

    found = {}

    def visit(value: Any) -> None:
        if isinstance(value, Application):
            deployment = value._bound_deployment
            found[deployment.name] = deployment
            visit(deployment.init_args)
            visit(list(deployment.init_kwargs.values()))
        elif isinstance(value, list | tuple):
            for item in value:
                visit(item)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)

    visit(app)
    return found


def _bound_names(value: Any) -> Any:
    """An init arg with each bound application replaced by its deployment's name."""
    from ray.serve import Application

    if isinstance(value, Application):
        return value._bound_deployment.name
    if isinstance(value, dict):
        return {k: _bound_names(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_bound_names(v) for v in value]
    return value


def _replica_engine(deployment):
    """(app config, pool, role) an EngineReplica builds its engine from, given the init args Serve
    passes it (deployments/engine_replica.py): the prefill pool for the prefill role, else the decode pool."""
    from orchestrator.config import AppConfig
    from orchestrator.engines.base import EngineRole

    config, role = deployment.init_args
    app = AppConfig.model_validate(config)
    role = EngineRole(role)
    return app, app.prefill_pool if role is EngineRole.PREFILL else app.decode_pool, role


@functools.cache
def _built(path: Path) -> dict:
    """The deployments `build_app` makes of the file (built once per file; nothing here changes them)."""
    from deployments.app import build_app

    return _deployments(build_app(load_app_config(path)))


# -- the tests ----------------------------------------------------------------------------------


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
def test_config_builds_a_frontend_bound_to_one_deployment_per_pool(path):
    """Serve's schema takes the file; build_app makes a frontend with the file's replicas and
    CPUs, bound to one deployment per pool of the file, each where Frontend takes that pool."""
    from ray.serve.schema import ServeDeploySchema

    doc = load_serve_config(path)
    ServeDeploySchema.model_validate(doc)  # Serve's own schema for the file
    assert doc["applications"][0]["import_path"] == "deployments.app:build_app"
    args = _args(path)
    expected_mode = ServingMode.DISAGGREGATED if "prefill_pool" in args else ServingMode.AGGREGATED
    assert load_app_config(path).mode is expected_mode

    deployments = _built(path)
    shared_store = load_app_config(path).frontend.replicas > 1
    assert set(deployments) == {"frontend", *_pools_in_file(args)} | ({"response_store"} if shared_store else set())
    frontend, settings = deployments["frontend"], args.get("frontend", {})
    assert frontend.num_replicas == _setting(settings, FrontendConfig, "replicas")
    assert frontend.ray_actor_options["num_cpus"] == _setting(settings, FrontendConfig, "num_cpus")
    assert frontend.ray_actor_options.get("num_gpus", 0) == 0
    # Frontend(config, decode_pool, prefill_pool[, pool_groups]): each handle reaches its own pool.
    groups = {
        g["name"]: [f"{g['name']}_decode_pool", f"{g['name']}_prefill_pool" if "prefill_pool" in g else None]
        for g in args.get("pool_groups", [])
    }
    primary = ["decode_pool", "prefill_pool" if "prefill_pool" in args else None]
    assert [_bound_names(a) for a in frontend.init_args[1:]] == primary + ([groups] if groups else [])
    # The Responses API's store: with one frontend, its own (nothing bound); with several, one replica they share,
    # no CPU reserved, bound where Frontend takes it, with its bounds.
    if not shared_store:
        assert frontend.init_kwargs["response_store"] is None
        return
    store = deployments["response_store"]
    assert _bound_names(frontend.init_kwargs["response_store"]) == "response_store"
    assert store.num_replicas == 1 and store.ray_actor_options["num_cpus"] == 0
    responses = load_app_config(path).frontend.responses
    assert store.init_args == (responses.max_stored, responses.max_stored_bytes)


def test_an_app_with_several_frontends_shares_one_response_store_replica():
    from deployments.app import build_app

    config = load_app_config(CONFIGS[0]).model_copy(deep=True)
    several = config.model_validate(config.model_dump() | {"frontend": config.frontend.model_dump() | {"replicas": 2}})
    deployments = _deployments(build_app(several))
    store, frontend = deployments["response_store"], deployments["frontend"]
    assert _bound_names(frontend.init_kwargs["response_store"]) == "response_store" and store.num_replicas == 1
    assert store.ray_actor_options["num_cpus"] == 0


@pytest.mark.parametrize("path, name", _pools(), ids=lambda v: getattr(v, "name", v))
def test_each_pool_deployment_gets_its_role_replicas_resources_and_environment(path, name):
    """The file's role, replica count (or Serve autoscaling bounds), CPUs, GPUs (a
    tensor-parallel replica's all reserved on one node), custom resources, and the
    process environment its engine needs."""
    from ray.serve.deployment import deployment_to_schema

    from orchestrator.engines import process_env

    args = _args(path)
    pool, role = _pools_in_file(args)[name]
    deployment = _built(path)[name]
    app, pool_config, bound_role = _replica_engine(deployment)
    assert bound_role.value == role

    # No shipped config runs the SLA planner, whose autoscaling policy test_serve_autoscaling checks.
    assert args.get("planner", {}).get("mode", "off") == "off"
    # What `serve build` writes for the deployment: the options build_app set, not Serve's defaults.
    configured = deployment_to_schema(deployment).model_dump(exclude_unset=True)
    if "autoscaling" in pool:
        bounds = configured["autoscaling_config"]
        assert configured.get("num_replicas") is None
        assert (bounds["min_replicas"], bounds["max_replicas"]) == (
            _setting(pool["autoscaling"], ServeAutoscaling, "min_replicas"),
            _setting(pool["autoscaling"], ServeAutoscaling, "max_replicas"),
        )
    else:
        assert configured["num_replicas"] == _setting(pool, PoolConfig, "replicas")
        assert "autoscaling_config" not in configured

    actor = deployment.ray_actor_options
    resources = _setting(pool, PoolConfig, "resources")
    assert actor["num_cpus"] == _setting(pool, PoolConfig, "num_cpus")
    assert actor["resources"] == resources
    gpus = _gpus_per_replica(pool["engine"])
    if gpus <= 1:
        assert actor["num_gpus"] == gpus
        assert "placement_group_bundles" not in configured
    else:
        # Every rank's GPU is reserved in the replica's placement group, all on one node; the
        # replica actor sits in the first bundle, which holds its CPUs and custom resources.
        bundles = configured["placement_group_bundles"]
        assert configured["placement_group_strategy"] == "STRICT_PACK"
        assert sum(b.get("GPU", 0) for b in bundles) == gpus
        assert bundles[0]["CPU"] == actor["num_cpus"] and actor["num_gpus"] <= bundles[0]["GPU"]
        assert {k: bundles[0][k] for k in resources} == resources

    env = actor["runtime_env"]["env_vars"]
    assert env.items() >= _env_in_file(args, pool).items()
    assert env.items() >= process_env(app, pool_config).items()  # and whatever else the engine adapter asks for


@pytest.mark.parametrize("path, name", _pools("vllm"), ids=lambda v: getattr(v, "name", v))
def test_each_vllm_pool_gets_the_engine_args_its_config_names(path, name):
    """What the replica's vLLM engine would be built with (`AsyncEngineArgs`, from the init args
    Serve passes the replica), field by field from the file: model, context, tensor parallelism,
    KV cache, batch limits, the NIXL transfer role of a prefill or decode pool, KV events."""
    from orchestrator.engines import EngineSpec, engine_adapter
    from orchestrator.engines.vllm_kv_events import events_config

    args = _args(path)
    pool, role = _pools_in_file(args)[name]
    app, pool_config, bound_role = _replica_engine(_built(path)[name])
    spec = EngineSpec.for_pool(app, pool_config, bound_role, HOST)  # as create_engine builds it
    publishes = _publishes_kv_events(args)
    assert spec.publish_kv_events is publishes
    # As VllmEngine.start builds them, without loading a model.
    unstarted = engine_adapter(pool_config.engine.kind).create(spec)
    engine_args = unstarted._engine_args(events_config(topic="kv") if spec.publish_kv_events else None)

    model, kv_cache, engine = args["model"], args.get("kv_cache", {}), pool["engine"]
    assert engine_args.model == resolve_source(model["source"])
    assert engine_args.tokenizer == resolve_source(model.get("tokenizer") or model["source"])
    assert engine_args.served_model_name == [model["name"]]
    assert engine_args.max_model_len == model["max_model_len"]
    assert engine_args.dtype == _setting(model, ModelConfig, "dtype")
    assert engine_args.block_size == _setting(kv_cache, KVCacheConfig, "block_size")
    assert engine_args.enable_prefix_caching == _setting(kv_cache, KVCacheConfig, "enable_prefix_caching")

    tp = _setting(engine, VllmEngineConfig, "tensor_parallel_size")
    assert engine_args.tensor_parallel_size == tp
    # Ranks beyond the first run as Ray workers in the replica's placement group.
    assert engine_args.distributed_executor_backend == ("ray" if tp > 1 else None)
    assert engine_args.gpu_memory_utilization == _setting(engine, VllmEngineConfig, "gpu_memory_utilization")
    assert engine_args.enforce_eager == _setting(engine, VllmEngineConfig, "enforce_eager")
    device = _setting(engine, VllmEngineConfig, "device")
    cpu = engine.get("cpu", {})
    cpu_kv_bytes = int(_setting(cpu, CpuEngineSettings, "kv_cache_gib") * 2**30) if device == "cpu" else None
    assert engine_args.kv_cache_memory_bytes == cpu_kv_bytes
    for key, value in {k: engine[k] for k in ("max_num_seqs", "max_num_batched_tokens") if k in engine}.items():
        assert getattr(engine_args, key) == value, key
    for key, value in engine.get("engine_args", {}).items():
        assert getattr(engine_args, key) == value, key

    transfer = engine_args.kv_transfer_config
    if role == "aggregated":
        assert transfer is None
    else:
        assert transfer.kv_connector == "NixlConnector"
        assert transfer.kv_role == {"prefill": "kv_producer", "decode": "kv_consumer"}[role]
        assert transfer.kv_buffer_device == device
        backends = _setting(args.get("network", {}), NetworkConfig, "nixl_backends")
        assert transfer.get_from_extra_config("backends", None) == backends
    events = engine_args.kv_events_config
    assert (events is not None and events.enable_kv_cache_events) is publishes


@pytest.mark.parametrize("path, name", _pools("sglang"), ids=lambda v: getattr(v, "name", v))
def test_each_sglang_pool_gets_the_server_args_its_config_names(path, name):
    """What the replica's SGLang engine would be built with (`sglang.Engine` keyword arguments)."""
    from orchestrator.engines import EngineSpec
    from orchestrator.engines.sglang_server_args import EnginePorts, server_args_kwargs

    args = _args(path)
    pool, role = _pools_in_file(args)[name]
    app, pool_config, bound_role = _replica_engine(_built(path)[name])
    spec = EngineSpec.for_pool(app, pool_config, bound_role, HOST)  # as create_engine builds it
    assert spec.publish_kv_events is _publishes_kv_events(args)
    kwargs = server_args_kwargs(
        spec, EnginePorts(server=30000, bootstrap=30001, kv_events=30002, kv_events_replay=30003)
    )

    model, kv_cache, engine = args["model"], args.get("kv_cache", {}), pool["engine"]
    assert kwargs["model_path"] == resolve_source(model["source"])
    assert kwargs["served_model_name"] == model["name"]
    assert kwargs["context_length"] == model["max_model_len"]
    assert kwargs["page_size"] == _setting(kv_cache, KVCacheConfig, "block_size")
    assert kwargs["disable_radix_cache"] is not _setting(kv_cache, KVCacheConfig, "enable_prefix_caching")
    assert kwargs["tp_size"] == _setting(engine, SglangEngineConfig, "tensor_parallel_size")
    assert kwargs["disaggregation_mode"] == {"prefill": "prefill", "decode": "decode", "aggregated": "null"}[role]
    if role != "aggregated":
        assert kwargs["disaggregation_transfer_backend"] == _setting(engine, SglangEngineConfig, "transfer_backend")
    for key in ("mem_fraction_static", "max_running_requests", "chunked_prefill_size"):
        assert kwargs.get(key) == engine.get(key), key


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
