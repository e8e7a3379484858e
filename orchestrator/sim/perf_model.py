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
yet fitted to published benchmark tables (see the README's simulator
section for what is checked and what is not). Tensor
parallelism divides compute and memory time by the TP degree and adds a
per-step all-reduce cost.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass, field
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
    """Step times interpolated from a profile measured on a real engine
    (`orchestrator profile`): prefill time by new tokens (batch 1), decode
    step time by batch size and context."""

    prefill_points: list[tuple[int, float]]  # (tokens, seconds), ascending
    decode_points: dict[int, list[tuple[int, float]]]  # batch -> [(context, seconds)]
    kv_bytes: int = 0
    meta: dict = field(default_factory=dict)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_bytes

    @classmethod
    def load(cls, path: str | Path) -> "ProfileModel":
        doc = json.loads(Path(path).read_text())
        prefill = sorted((p["tokens"], p["seconds"]) for p in doc["prefill"])
        decode: dict[int, list[tuple[int, float]]] = {}
        for p in doc["decode"]:
            decode.setdefault(p["batch"], []).append((p["context"], p["step_seconds"]))
        return cls(prefill, {b: sorted(v) for b, v in decode.items()}, doc.get("kv_bytes_per_token", 0), doc.get("meta", {}))

    def prefill_time(self, tokens: int) -> float:
        return _interp(self.prefill_points, tokens)

    def decode_time(self, batch: int, mean_context: float) -> float:
        """Linear in batch size between (and beyond) the profiled batch sizes."""
        by_batch = [(b, _interp(points, mean_context)) for b, points in sorted(self.decode_points.items())]
        return max(_interp(by_batch, batch), 0.0)

    def step_time(self, batch: Batch) -> float:
        """Each prompt chunk as its own measured prefill (attention is per
        sequence); decoding sequences riding along a prefill step add only
        their marginal cost over a one-sequence step (the step's fixed cost
        is already in the prefill's time); a pure decode step is timed from
        the decode points."""
        if not batch.decode_contexts:
            return sum(self.prefill_time(n) for n, _ in batch.prefill)
        b = len(batch.decode_contexts)
        context = sum(batch.decode_contexts) / b
        decode = self.decode_time(b, context)
        if not batch.prefill:
            return decode
        marginal = max(decode - self.decode_time(1, context), 0.0)
        return sum(self.prefill_time(n) for n, _ in batch.prefill) + marginal


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
