"""How an experiment starts what it measures: the repository's paths, free ports, waiting until a server
answers, stopping a process group, the tiny model, and our application (`ours`, the one launcher every
script that serves our app uses). Peers' launchers (peers.py, dynamo_peer.py) build on the same helpers.

Scripts run as files (`python benchmarks/<name>.py`) put the repository root on sys.path before they
import this module; run as modules (`python -m benchmarks.<name>`) they need nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    from orchestrator.config import AppConfig

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
RESULTS = ROOT / "benchmarks" / "results"
DATA = ROOT / "benchmarks" / "data"  # published figures the experiments compare with
PEER_ENV = ROOT / "benchmarks" / "peer_env"  # files that run in a peer's interpreter, read from disk
TRACES = ROOT.parent / "shared" / "traces"
MODEL_DIR = Path("~/.cache/orchestrator/tiny-llama").expanduser()
VENV_BIN = Path(sys.executable).parent
HOST = "127.0.0.1"


# -- the command line ------------------------------------------------------------------------------------------------


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An experiment's argument parser; its module docstring is the help text."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def main(
    doc: str | None,
    add_arguments: Callable[[argparse.ArgumentParser], None],
    experiment: Callable[[argparse.Namespace], int],
    argv: list[str] | None = None,
) -> int:
    """Parse `argv` with the options `add_arguments` adds, run `experiment` on them; its exit status."""
    p = parser(doc)
    add_arguments(p)
    return experiment(p.parse_args(argv))


# -- ports, readiness, processes -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def local_url(port: int) -> str:
    return f"http://{HOST}:{port}"


def wait_until(
    ready: Callable[[], bool],
    what: str,
    timeout_s: float = 900,
    poll_s: float = 2,
    procs: Sequence[subprocess.Popen] = (),
    log: Path | None = None,
) -> None:
    """Poll `ready()` every `poll_s` until it holds (an HTTP error, or a ValueError such as a body that is not
    JSON, counts as not yet). Raises RuntimeError as soon as one of `procs` has exited, TimeoutError after
    `timeout_s`; both name `log` if given."""
    see = f"; see {log}" if log else ""
    deadline = time.monotonic() + timeout_s
    while True:
        for proc in procs:
            if proc.poll() is not None:
                command = " ".join(map(str, proc.args[:4])) if isinstance(proc.args, list) else proc.args
                raise RuntimeError(f"{command} exited with {proc.returncode} before {what}{see}")
        with contextlib.suppress(httpx.HTTPError, ValueError):
            if ready():
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"not {what} after {timeout_s:.0f} s{see}")
        time.sleep(poll_s)


def wait_healthy(
    url: str, timeout_s: float = 900, procs: Sequence[subprocess.Popen] = (), log: Path | None = None
) -> None:
    """Until GET `url` answers 200 (a server's /health, or /v1/models where that is all it has)."""
    wait_until(
        lambda: httpx.get(url, timeout=5).status_code == 200, f"{url} answering", timeout_s, procs=procs, log=log
    )


def counters(url: str, names: Mapping[str, Sequence[str]]) -> dict[str, float]:
    """Our app's counters `names` (name -> the labels its series are told apart by; others are summed), one key
    per series: "name{a=b}", or the bare name when it has none."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
        for sample in family.samples:
            if sample.name in names:
                labels = ",".join(f"{k}={sample.labels.get(k, '')}" for k in names[sample.name])
                key = f"{sample.name}{{{labels}}}" if labels else sample.name
                values[key] = values.get(key, 0.0) + sample.value
    return values


def increments(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What each counter series gained between two `counters` reads (series that gained nothing left out)."""
    return {k: after[k] - before.get(k, 0.0) for k in sorted(after) if after[k] - before.get(k, 0.0)}


def stop(*procs: subprocess.Popen, wait_s: float = 60) -> None:
    """SIGINT to each process's group (all at once), then wait for each; SIGKILL to a group after `wait_s`."""
    for proc in procs:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def ray_stop(bin_dir: Path = VENV_BIN, haproxy: bool = True) -> None:
    """`ray stop --force` of the environment in `bin_dir`; with `haproxy`, then end the HAProxy it leaves."""
    subprocess.run([str(bin_dir / "ray"), "stop", "--force"], capture_output=True, check=False)
    if haproxy:
        from deployments.ingress import stop_orphaned_haproxy

        time.sleep(2)  # the HAProxy of the stopped instance is adopted by init
        stop_orphaned_haproxy()


# -- the model and our application -----------------------------------------------------------------------------------


def tiny_model():
    """The tiny random Llama every CPU experiment serves (written on first use); returns its tokenizer."""
    from orchestrator.prompts import load_tokenizer
    from orchestrator.tiny_model import make_tiny_model

    make_tiny_model(MODEL_DIR)
    return load_tokenizer(str(MODEL_DIR))


def app_args(name: str, **overrides: Any) -> AppConfig:
    """The shipped config `configs/<name>` on the tiny model, with `overrides` (`decode_pool__replicas=2`)."""
    from orchestrator.config import shipped_config

    return shipped_config(CONFIGS / name, MODEL_DIR, **overrides)


@contextlib.contextmanager
def ours(
    apps: AppConfig | Mapping[str, AppConfig],
    log: Path | None = None,
    *,
    in_process: bool = False,
    name: str = "orchestrator",
    port: int | None = None,
    ingress: bool = True,
    num_cpus: int | None = 8,
    ray_start: bool = True,
    quiet: bool = False,
    timeout_s: float = 900,
    stop_wait_s: float = 60,
) -> Iterator[Any]:
    """Our application, on a Ray instance of its own, until the block ends.

    `apps`: one config, served at / as application `name` (yields its base URL), or {name: config}, each
    served at /<name> in the same Serve instance (yields {name: URL}). Ready once every app's /health
    answers. `ingress`: HAProxy in front (as the main job runs it; off: Serve's Python proxy). `num_cpus`:
    the instance's logical CPUs (None: Ray's count): engines are bounded by their OpenMP threads, not by
    Ray's CPU accounting.

    Two ways to run it:
    - `in_process=False`: `ray start --head` (unless `ray_start` is False: `serve run` then starts its own
      Ray) and `serve run` of a Serve config, a process tree of its own writing to `log`; stopped with
      SIGINT (SIGKILL after `stop_wait_s`), then `ray stop --force`.
    - `in_process=True`: this process is the Ray driver (`ray.init(address="local")`), which the script
      needs when it reads Serve's state or kills actors; `quiet`: Ray's logs at ERROR, none to the driver.
    """
    single = not isinstance(apps, Mapping)
    configs = {name: apps} if single else dict(apps)
    routes = {n: "/" if single else f"/{n}" for n in configs}
    port = port or free_port()
    urls = {n: local_url(port) + route.rstrip("/") for n, route in routes.items()}
    if in_process:
        running = _in_process(configs, routes, port, ingress=ingress, num_cpus=num_cpus, quiet=quiet)
    else:
        running = _serve_run(
            configs, routes, port, log, ingress=ingress, num_cpus=num_cpus, ray_start=ray_start, stop_wait_s=stop_wait_s
        )
    with running as procs:
        for url in urls.values():
            wait_healthy(f"{url}/health", timeout_s, procs, log)
        yield urls[name] if single else urls


@contextlib.contextmanager
def _serve_run(
    configs: dict[str, AppConfig],
    routes: dict[str, str],
    port: int,
    log: Path | None,
    *,
    ingress: bool,
    num_cpus: int | None,
    ray_start: bool,
    stop_wait_s: float,
) -> Iterator[list]:
    import yaml

    doc = {
        "proxy_location": "HeadOnly",
        "http_options": {"host": HOST, "port": port},
        "applications": [
            {
                "name": n,
                "route_prefix": routes[n],
                "import_path": "deployments.app:build_app",
                "args": cfg.model_dump(mode="json"),
            }
            for n, cfg in configs.items()
        ],
    }
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(doc, f)
    env = dict(os.environ)
    if ingress:
        from deployments.ingress import ingress_env

        env.update(ingress_env())  # our ingress, as the main job runs it
    address = []
    if ray_start:
        cpus = ["--num-cpus", str(num_cpus)] if num_cpus is not None else []
        subprocess.run(
            [str(VENV_BIN / "ray"), "start", "--head", *cpus, "--include-dashboard", "false"],
            capture_output=True,
            check=True,
            env=env,
        )
        address = ["--address", "auto"]
    out = log.open("w") if log else subprocess.DEVNULL
    proc = subprocess.Popen(
        [str(VENV_BIN / "serve"), "run", *address, f.name],
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=ROOT,
        env=env,
    )
    try:
        yield [proc]
    finally:
        stop(proc, wait_s=stop_wait_s)
        ray_stop(haproxy=ingress)
        Path(f.name).unlink(missing_ok=True)


@contextlib.contextmanager
def _in_process(
    configs: dict[str, AppConfig],
    routes: dict[str, str],
    port: int,
    *,
    ingress: bool,
    num_cpus: int | None,
    quiet: bool,
) -> Iterator[list]:
    import ray
    from ray import serve

    from deployments.app import build_app
    from deployments.ingress import ingress_environment, stop_orphaned_haproxy

    logs = {"logging_level": "ERROR", "log_to_driver": False} if quiet else {"logging_level": "WARNING"}
    # "local": our own Ray instance, whatever else runs on this machine; Ray's processes read the
    # ingress switches from the environment they start with.
    with ingress_environment() if ingress else contextlib.nullcontext():
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **logs)
    try:
        serve.start(http_options={"host": HOST, "port": port})
        serve.run_many(
            [serve.RunTarget(build_app(cfg), name=n, route_prefix=routes[n]) for n, cfg in configs.items()],
            wait_for_applications_running=True,
        )
        yield []
    finally:
        with contextlib.suppress(Exception):
            serve.shutdown()
        ray.shutdown()
        if ingress:
            stop_orphaned_haproxy()
