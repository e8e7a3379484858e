"""Secure by default: an application on a non-loopback address has keys or says it accepts the risk; the admin
surface needs its own key; the shipped configs start that way; Ray's dashboard stays on the head's loopback."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from orchestrator.api.exposure import exposure_problem, is_loopback
from orchestrator.config import AuthConfig, load_app_config, load_serve_config
from orchestrator.engines.base import EngineInfo, EngineRole, EngineStats
from orchestrator.metrics import FrontendMetrics
from orchestrator.pools import ReplicaView
from tests.factories import make_frontend, run

from .test_api_limits import _body
from .test_placement import ROOT

NO_KEYS = AuthConfig()


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_a_loopback_address_needs_no_key(host):
    assert is_loopback(host) and exposure_problem(host, NO_KEYS) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "head-node.internal"])
def test_any_other_address_without_a_key_is_refused_naming_what_to_set(host):
    problem = exposure_problem(host, NO_KEYS)
    assert problem is not None and host in problem
    for named in ("frontend.auth.api_key_env", "http_options.host", "frontend.auth.allow_unauthenticated"):
        assert named in problem
    assert exposure_problem(host, AuthConfig(api_key_env="KEY")) is None
    assert exposure_problem(host, AuthConfig(allow_unauthenticated=True)) is None


def _calls(fe, headers: dict[str, str]):
    async def go():
        async with fe.client() as c:
            return (
                (await c.post("/v1/completions", content=_body(), headers=headers)).status_code,
                (await c.get("/pools", headers=headers)).status_code,
                (await c.get("/health")).status_code,
                (await c.get("/metrics")).status_code,
            )

    return run(go())


def test_the_admin_surface_takes_the_admin_key_and_not_a_users():
    fe = make_frontend(api_key="user", admin_key="admin")
    assert _calls(fe, {"authorization": "Bearer user"}) == (200, 401, 200, 200)
    assert _calls(fe, {"authorization": "Bearer admin"}) == (401, 200, 200, 200)
    assert _calls(fe, {}) == (401, 401, 200, 200)


def test_keys_hold_for_an_app_served_under_a_route_prefix():
    """Serve runs an application at its route_prefix: the ASGI path then carries the prefix (and root_path
    names it). The keys guard the same surfaces there as at /."""
    import httpx

    fe = make_frontend(api_key="user", admin_key="admin")

    async def go(headers):
        transport = httpx.ASGITransport(app=fe.app, root_path="/orchestrator")
        async with httpx.AsyncClient(transport=transport, base_url="http://frontend") as c:
            return (
                (await c.post("/orchestrator/v1/completions", content=_body(), headers=headers)).status_code,
                (await c.get("/orchestrator/pools", headers=headers)).status_code,
                (await c.get("/orchestrator/health")).status_code,
            )

    assert run(go({})) == (401, 401, 200)
    assert run(go({"authorization": "Bearer user"})) == (200, 401, 200)
    assert run(go({"authorization": "Bearer admin"})) == (401, 200, 200)


def test_with_user_keys_and_no_admin_key_the_admin_surface_is_closed_to_everyone():
    fe = make_frontend(api_key="user")

    async def go():
        async with fe.client() as c:
            return await c.get("/pools", headers={"authorization": "Bearer user"})

    r = run(go())
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"
    assert "frontend.auth.admin_key_env" in r.json()["error"]["message"]


def test_without_any_key_a_loopback_app_is_open():
    assert _calls(make_frontend(), {}) == (200, 200, 200, 200)


def test_metrics_name_no_replica_address():
    """/metrics stays open (Prometheus scrapes it): it labels replicas by id, never by an address or port."""
    info = EngineInfo(
        role=EngineRole.DECODE,
        engine_kind="vllm",
        engine_version="0",
        engine_id="e",
        model="m",
        block_size=32,
        max_model_len=64,
        host="10.1.2.3",
        kv_events_endpoint="tcp://10.1.2.3:5557",
        kv_events_replay_endpoint="tcp://10.1.2.3:5558",
        nixl_side_channel_port=5600,
        stream_port=45999,
    )
    views = {"decode_pool": [ReplicaView("r0", info, EngineStats(num_running=1))]}
    text = FrontendMetrics(lambda: views).exposition().decode()
    assert 'replica="r0"' in text
    assert not any(secret in text for secret in ("10.1.2.3", "5557", "5558", "5600", "45999"))


SHIPPED = sorted((ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_starts_securely(path):
    doc = load_serve_config(path)
    host = (doc.get("http_options") or {}).get("host", "127.0.0.1")
    auth = load_app_config(path).frontend.auth
    assert exposure_problem(host, auth) is None
    assert not auth.allow_unauthenticated
    if not is_loopback(host):
        assert auth.api_key_env and auth.admin_key_env


def test_check_config_refuses_a_public_address_without_keys(tmp_path):
    doc = load_serve_config(ROOT / "configs" / "disagg-cpu.yaml")
    doc["http_options"]["host"] = "0.0.0.0"
    path = tmp_path / "public.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = subprocess.run(
        [sys.executable, "-m", "tools.cli", "check-config", str(path)], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 1 and "frontend.auth.api_key_env" in out.stderr


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster-onprem.yaml"])
def test_the_cluster_configs_keep_rays_dashboard_on_the_heads_loopback(name):
    commands = yaml.safe_load((ROOT / name).read_text())["head_start_ray_commands"]
    (start,) = [c for c in commands if "ray start --head" in c]
    assert "--dashboard-host=127.0.0.1" in start.split()
