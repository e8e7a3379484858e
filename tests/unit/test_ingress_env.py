"""Every way this project starts Ray gives HAProxy the same switches and our shim as its binary
(deployments/ingress.py): the cluster configs' `ray start` commands, the main job's script and the
launcher of tests and benchmarks."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from deployments.ingress import HAPROXY_ENV, SHIM_NAME, ingress_env

ROOT = Path(__file__).resolve().parents[2]


def _assignments(command: str) -> dict[str, str]:
    """The VAR=value words of a shell command line."""
    words = shlex.split(command.replace(";", " ; "))
    return dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w))


@pytest.mark.parametrize("name", ["cluster.yaml", "cluster-onprem.yaml"])
def test_every_ray_start_of_the_cluster_configs_sets_the_ingress_switches(name):
    doc = yaml.safe_load((ROOT / name).read_text())
    starts = [c for c in doc["head_start_ray_commands"] + doc["worker_start_ray_commands"] if "ray start" in c]
    assert len(starts) == 2
    for command in starts:
        assert _assignments(command).items() >= HAPROXY_ENV.items(), command
        assert _assignments(command)["RAY_SERVE_HAPROXY_BINARY_PATH"].endswith(f"/venv/bin/{SHIM_NAME}"), command


def test_the_main_job_exports_the_ingress_switches():
    script = (ROOT / "scripts" / "main.sh").read_text()
    exported = dict(re.findall(r'^export (\w+)=\$\{\1:-"?([^"}]*)"?\}$', script, re.M))
    assert exported.items() >= HAPROXY_ENV.items()
    assert exported["RAY_SERVE_HAPROXY_BINARY_PATH"] == f"$PWD/.venv/bin/{SHIM_NAME}"


def test_replays_cover_a_frontend_that_closed_before_answering():
    assert set(HAPROXY_ENV["RAY_SERVE_HAPROXY_RETRY_ON"].split()) == {"conn-failure", "empty-response"}
    assert ingress_env().items() >= HAPROXY_ENV.items()
