"""NVIDIA Dynamo 1.6.1's SLA planner as a peer policy in the autoscale
experiment (benchmarks/autoscale.py), in the cluster simulator's virtual time.

Dynamo's code decides: it runs in its own environment (`peers.PEERS_DIR /
"dynamo-planner"`, created on first use) behind benchmarks/peer_env/
dynamo_planner_bridge.py, through its offline replay adapter
(`create_replay_planner_adapter`, `ReplayPlannerAdapter.on_tick`): its load
predictor, throughput sizing, delta cap and GPU budget. What it is fed:

    every tick (its `load_adjustment_interval_seconds`, set to the experiment's
    interval, when our planner steps too):
      traffic  = what Dynamo's frontend would report of the interval, from the
                 same simulated requests (FrontendTraffic): requests arrived;
                 ISL, OSL, prefix hit rate, mean TTFT and ITL of those completed
      workers  = ready replicas per pool (active), starting + ready (not draining)
    its targets are applied with the experiment's start-up delay and clamped
    to the experiment's per-pool cap, as every policy's are.

Its perf model: 1.6.1 sizes engines through the AISimulate core, which cannot
be installed here (the bridge's docstring says why and what stands in: Dynamo's
own FPM regression models, bootstrapped with the forward-pass metrics below).
The FPMs are synthesized from the same performance model our planner and the
simulator use, as Dynamo's pre-deployment profiling measures an engine:

    prefill  one prompt of n tokens a step, n up to max_num_batched_tokens
    decode   b sequences of context c a step, b up to max_num_seqs, b x c within the KV capacity
    wall_time = the model's step time for that batch

Policies (`POLICIES`): `dynamo` keeps Dynamo's defaults but for the SLA, the
mode and a GPU budget of both pools' caps (its default, 8 GPUs, would cap it
below the experiment's 2 x max_replicas); `dynamo-fast` also decides every
interval (throughput_adjustment_interval_seconds = the experiment's interval,
180 s by default), as our planner does.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks import dynamo_peer, launch
from orchestrator.sim.cluster import ClusterSim, ReplicaState, RequestOutcome
from orchestrator.sim.perf_model import Batch, PerfModel

VENV_NAME = "dynamo-planner"
# The planner's own imports, which the ai-dynamo wheel does not declare (its container image carries them).
PACKAGES = [
    "numpy",
    "scikit-learn",
    "pandas",
    "filterpy",
    "pmdarima",
    "prophet",
    "plotly",
    "prometheus-api-client",
    "pyyaml",
    "grpcio",
    "protobuf",
    "uvloop",
]
BRIDGE = launch.PEER_ENV / "dynamo_planner_bridge.py"
VERSIONS_OF = ("ai-dynamo", "ai-dynamo-runtime", "scikit-learn", "pmdarima", "prophet", "filterpy", "numpy", "pandas")

PREFILL_TOKENS = (64, 128, 256, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DECODE_CONTEXTS = (128, 512, 1024, 2048, 4096, 8192, 16384)

POLICIES = ("dynamo", "dynamo-fast")


def log_path(out: str, policy: str) -> Path:
    """Where a run's Dynamo planner writes its own log (each sizing: demand, engine rps, replicas)."""
    return Path(tempfile.gettempdir()) / f"{Path(out).stem}.{policy}.log"


def ensure_venv() -> Path:
    """Dynamo's planner without vLLM or NIXL; returns its python."""
    return dynamo_peer._ensure_venv(
        VENV_NAME, PACKAGES, [], "dynamo.common.forward_pass_metrics, sklearn, pmdarima, prophet, filterpy"
    )


def versions(python: Path) -> dict[str, str]:
    code = "import importlib.metadata as m, json, sys; print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))"
    res = subprocess.run([str(python), "-c", code, *VERSIONS_OF], check=True, capture_output=True, text=True)
    return json.loads(res.stdout)


def fpm(worker: str, wall_time: float, prefill: tuple[int, int] = (0, 0), decode: tuple[int, int] = (0, 0)) -> dict:
    """One forward pass's metrics in the replay snapshot's shape: `prefill` (requests, tokens), `decode`
    (requests, KV tokens); nothing queued."""
    return {
        "worker_id": worker,
        "dp_rank": 0,
        "wall_time": wall_time,
        "num_prefill_requests": prefill[0],
        "sum_prefill_tokens": prefill[1],
        "var_prefill_length": 0.0,
        "sum_prefill_kv_tokens": 0,
        "num_decode_requests": decode[0],
        "sum_decode_kv_tokens": decode[1],
        "var_decode_kv_tokens": 0.0,
        "num_queued_prefill": 0,
        "sum_queued_prefill_tokens": 0,
        "var_queued_prefill_length": 0.0,
        "num_queued_decode": 0,
        "sum_queued_decode_kv_tokens": 0,
        "var_queued_decode_kv_tokens": 0.0,
    }


def profile_fpms(
    perf: PerfModel, max_num_batched_tokens: int, max_num_seqs: int, kv_tokens: int
) -> tuple[list[dict], list[dict]]:
    """(prefill, decode) forward passes of a profiling sweep, timed by `perf`."""
    prefill = [
        fpm("prefill-profile", perf.step_time(Batch(prefill=((n, 0),))), prefill=(1, n))
        for n in PREFILL_TOKENS
        if n <= max_num_batched_tokens
    ]
    decode = [
        fpm("decode-profile", perf.step_time(Batch(decode_contexts=(c,) * b)), decode=(b, b * c))
        for b in DECODE_BATCHES
        for c in DECODE_CONTEXTS
        if b <= max_num_seqs and b * c <= kv_tokens
    ]
    return prefill, decode


def planner_config(
    name: str, ttft_ms: float, itl_ms: float, interval_s: float, max_replicas: int, predictor: str = "arima"
) -> dict[str, Any]:
    """PlannerConfig fields of one policy (see the module docstring)."""
    config: dict[str, Any] = {
        "mode": "disagg",
        "backend": "mocker",
        "environment": "virtual",
        "optimization_target": "sla",
        "ttft_ms": ttft_ms,
        "itl_ms": itl_ms,
        "load_predictor": predictor,
        "max_gpu_budget": 2 * max_replicas,
        "load_adjustment_interval_seconds": int(interval_s),
    }
    if name == "dynamo-fast":
        config["throughput_adjustment_interval_seconds"] = int(interval_s)
    elif name != "dynamo":
        raise ValueError(f"unknown Dynamo policy {name!r}")
    return config


def capabilities(max_num_batched_tokens: int, max_num_seqs: int, kv_tokens: int, block_size: int) -> dict:
    engine = {
        "num_gpu": 1,
        "max_num_batched_tokens": max_num_batched_tokens,
        "max_num_seqs": max_num_seqs,
        "max_kv_tokens": kv_tokens,
        "kv_cache_block_size": block_size,
    }
    return {"prefill": dict(engine), "decode": dict(engine)}


class DynamoPlannerProcess:
    """The bridge process: one Dynamo planner, ticked in order."""

    def __init__(self, python: Path, init: dict[str, Any], log: Path | None = None) -> None:
        stderr = log.open("a") if log else subprocess.DEVNULL
        self._proc = subprocess.Popen(
            [str(python), str(BRIDGE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True
        )
        self.next_tick_s: float | None = self._call({"init": init})["first_tick_s"]

    def _call(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write(json.dumps(message) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"Dynamo's planner exited (rc {self._proc.wait()}); its log has why")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(f"Dynamo's planner: {reply['error']}")
        return reply

    def tick(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        reply = self._call({"tick": snapshot})
        self.next_tick_s = reply["next_tick_s"]
        return reply

    def close(self) -> None:
        if self._proc.stdin:
            self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()


@contextlib.contextmanager
def dynamo_planner(python: Path, init: dict[str, Any], log: Path | None = None) -> Iterator[DynamoPlannerProcess]:
    process = DynamoPlannerProcess(python, init, log)
    try:
        yield process
    finally:
        process.close()


class FrontendTraffic:
    """What Dynamo's frontend reports of a window, from the simulator's requests: those that arrived in it,
    and those that completed in it (their ISL, OSL, prefix hits, mean TTFT and ITL), each request once.
    (Our planner reads the replicas' reports instead; in a disaggregated pool those count a request at its
    decode replica, after its prefill.)"""

    def __init__(self) -> None:
        self._seen = 0  # sim.outcomes keeps arrivals in order; those before this index were counted
        self._open: list[RequestOutcome] = []

    def window(self, sim: ClusterSim, duration_s: float) -> dict[str, Any]:
        arrived = list(sim.outcomes.values())[self._seen :]
        self._seen += len(arrived)
        self._open += arrived
        done = [o for o in self._open if o.finished]
        self._open = [o for o in self._open if not o.finished]
        prompt = sum(o.prompt_tokens for o in done)
        itls = [statistics.fmean(o.itl_s) for o in done if len(o.token_times) > 1]

        def mean(values: list[float]) -> float:
            return statistics.fmean(values) if values else 0.0

        return {
            "duration_s": duration_s,
            "num_req": float(len(arrived)),
            "shape_count": float(len(done)),
            "avg_isl": mean([o.prompt_tokens for o in done]),
            "avg_osl": mean([len(o.token_times) for o in done]),
            "hit_rate_count": float(len(done)),
            "avg_kv_hit_rate": sum(o.cached_tokens for o in done) / prompt if prompt else 0.0,
            "ttft_count": float(len(done)),
            "avg_ttft_ms": mean([o.ttft_s * 1000 for o in done if o.ttft_s is not None]),
            "itl_count": float(len(itls)),
            "avg_itl_ms": mean(itls) * 1000,
        }


def snapshot(sim: ClusterSim, ordinal: int, traffic: dict[str, Any]) -> dict[str, Any]:
    """The tick's input in the shape replay's loop hands `ReplayPlannerAdapter.on_tick`: the window's traffic
    and the pools' replicas."""
    out: dict[str, Any] = {"tick_ordinal": ordinal, "traffic": traffic}
    for pool in ("prefill", "decode"):
        ready = [r.replica_id for r in sim.pool(pool) if r.state is ReplicaState.READY]
        starting = [r.replica_id for r in sim.pool(pool) if r.state is ReplicaState.STARTING]
        out[f"active_{pool}_count"] = len(ready)
        out[f"non_draining_{pool}_count"] = len(ready) + len(starting)
        out[f"active_{pool}_ids"] = ready
        out[f"starting_{pool}_ids"] = starting
    return out


def dynamo_controller(
    planner: DynamoPlannerProcess, interval_s: float, startup_s: float, max_replicas: int, log: list[dict]
) -> Callable[[ClusterSim], Callable[[ClusterSim], None]]:
    """A cluster-simulator controller (ClusterSim.every, once an interval) ticking Dynamo's planner."""

    def make(sim: ClusterSim) -> Callable[[ClusterSim], None]:
        ordinal = 0
        frontend = FrontendTraffic()

        def control(sim: ClusterSim) -> None:
            nonlocal ordinal
            due = planner.next_tick_s
            if due is None or abs(due - sim.now) > 1e-6:
                raise RuntimeError(f"Dynamo's planner asked for a tick at {due}, the simulator is at {sim.now}")
            state = snapshot(sim, ordinal, frontend.window(sim, interval_s))
            reply = planner.tick(state)
            ordinal += 1
            for pool in ("prefill", "decode"):
                target = reply[f"target_{pool}"]
                if target is not None:
                    sim.resize(pool, max(1, min(max_replicas, target)), startup_s)
            traffic = state["traffic"]
            log.append(
                {
                    "t": sim.now,
                    "rate": traffic["num_req"] / interval_s,
                    "isl": traffic["avg_isl"],
                    "osl": traffic["avg_osl"],
                    "prefill": sim.count("prefill"),
                    "decode": sim.count("decode"),
                    "prefill_ready": state["active_prefill_count"],
                    "decode_ready": state["active_decode_count"],
                    "target_prefill": reply["target_prefill"],
                    "target_decode": reply["target_decode"],
                    **{k: v for k, v in reply["diagnostics"].items() if v is not None},
                }
            )

        return control

    return make
