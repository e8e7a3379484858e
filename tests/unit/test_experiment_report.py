"""The experiments' shared launch and report helpers (benchmarks/launch.py, benchmarks/report.py, the table
writer in tools/report.py): pure functions, no servers."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from benchmarks import launch, report

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


class _Config:
    """What `launch.ours` reads of an AppConfig."""

    def __init__(self, name: str) -> None:
        self.name = name

    def model_dump(self, mode: str) -> dict:
        return {"model": {"name": self.name}}


class _Proc:
    pid = 12345
    args = ["serve", "run"]

    def poll(self):
        return None


def test_our_app_through_serve_run_starts_ray_then_serve_run_and_stops_both(monkeypatch, tmp_path):
    import yaml

    events, configs = [], []
    monkeypatch.delenv("RAY_SERVE_ENABLE_HA_PROXY", raising=False)

    def run(cmd, **kw):
        events.append(("run", [Path(cmd[0]).name, *cmd[1:]], kw.get("env", {}).get("RAY_SERVE_ENABLE_HA_PROXY")))

    def popen(cmd, **kw):
        configs.append(yaml.safe_load(Path(cmd[-1]).read_text()))
        events.append(("popen", [Path(cmd[0]).name, *cmd[1:-1]], kw["cwd"], kw["env"].get("RAY_SERVE_ENABLE_HA_PROXY")))
        return _Proc()

    monkeypatch.setattr(launch.subprocess, "run", run)
    monkeypatch.setattr(launch.subprocess, "Popen", popen)
    monkeypatch.setattr(launch.time, "sleep", lambda s: None)
    monkeypatch.setattr(launch, "wait_healthy", lambda url, timeout_s, procs, log: events.append(("wait", url)))
    monkeypatch.setattr(launch, "stop", lambda *procs, wait_s: events.append(("stop", wait_s)))
    monkeypatch.setattr("deployments.ingress.stop_orphaned_haproxy", lambda: events.append("haproxy"))
    with launch.ours(_Config("m"), tmp_path / "serve.log", port=8123) as url:
        assert url == "http://127.0.0.1:8123"
    assert configs == [
        {
            "proxy_location": "HeadOnly",
            "http_options": {"host": "127.0.0.1", "port": 8123},
            "applications": [
                {
                    "name": "orchestrator",
                    "route_prefix": "/",
                    "import_path": "deployments.app:build_app",
                    "args": {"model": {"name": "m"}},
                }
            ],
        }
    ]
    assert events == [
        ("run", ["ray", "start", "--head", "--num-cpus", "8", "--include-dashboard", "false"], "1"),
        ("popen", ["serve", "run", "--address", "auto"], launch.ROOT, "1"),
        ("wait", "http://127.0.0.1:8123/health"),
        ("stop", 60),
        ("run", ["ray", "stop", "--force"], None),
        "haproxy",
    ]

    events.clear()
    with launch.ours({"a": _Config("a")}, ingress=False, ray_start=False, port=8124, stop_wait_s=120) as urls:
        assert urls == {"a": "http://127.0.0.1:8124/a"}
    assert configs[-1]["applications"][0]["route_prefix"] == "/a"
    assert events == [
        ("popen", ["serve", "run"], launch.ROOT, None),
        ("wait", "http://127.0.0.1:8124/a/health"),
        ("stop", 120),
        ("run", ["ray", "stop", "--force"], None),
    ]


def test_our_apps_in_process_share_one_serve_instance_started_with_the_ingress(monkeypatch):
    import types

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
