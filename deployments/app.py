"""The application builder: `serve run configs/<name>.yaml` calls `build_app`
with the YAML's `args`, validated as an `AppConfig` by Serve."""

# No `from __future__ import annotations` here: Serve reads build_app's
# parameter annotation as a class to validate `args` with.

import secrets

from ray.serve import Application
from ray.serve.config import AutoscalingConfig, AutoscalingPolicy, RequestRouterConfig

from deployments.engine_replica import DRAIN_TIMEOUT_S, EngineReplica
from deployments.frontend import Frontend
from deployments.response_store import ResponseStoreReplica
from orchestrator.config import AppConfig, PlannerMode, PoolConfig, ServingMode
from orchestrator.engines import check_app, engine_adapter, process_env
from orchestrator.engines.base import EngineRole
from orchestrator.placement import STRICT_PACK

# Imported by path in each caller's process, where the frontend finds it in
# the router registry.
ROUTER_CLASS = "deployments.pool_router.PinnedRequestRouter"
# Our replicas never block their event loop, so Serve may run them on its own
# loop: one thread hop less per streamed chunk, which on a small machine is a
# large part of the inter-token latency Serve adds.
REPLICA_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0"}
# How often each replica's load report reaches the routers.
ROUTING_STATS_PERIOD_S = 1.0
PLANNER_POLICY = "deployments.planner_policy:SlaPlannerPolicy"


def _replicas(name: str, pool: PoolConfig, config: AppConfig) -> dict:
    """A fixed replica count; Ray Serve's default autoscaler where the pool
    asks for it; or, with the SLA planner on, an autoscaling config whose
    policy is the planner (bounds from `planner.prefill/decode`)."""
    if config.planner.mode is not PlannerMode.ACT and pool.autoscaling is not None:
        a = pool.autoscaling
        return {
            "autoscaling_config": AutoscalingConfig(
                min_replicas=a.min_replicas,
                max_replicas=a.max_replicas,
                initial_replicas=min(max(pool.replicas, a.min_replicas), a.max_replicas),
                target_ongoing_requests=a.target_ongoing_requests,
                upscale_delay_s=a.upscale_delay_s,
                downscale_delay_s=a.downscale_delay_s,
            )
        }
    if config.planner.mode is PlannerMode.OFF:
        return {"num_replicas": pool.replicas}
    bounds = config.planner.prefill if name == "prefill_pool" else config.planner.decode
    policy = AutoscalingPolicy(
        policy_function=PLANNER_POLICY, policy_kwargs={"app": config.model_dump(mode="json"), "pool": name}
    )
    return {
        "autoscaling_config": AutoscalingConfig(
            min_replicas=bounds.min_replicas,
            max_replicas=bounds.max_replicas,
            initial_replicas=min(max(pool.replicas, bounds.min_replicas), bounds.max_replicas),
            # The planner keeps its own hysteresis: none of Serve's delays on top.
            upscale_delay_s=0.0,
            downscale_delay_s=0.0,
            # Each report is already a window of `planner.interval_s`: take the
            # latest ones as they are (max also keeps a -1 "no sample" from
            # averaging into a real latency).
            metrics_interval_s=1.0,
            look_back_period_s=2.0,
            aggregation_function="max",
            policy=policy,
        )
    }


def _placement(pool: PoolConfig) -> dict:
    """Resources of one replica. A tensor-parallel replica gets a STRICT_PACK
    placement group (all ranks on one node), laid out as its engine's adapter
    says (`EngineAdapter.placement`)."""
    actor = {"num_cpus": pool.num_cpus, "num_gpus": pool.num_gpus, "resources": dict(pool.resources)}
    if pool.num_gpus <= 1:
        return {"ray_actor_options": actor}
    placement = engine_adapter(pool.engine.kind).placement(pool.num_cpus, pool.num_gpus, pool.resources)
    actor["num_gpus"] = placement.actor_gpus
    return {
        "ray_actor_options": actor,
        "placement_group_bundles": placement.bundles,
        "placement_group_strategy": STRICT_PACK,
    }


def _pool(name: str, pool: PoolConfig, config: AppConfig):
    placement = _placement(pool)
    placement["ray_actor_options"]["runtime_env"] = {
        "env_vars": {**REPLICA_ENV, **process_env(config, pool), **config.network.transport_env}
    }
    return EngineReplica.options(
        name=name,
        **_replicas(name, pool, config),
        max_ongoing_requests=pool.max_ongoing_requests,
        graceful_shutdown_timeout_s=DRAIN_TIMEOUT_S,
        **placement,
        request_router_config=RequestRouterConfig(
            request_router_class=ROUTER_CLASS,
            request_routing_stats_period_s=ROUTING_STATS_PERIOD_S,
            request_routing_stats_timeout_s=5.0,
        ),
        health_check_period_s=5.0,
        health_check_timeout_s=30.0,
    )


def _group_pools(config: AppConfig, wire_secret: str) -> dict:
    """Each further pool group's deployments, bound: group name -> [decode, prefill or None].
    A group's replicas get the application's config with the group's pools as
    the top-level ones (`AppConfig.for_group`), so EngineReplica reads them as usual."""
    groups = {}
    for group in config.pool_groups:
        args = config.for_group(group.name).model_dump(mode="json")
        decode_role = EngineRole.DECODE if group.prefill_pool is not None else EngineRole.AGGREGATED
        decode = _pool(f"{group.name}_decode_pool", group.decode_pool, config).bind(
            args, decode_role.value, wire_secret=wire_secret
        )
        prefill = None
        if group.prefill_pool is not None:
            prefill = _pool(f"{group.name}_prefill_pool", group.prefill_pool, config).bind(
                args, EngineRole.PREFILL.value, wire_secret=wire_secret
            )
        groups[group.name] = [decode, prefill]
    return groups


def build_app(config: AppConfig) -> Application:
    """The whole graph: frontend -> decode pool (+ prefill pool when disaggregated),
    and the same for every further pool group; the Responses API's store beside them where the frontends are
    several. Builds without starting
    anything, so a config can be checked offline."""
    check_app(config)
    args = config.model_dump(mode="json")
    # The data plane's secret: made here, at each deploy, and handed to every replica and frontend of this
    # application alone (their init arguments), never logged; replicas serve only peers that prove it.
    wire_secret = secrets.token_hex(32)
    disaggregated = config.mode is ServingMode.DISAGGREGATED
    decode_role = EngineRole.DECODE if disaggregated else EngineRole.AGGREGATED
    decode = _pool("decode_pool", config.decode_pool, config).bind(args, decode_role.value, wire_secret=wire_secret)
    prefill = (
        _pool("prefill_pool", config.prefill_pool, config).bind(args, EngineRole.PREFILL.value, wire_secret=wire_secret)
        if disaggregated
        else None
    )
    frontend = Frontend.options(
        name="frontend",
        num_replicas=config.frontend.replicas,
        max_ongoing_requests=config.frontend.max_ongoing_requests,
        ray_actor_options={"num_cpus": config.frontend.num_cpus, "runtime_env": {"env_vars": REPLICA_ENV}},
    )
    # The Responses API's store: shared by the frontends in a replica of its own where there are several; with one
    # frontend, that frontend's own (no process more).
    responses = config.frontend.responses
    store = (
        ResponseStoreReplica.options(name="response_store").bind(responses.max_stored, responses.max_stored_bytes)
        if responses.store and config.frontend.replicas > 1
        else None
    )
    groups = (_group_pools(config, wire_secret),) if config.pool_groups else ()
    return frontend.bind(args, decode, prefill, *groups, wire_secret=wire_secret, response_store=store)
