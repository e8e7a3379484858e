"""NVIDIA Dynamo 1.6.1's planner, driven tick by tick over stdin/stdout (one
JSON object a line). Runs in its own environment (benchmarks/dynamo_planner.py
creates it); imports nothing of ours.

    -> {"init": {"config": PlannerConfig fields, "capabilities": {"prefill": {...}, "decode": {...}},
                 "prefill_fpms": [fpm], "decode_fpms": [fpm]}}
    <- {"first_tick_s": s}
    -> {"tick": <the snapshot replay's Rust loop hands ReplayPlannerAdapter.on_tick>}
    <- {"target_prefill": n | null, "target_decode": n | null, "next_tick_s": s | null, "diagnostics": {...}}

Dynamo's code decides: `create_replay_planner_adapter` (its offline replay
path: the builtin orchestrator, PREDICT/PROPOSE plugins, its load predictor,
its throughput sizing, budget and delta caps) and `ReplayPlannerAdapter.on_tick`.

What is not Dynamo 1.6.1's own, and why:
- 1.6.1 sizes an engine with `PlannerEnginePerfModel`, a wrapper around the
  AISimulate core (`aisimulate_core.sdk`). That wheel comes only with the
  `aisimulate==0.13.0` package, a placeholder on PyPI that downloads from an
  index this machine cannot reach. So `aisimulate_core.sdk` is an empty stand-in
  here (any use raises), and `ProfileRegressionPerfModel` below takes the
  perf model's place through the engine adapter's own `install_regressions`
  seam. It answers the planner's capacity queries with Dynamo's own regression
  models, shipped in the same 1.6.1 package (`PrefillRegressionModel`,
  `DecodeRegressionModel`: the FPM regressions the planner used before AIS),
  bootstrapped from forward-pass metrics synthesized from the same profile our
  planner sizes with (as Dynamo's pre-deployment profiling measures them).
- Only throughput scaling runs (1.6.1's default: `enable_load_scaling` off),
  so the load loop's queries (`estimate_queued_prefill_time`, ...) are not
  answered.
"""

from __future__ import annotations

import json
import math
import sys
import types
from typing import Any


def _stand_in_for_aisimulate_core() -> None:
    class _Unavailable:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("aisimulate_core is not installed (the aisimulate placeholder's index is unreachable)")

    package = types.ModuleType("aisimulate_core")
    sdk = types.ModuleType("aisimulate_core.sdk")
    sdk.ForwardPassPerfModelConfig = _Unavailable
    sdk.RustForwardPassPerfModel = _Unavailable
    package.sdk = sdk
    package.__path__ = []
    sys.modules.setdefault("aisimulate_core", package)
    sys.modules.setdefault("aisimulate_core.sdk", sdk)


_stand_in_for_aisimulate_core()

from dynamo.planner.config.planner_config import PlannerConfig  # noqa: E402
from dynamo.planner.core.perf_model import (  # noqa: E402
    DecodeRegressionModel,
    PlannerEngineCapacity,
    PrefillRegressionModel,
)
from dynamo.planner.core.perf_model.base import _clamp_kv_hit_rate  # noqa: E402
from dynamo.planner.core.types import EngineCapabilities, WorkerCapabilities  # noqa: E402
from dynamo.planner.offline.replay_adapter import (  # noqa: E402
    _build_fpm_from_dict,
    create_replay_planner_adapter,
)


class ProfileRegressionPerfModel:
    """The planner-facing perf model of one worker type, answered by Dynamo's FPM regression model."""

    def __init__(self, worker_type: str, config: PlannerConfig, capabilities: EngineCapabilities | None) -> None:
        self._worker_type = worker_type
        self._config = config
        self._capabilities = capabilities
        samples = config.max_num_fpm_samples
        buckets = config.fpm_sample_bucket_size
        self._model = (
            PrefillRegressionModel(samples, config.load_min_observations, buckets)
            if worker_type == "prefill"
            else DecodeRegressionModel(samples, config.load_min_observations, buckets)
        )

    def update_capabilities(self, capabilities: EngineCapabilities | None) -> None:
        self._capabilities = capabilities

    def load_benchmark_fpms(self, fpms: list) -> None:
        self._model.load_benchmark_fpms(fpms)

    def add_observations(self, fpms: dict) -> None:
        """Live forward passes, keyed by (worker, rank), as PlannerScalingState passes them."""
        for fpm in fpms.values():
            self._model.add_observation(fpm)

    def has_sufficient_data(self) -> bool:
        return self._model.has_sufficient_data()

    @property
    def num_observations(self) -> int:
        return self._model.num_observations

    @property
    def min_observations(self) -> int:
        return self._model.min_observations

    def find_engine_capacity_rps(
        self,
        *,
        isl: float,
        osl: float,
        ttft_sla_ms: float | None = None,
        itl_sla_ms: float | None = None,
        e2e_latency_sla_ms: float | None = None,
        kv_hit_rate: float | None = None,
        accept_length: float = 1.0,
    ) -> PlannerEngineCapacity | None:
        caps = self._capabilities
        if isl <= 0 or (self._worker_type != "prefill" and osl <= 0):
            return None
        if self._worker_type == "prefill":
            # The prompt's cached share is not computed (estimate_next_ttft discounts the same way).
            uncached = isl * (1.0 - _clamp_kv_hit_rate(kv_hit_rate))
            rps, ttft_ms = self._model.find_best_engine_prefill_rps(
                ttft_sla_ms or math.inf, max(uncached, 1.0), caps.max_num_batched_tokens if caps else None
            )
            return PlannerEngineCapacity(rps=rps, ttft_ms=ttft_ms) if rps > 0 else None
        # The mean context over a request's decode: its prompt plus half its answer.
        rps, itl_ms = self._model.find_best_engine_decode_rps(
            itl_sla_ms or math.inf,
            isl + osl / 2,
            osl,
            caps.max_kv_tokens if caps else None,
            caps.max_num_seqs if caps else None,
            accept_length,
        )
        return PlannerEngineCapacity(rps=rps, itl_ms=itl_ms) if rps > 0 else None


def _capabilities(raw: dict[str, dict]) -> WorkerCapabilities:
    return WorkerCapabilities(**{k: EngineCapabilities(**v) for k, v in raw.items()})


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


# What each tick's reply carries of Dynamo's TickDiagnostics.
DIAGNOSTICS = (
    "predicted_num_req",
    "predicted_isl",
    "predicted_osl",
    "predicted_kv_hit_rate",
    "engine_rps_prefill",
    "engine_rps_decode",
    "throughput_decision_reason",
    "throughput_decision_reason_prefill",
    "throughput_decision_reason_decode",
)


class Bridge:
    def __init__(self, init: dict[str, Any]) -> None:
        config = PlannerConfig(**init["config"])
        capabilities = _capabilities(init["capabilities"])
        # Built without capabilities, as a live planner is before it discovers its workers: the AIS perf
        # models wait for engine limits and are never initialised; ours take their place, then the
        # capabilities arrive through the adapter's late-discovery call.
        self.adapter = create_replay_planner_adapter(config, WorkerCapabilities(), capture_details=True)
        engine = self.adapter._engine  # the OrchestratorEngineAdapter create_replay_planner_adapter built
        models = {
            kind: ProfileRegressionPerfModel(kind, config, getattr(capabilities, kind))
            for kind in ("prefill", "decode")
        }
        models["prefill"].load_benchmark_fpms([_build_fpm_from_dict(d) for d in init["prefill_fpms"]])
        models["decode"].load_benchmark_fpms([_build_fpm_from_dict(d) for d in init["decode_fpms"]])
        engine.install_regressions(prefill=models["prefill"], decode=models["decode"])
        engine.update_capabilities(capabilities)
        self.adapter.start()

    def first_tick_s(self) -> float:
        return self.adapter.initial_tick_ms() / 1000.0

    def tick(self, snapshot: dict[str, Any]) -> dict[str, Any]:
        decision = self.adapter.on_tick(snapshot)
        record = self.adapter._ticks[-1]  # what capture_details kept of this tick
        diagnostics = record["effects"]["diagnostics"]
        next_ms = decision["next_tick_ms"]
        return {
            "target_prefill": decision["target_prefill"],
            "target_decode": decision["target_decode"],
            "next_tick_s": None if next_ms is None else next_ms / 1000.0,
            "diagnostics": {k: diagnostics.get(k) for k in DIAGNOSTICS},
        }


def main() -> int:
    bridge: Bridge | None = None
    for line in sys.stdin:
        message = json.loads(line)
        if "init" in message:
            bridge = Bridge(message["init"])
            reply: dict[str, Any] = {"first_tick_s": bridge.first_tick_s()}
        elif "tick" in message and bridge is not None:
            reply = bridge.tick(message["tick"])
        else:
            reply = {"error": f"unexpected message {sorted(message)}"}
        sys.stdout.write(json.dumps(_jsonable(reply)) + "\n")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
