"""The planner an application's config asks for: the one factory the Serve
policy, the simulator's experiments and the tests use."""

from __future__ import annotations

from orchestrator.config import AppConfig, PlannerMode
from orchestrator.engines import engine_adapter
from orchestrator.planner.levels import priority_levels
from orchestrator.planner.planner import SlaPlanner


def make_planner(app: AppConfig) -> SlaPlanner:
    """The planner for an application: the profile it names, else the decode
    pool's engine's own performance model (the simulated engine's); with SLO
    classes, sized by their priority levels."""
    from orchestrator.sim.perf_model import ProfileModel

    engine = app.decode_pool.engine
    inputs = engine_adapter(engine.kind).planner_inputs(engine)
    if app.planner.profile is not None:
        perf = ProfileModel.load(app.planner.profile)
        kv_tokens = perf.meta.get("kv_capacity_tokens") or None
        if inputs.kv_cache_bytes is not None and perf.kv_bytes_per_token:
            # On CPU the pool's KV budget is a byte count of its own config, not
            # whatever the profiled engine had.
            kv_tokens = inputs.kv_cache_bytes // perf.kv_bytes_per_token
    elif inputs.own_performance is not None:
        perf, kv_tokens = inputs.own_performance(app.kv_cache.block_size)
    else:
        raise ValueError(f"planner.profile is required for {engine.kind} pools (make one with `orchestrator profile`)")
    prefill = app.prefill_pool.replicas if app.prefill_pool is not None else 0
    return SlaPlanner(
        app.planner,
        app.sla,
        perf,
        kv_tokens,
        max_num_seqs=inputs.max_num_seqs or 256,
        disaggregated=app.prefill_pool is not None,
        initial=(prefill, app.decode_pool.replicas),
        acting=app.planner.mode is PlannerMode.ACT,
        levels=priority_levels(app.traffic.classes),
    )
