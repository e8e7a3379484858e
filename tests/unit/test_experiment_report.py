"""The experiments' shared launch and report helpers (benchmarks/launch.py, benchmarks/report.py, the table
writer in tools/report.py): pure functions, and our app's launcher up to the process boundary (what it would run,
and a stand-in for `serve run`); no Ray."""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import pkgutil
import signal
import socket
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from benchmarks import launch, report
from orchestrator.config import AppConfig

RESULTS = launch.RESULTS


def test_a_table_is_its_header_a_rule_and_a_line_a_row():
    assert report.table(["a", "b"], [[1, "x"], [2.5, None]]) == "| a | b |\n|---|---|\n| 1 | x |\n| 2.5 | None |\n"


def test_an_empty_cell_is_written_as_a_single_space():
    assert report.table(["", "TTFT"], [["", "1%"]]) == "| | TTFT |\n|---|---|\n| | 1% |\n"


def test_a_table_with_no_rows_is_its_header():
    assert report.table(["x"], []) == "| x |\n|---|\n"


@pytest.mark.parametrize(
    ("x", "signed", "text"),
    [
        (None, False, "-"),
        (None, True, "-"),
        (0.123, False, "12%"),
        (0.123, True, "+12%"),
        (-0.05, False, "-5%"),
        (-0.05, True, "-5%"),
    ],
)
def test_percent(x, signed, text):
    assert report.percent(x, signed=signed) == text


def test_write_puts_the_json_the_markdown_and_the_plot_side_by_side(tmp_path, capsys):
    plotted = []
    out = tmp_path / "new" / "run.json"
    text = report.write(
        out, {"a": 1}, markdown=lambda d: f"a is {d['a']}\n", plot=lambda d, path: plotted.append((d, path))
    )
    assert json.loads(out.read_text()) == {"a": 1} and out.read_text().endswith("}\n")
    assert (tmp_path / "new" / "run.md").read_text() == text == "a is 1\n"
    assert plotted == [({"a": 1}, tmp_path / "new" / "run.png")]
    assert capsys.readouterr().out == "a is 1\n\n"


def test_write_without_markdown_writes_the_json_alone(tmp_path):
    assert report.write(tmp_path / "x.json", {"b": [1]}) is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"]


def test_write_json_keeps_the_indent_asked_for(tmp_path):
    path = report.write_json(tmp_path / "x.json", {"b": [1]}, indent=1)
    assert path.read_text() == '{\n "b": [\n  1\n ]\n}\n'


# Each script's markdown(doc) against the markdown committed beside its JSON: the tables come out as the
# committed results were written (both are written together by the script).
COMMITTED = [
    ("compare_routing", "compare_routing"),
    ("compare_shape_routing", "shape_routing"),
    ("compare_serving", "compare_serving"),
    ("compare_serving", "compare_serving_agg"),
    ("cpu_engine_polling", "cpu_engine_polling"),
    ("mocker_validation", "mocker_validation"),
    ("roofline_vs_published", "roofline_vs_published"),
    ("sim_validation", "sim_validation"),
]


@pytest.mark.parametrize(("module", "result"), COMMITTED, ids=[r for _, r in COMMITTED])
def test_a_script_writes_its_committed_markdown_from_its_committed_json(module, result):
    markdown = importlib.import_module(f"benchmarks.{module}").markdown
    doc = json.loads((RESULTS / f"{result}.json").read_text())
    assert markdown(doc) == (RESULTS / f"{result}.md").read_text()


def test_wait_until_returns_once_ready_and_counts_http_errors_and_bad_bodies_as_not_yet():
    answers = iter([httpx.ConnectError("refused"), ValueError("not JSON"), False, True])

    def ready():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    launch.wait_until(ready, "ready", timeout_s=5, poll_s=0)
    assert next(answers, "done") == "done"


def test_wait_until_gives_up_after_its_timeout():
    with pytest.raises(TimeoutError, match="not up after"):
        launch.wait_until(lambda: False, "up", timeout_s=0.05, poll_s=0.01)


def test_wait_until_stops_as_soon_as_a_process_it_watches_has_exited(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(RuntimeError, match=f"exited with 3 before up; see {tmp_path}"):
        launch.wait_until(lambda: False, "up", timeout_s=60, procs=[proc], log=tmp_path)


def test_an_experiment_s_main_parses_its_options_and_returns_its_status():
    def add_arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--n", type=int, default=1)

    assert launch.main("doc", add_arguments, lambda args: args.n + 1, ["--n", "4"]) == 5
    assert launch.parser("the help").description == "the help"


def test_the_paths_are_the_repository_s():
    root = Path(__file__).resolve().parents[2]
    assert (launch.ROOT, launch.RESULTS, launch.CONFIGS) == (root, root / "benchmarks" / "results", root / "configs")
    assert (launch.PEER_ENV / "ray_serve_llm_app.py").is_file() and (launch.DATA / "roofline_published.json").is_file()


def test_the_dynamo_shim_file_installs_its_import_hook_and_qwen2_vl_s_rule():
    """The file dynamo_peer copies into Dynamo's venv, loaded as that venv's .pth loads it."""
    from benchmarks import dynamo_peer

    probe = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location({dynamo_peer.SHIM_MODULE!r}, sys.argv[1])\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(type(sys.meta_path[0]).__name__, module.smart_resize(100, 300))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(dynamo_peer.SHIM_SOURCE)], capture_output=True, text=True, check=True
    )
    assert out.stdout.split(maxsplit=1) == ["_Finder", "(112, 308)\n"]


# A stand-in for `serve run CONFIG`: it reads the Serve config the launcher wrote and answers
# GET <route_prefix>/health for each of its applications on the listening socket it inherits (fd argv[1]), writing
# each request to stderr; SIGINT ends it cleanly, as it ends serve run.
SERVE_RUN_STAND_IN = """
import http.server, socket, sys, yaml
listening = socket.socket(fileno=int(sys.argv[1]))
config = yaml.safe_load(open(sys.argv[2]))
healthy = {app["route_prefix"].rstrip("/") + "/health" for app in config["applications"]}

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path in healthy else 404)
        self.end_headers()

server = http.server.HTTPServer(listening.getsockname(), Health, bind_and_activate=False)
server.socket.close()
server.socket = listening
try:
    server.serve_forever()
except KeyboardInterrupt:
    pass
"""
# The launcher's wait for health: the stand-in answers the first check; a URL it does not serve fails in this time.
HEALTHY_WITHIN_S = 30
INGRESS_SWITCHES = {
    "RAY_SERVE_ENABLE_HA_PROXY",
    "RAY_SERVE_HAPROXY_RETRY_ON",
    "RAY_SERVE_HAPROXY_STATS_PORT",
    "RAY_SERVE_HAPROXY_METRICS_PORT",
    "RAY_SERVE_HAPROXY_BINARY_PATH",
}


@dataclass
class Ran:
    """A command the launcher ran to completion (`ray start`, `ray stop`): not run here."""

    argv: list[str]
    env: dict[str, str] | None


@dataclass
class Served:
    """The `serve run` the launcher started: its command, how it was started, the Serve config it was given, and
    the stand-in process that runs in its place."""

    argv: list[str]
    how: dict
    config: dict
    proc: subprocess.Popen


@dataclass
class ProcessBoundary:
    """The launcher's side of subprocess: what it runs and starts, recorded."""

    ran: list[Ran] = field(default_factory=list)
    served: list[Served] = field(default_factory=list)

    def run(self, argv, **how):
        self.ran.append(Ran(argv, how.get("env")))
        return subprocess.CompletedProcess(argv, 0, b"", b"")

    def popen(self, argv, **how):
        import yaml

        config = yaml.safe_load(Path(argv[-1]).read_text())
        http = config["http_options"]
        # Bound before the stand-in starts: the launcher's first health check waits in the backlog, not in a retry.
        with socket.create_server((http["host"], http["port"])) as listening:
            fd = listening.fileno()
            proc = subprocess.Popen(
                [sys.executable, "-c", SERVE_RUN_STAND_IN, str(fd), argv[-1]], pass_fds=(fd,), **how
            )
        self.served.append(Served(argv, how, config, proc))
        return proc


@pytest.fixture
def boundary(monkeypatch):
    """The launcher's subprocess.run / Popen go through a ProcessBoundary (the module as the launcher alone sees it);
    the ingress switches start unset."""
    recorded = ProcessBoundary()
    seen = types.SimpleNamespace(**{**vars(subprocess), "run": recorded.run, "Popen": recorded.popen})
    monkeypatch.setattr(launch, "subprocess", seen)
    for name in INGRESS_SWITCHES:
        monkeypatch.delenv(name, raising=False)
    yield recorded
    for served in recorded.served:
        if served.proc.poll() is None:
            served.proc.kill()
            served.proc.wait()


@pytest.fixture
def orphaned_haproxy(monkeypatch):
    """A process of this test's own that the process table shows as a Serve HAProxy whose Ray instance went away
    (the only one: the machine's other processes are not this test's to stop)."""
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    cmdline = ["haproxy", "-f", "/tmp/haproxy-serve/haproxy.cfg"]
    entry = types.SimpleNamespace(info={"pid": proc.pid, "ppid": 1, "cmdline": cmdline})
    monkeypatch.setattr(psutil, "process_iter", lambda attrs: [entry])
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _changed_env(env: dict[str, str] | None) -> dict[str, str]:
    """What an environment the launcher passes sets beyond this process's own (None: it inherits this one)."""
    return {k: v for k, v in (env or {}).items() if os.environ.get(k) != v}


def test_our_app_is_served_from_the_serve_config_written_with_ray_started_and_the_ingress_on(
    boundary, orphaned_haproxy, tmp_path
):
    cfg = launch.app_args("disagg-cpu.yaml", decode_pool__replicas=2)
    log = tmp_path / "serve.log"
    with launch.ours(cfg, log, timeout_s=HEALTHY_WITHIN_S) as url:
        (served,) = boundary.served
        port = served.config["http_options"]["port"]
        assert url == f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/health").status_code == 200  # the app the config routes at / answers there
    ray, serve = str(launch.VENV_BIN / "ray"), str(launch.VENV_BIN / "serve")
    ray_start, ray_stop = boundary.ran
    assert ray_start.argv == [ray, "start", "--head", "--num-cpus", "8", "--include-dashboard", "false"]
    config_path = served.argv[-1]
    assert served.argv == [serve, "run", "--address", "auto", config_path]
    assert served.config == {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": port},
        "applications": [
            {
                "name": "orchestrator",
                "route_prefix": "/",
                "import_path": "deployments.app:build_app",
                "args": cfg.model_dump(mode="json"),
            }
        ],
    }
    # Serve imports the builder from the repository root and validates the args by its annotation: they read back
    # as the very config.
    (app,) = served.config["applications"]
    (parameter,) = inspect.signature(pkgutil.resolve_name(app["import_path"])).parameters.values()
    assert parameter.annotation is AppConfig and AppConfig.model_validate(app["args"]) == cfg
    # The ingress switches reach Ray's processes through the environment both commands start with.
    switches = _changed_env(ray_start.env)
    assert set(switches) == INGRESS_SWITCHES and switches["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert switches["RAY_SERVE_HAPROXY_RETRY_ON"] == "conn-failure empty-response"
    assert _changed_env(served.how["env"]) == switches
    assert (served.how["cwd"], served.how["start_new_session"]) == (launch.ROOT, True)
    # Stopped: serve run by SIGINT to its group, then `ray stop --force`, then the HAProxy it leaves orphaned.
    assert served.proc.returncode == 0 and ray_stop == Ran([ray, "stop", "--force"], None)
    assert orphaned_haproxy.wait(timeout=30) == -signal.SIGTERM
    assert "GET /health" in log.read_text() and not Path(config_path).exists()


def test_several_apps_share_one_serve_config_each_at_its_route_without_ray_start_or_the_ingress(
    boundary, orphaned_haproxy
):
    agg, disagg = launch.app_args("agg-cpu.yaml"), launch.app_args("disagg-cpu.yaml")
    port = launch.free_port()
    apps = {"agg": agg, "disagg": disagg}
    with launch.ours(apps, ingress=False, ray_start=False, port=port, timeout_s=HEALTHY_WITHIN_S) as urls:
        assert urls == {"agg": f"http://127.0.0.1:{port}/agg", "disagg": f"http://127.0.0.1:{port}/disagg"}
        assert [httpx.get(f"{u}/health").status_code for u in urls.values()] == [200, 200]
    (served,) = boundary.served
    assert served.argv[:-1] == [str(launch.VENV_BIN / "serve"), "run"]  # serve run starts a Ray of its own
    assert served.config["http_options"] == {"host": "127.0.0.1", "port": port}
    assert [(a["name"], a["route_prefix"], a["args"]) for a in served.config["applications"]] == [
        ("agg", "/agg", agg.model_dump(mode="json")),
        ("disagg", "/disagg", disagg.model_dump(mode="json")),
    ]
    assert _changed_env(served.how["env"]) == {}  # no ingress switches: Serve's own proxy
    assert served.proc.returncode == 0
    assert boundary.ran == [Ran([str(launch.VENV_BIN / "ray"), "stop", "--force"], None)]
    assert orphaned_haproxy.poll() is None  # without our ingress, no HAProxy of ours to end


def test_our_apps_in_process_share_one_serve_instance_started_with_the_ingress(monkeypatch):
    events = []
    serve = types.SimpleNamespace(
        start=lambda http_options: events.append(("start", http_options)),
        RunTarget=lambda app, name, route_prefix: (app, name, route_prefix),
        run_many=lambda targets, **kw: events.append(("run_many", targets, kw)),
        shutdown=lambda: events.append("serve.shutdown"),
    )
    ray = types.ModuleType("ray")
    ray.serve = serve
    ray.init = lambda **kw: events.append(("init", kw, launch.os.environ.get("RAY_SERVE_ENABLE_HA_PROXY")))
    ray.shutdown = lambda: events.append("ray.shutdown")
    monkeypatch.delenv("RAY_SERVE_ENABLE_HA_PROXY", raising=False)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setitem(sys.modules, "deployments.app", types.SimpleNamespace(build_app=lambda cfg: f"app {cfg}"))
    monkeypatch.setattr("deployments.ingress.stop_orphaned_haproxy", lambda: events.append("haproxy"))
    monkeypatch.setattr(launch, "wait_healthy", lambda url, timeout_s, procs, log: events.append(("wait", url)))
    with launch.ours({"a": "A", "b": "B"}, in_process=True, port=8125, quiet=True) as urls:
        assert urls == {"a": "http://127.0.0.1:8125/a", "b": "http://127.0.0.1:8125/b"}
        assert "RAY_SERVE_ENABLE_HA_PROXY" not in launch.os.environ  # set while Ray starts only
    assert events == [
        (
            "init",
            {
                "address": "local",
                "num_cpus": 8,
                "include_dashboard": False,
                "logging_level": "ERROR",
                "log_to_driver": False,
            },
            "1",
        ),
        ("start", {"host": "127.0.0.1", "port": 8125}),
        ("run_many", [("app A", "a", "/a"), ("app B", "b", "/b")], {"wait_for_applications_running": True}),
        ("wait", "http://127.0.0.1:8125/a/health"),
        ("wait", "http://127.0.0.1:8125/b/health"),
        "serve.shutdown",
        "ray.shutdown",
        "haproxy",
    ]
