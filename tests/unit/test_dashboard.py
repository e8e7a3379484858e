"""The Grafana dashboard (dashboards/orchestrator.json) queries only metrics
the app exports: the frontend's registry (as /metrics serves it) and the
planner's gauges (as Ray's metrics agent exports them, prefixed `ray_`)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from deployments.planner_policy import PLANNER_GAUGE_PREFIX, PLANNER_GAUGES
from orchestrator.config import PRIMARY_GROUP, AppConfig
from orchestrator.frontend import PoolGroup, build_frontend
from tests.factories import FakePool, WordTokenizer

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "orchestrator.json"
# What Prometheus calls the series of each metric type.
SERIES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
PROMQL_WORDS = {"sum", "rate", "max", "avg", "histogram_quantile"}


def _exported() -> set[str]:
    app = AppConfig.model_validate(
        {
            "model": {"name": "m", "source": "org/m", "max_model_len": 64},
            "prefill_pool": {"engine": {"kind": "sim"}},
            "decode_pool": {"engine": {"kind": "sim"}},
        }
    )
    parts = build_frontend(
        app, {PRIMARY_GROUP: PoolGroup(FakePool("decode_pool"), FakePool("prefill_pool"))}, WordTokenizer()
    )
    names = {
        family.name + suffix for family in parts.metrics.registry.collect() for suffix in SERIES.get(family.type, ("",))
    }
    return names | {f"ray_{PLANNER_GAUGE_PREFIX}{name}" for name in PLANNER_GAUGES}


def _panels() -> list[dict]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def _metric_names(expr: str) -> set[str]:
    without_labels = re.sub(r"\{[^}]*\}", "", expr)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_labels)
    without_ranges = re.sub(r"\bby\s*\([^)]*\)", "", without_ranges)
    words = set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", without_ranges))
    return {w for w in words if w not in PROMQL_WORDS and not w.startswith("__")}


def test_every_query_names_a_metric_the_app_exports():
    exported = _exported()
    unknown = {
        f"{panel['title']}: {name}"
        for panel in _panels()
        for target in panel["targets"]
        for name in _metric_names(target["expr"])
        if name not in exported
    }
    assert unknown == set()


def test_the_dashboard_covers_latency_hops_routing_kv_fallbacks_admission_and_the_planner():
    queried = {name for panel in _panels() for target in panel["targets"] for name in _metric_names(target["expr"])}
    for wanted in (
        "orchestrator_time_to_first_token_seconds_bucket",
        "orchestrator_inter_token_latency_seconds_bucket",
        "orchestrator_request_hop_seconds_bucket",
        "orchestrator_route_decisions_total",
        "orchestrator_engine_cached_prompt_tokens_total",
        "orchestrator_kv_transfers_total",
        "orchestrator_prefill_fallbacks_total",
        "orchestrator_decode_migrations_total",
        "orchestrator_requests_total",
        "ray_orchestrator_planner_desired_replicas",
        "ray_orchestrator_planner_observed_rate",
        "ray_orchestrator_planner_predicted_rate",
    ):
        assert wanted in queried, wanted


def test_the_name_scan_sees_through_labels_ranges_and_functions():
    expr = 'histogram_quantile(0.99, sum(rate(a_bucket{outcome="x"}[$__rate_interval])) by (le, hop))'
    assert _metric_names(expr) == {"a_bucket"}
    assert _metric_names("sum(b_total) by (pool)") == {"b_total"}


def test_panels_are_laid_out_two_to_a_row_without_overlap():
    cells = set()
    for panel in _panels():
        g = panel["gridPos"]
        assert g["w"] == 12 and g["x"] in (0, 12)
        cell = (g["x"], g["y"])
        assert cell not in cells
        cells.add(cell)
