"""A pool may use Ray Serve's own autoscaler instead of the SLA planner (the
baseline of the real-time autoscaling experiment)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.config import shipped_config

ROOT = Path(__file__).resolve().parents[2]
SIM = ROOT / "configs" / "disagg-sim.yaml"


def _decode_deployment(config):
    from deployments.app import build_app

    return build_app(config)._bound_deployment.init_args[1]._bound_deployment


def test_a_pool_can_use_serve_s_default_autoscaler():
    config = shipped_config(
        SIM,
        "/models/x",
        decode_pool__replicas=2,
        frontend__data_plane="serve",
        decode_pool__autoscaling={"max_replicas": 6},
    )
    autoscaling = _decode_deployment(config)._deployment_config.autoscaling_config
    assert autoscaling.target_ongoing_requests == 2
    assert (autoscaling.min_replicas, autoscaling.initial_replicas, autoscaling.max_replicas) == (1, 2, 6)
    assert (autoscaling.upscale_delay_s, autoscaling.downscale_delay_s) == (30.0, 600.0)


def test_serve_autoscaling_and_the_acting_planner_are_exclusive():
    with pytest.raises(ValidationError, match="choose one"):
        shipped_config(
            SIM, "/models/x", decode_pool__autoscaling={}, planner__mode="act", sla__ttft_p99_ms=500, sla__itl_p50_ms=30
        )


def test_serve_autoscaling_bounds_are_checked():
    with pytest.raises(ValidationError, match="min_replicas 3 > max_replicas 2"):
        shipped_config(SIM, "/models/x", decode_pool__autoscaling={"min_replicas": 3, "max_replicas": 2})


def test_serve_autoscaling_needs_the_serve_data_plane():
    """Serve's autoscaler counts only requests its handles carry: on the direct
    data plane it would see every pool idle."""
    with pytest.raises(ValidationError, match="frontend.data_plane: serve"):
        shipped_config(SIM, "/models/x", decode_pool__autoscaling={"max_replicas": 6})


def test_the_real_time_experiment_builds_each_policy_s_application():
    import argparse

    from benchmarks.autoscale_serve import add_arguments, app_config

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--out", "x.json", "--static", "3+1"])
    assert app_config("planner", args).planner.mode.value == "act"
    assert app_config("ray-default", args).decode_pool.autoscaling.target_ongoing_requests == 2
    static = app_config("static", args)
    assert (static.prefill_pool.replicas, static.decode_pool.replicas, static.decode_pool.autoscaling) == (3, 1, None)
