"""The analytical roofline (`orchestrator/sim/perf_model.py`) against published
benchmark figures for the GPUs and models it ships presets for.

Each row is one published number with its source, the setup it was measured
in (engine, precision, batch or load, prompt and output lengths; the rows are
data: benchmarks/data/roofline_published.json), our
roofline's prediction for that setup, and the ratio predicted / published.
The roofline is evaluated with its shipped efficiency factors (no per-row
fitting). Setups are modelled as the published text describes them:

  ttft_batch1      one prompt of ISL tokens alone: one prefill step
  ttft_burst       all prompts arrive at once and are prefilled in one step
  tpot_burst       the same burst decoding: per-request time per output token,
                   each step timed at the batch still running (requests leave
                   when their output is done); the median over requests
  static_batch     TensorRT-LLM's static batching (gptSessionBenchmark): the
                   whole batch prefilled in one step, then OSL decode steps
                   at a growing context; output tokens / total time
  saturated        offline max throughput (trtllm-bench, `vllm bench` at high
                   concurrency): B sequences in flight, B bounded by the KV
                   cache beside the weights (90% of memory) and the engine's
                   batch cap; per OSL decode steps every sequence is replaced,
                   costing its prefill (compute-bound, not overlapped)

FP8 rows (TensorRT-LLM on H100/H200) run the same roofline with 1-byte
weights and KV and the GPU's dense FP8 peak (2x bf16): they check the
structure of the model (compute vs. memory bound, batch scaling) at another
operating point, not the bf16 presets themselves.

    .venv/bin/python benchmarks/roofline_vs_published.py

Writes benchmarks/results/roofline_vs_published.{json,md}.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from dataclasses import dataclass, replace

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, report  # noqa: E402
from orchestrator.sim.perf_model import GPUS, MODELS, Batch, GpuSpec, ModelSpec, RooflineModel  # noqa: E402

# The published figures, their sources and the setups they were measured in (a row a figure).
DATA = launch.DATA / "roofline_published.json"


@dataclass(frozen=True)
class Published:
    key: str
    source: str  # title
    url: str
    engine: str
    gpu: str  # our preset name
    tp: int
    model: str  # our preset name (or EXTRA_MODELS)
    precision: str  # bf16 | fp16 | fp8
    kind: str  # ttft_batch1 | ttft_burst | tpot_burst | static_batch | saturated
    metric: str  # what the number is
    unit: str  # ms | tok/s
    value: float
    isl: int = 0
    osl: int = 0
    batch: int = 0
    inputs: tuple[int, ...] = ()  # ttft_burst / tpot_burst: the prompts' lengths
    outputs: tuple[int, ...] = ()
    max_batch: int = 1024  # saturated: the engine's cap on running sequences
    tokens: str = "output"  # saturated: which tokens the throughput counts (output | total)
    per_gpu: bool = False  # the published figure is per GPU (else for all `tp` GPUs)
    note: str = ""
    outlier: str = ""  # why this row is outside what a roofline can say (kept in the table, out of the band)


def load(path=DATA) -> tuple[dict[str, ModelSpec], list[Published]]:
    """The architectures of the published runs' models that are not our presets, and the published rows (each
    row's `outlier` resolved to its reason)."""
    doc = json.loads(path.read_text())
    models = {name: ModelSpec(**spec) for name, spec in doc["models"].items()}
    reasons = {"": "", **doc["outlier_reasons"]}
    rows = [
        Published(
            **{
                **row,
                "inputs": tuple(row.get("inputs", ())),
                "outputs": tuple(row.get("outputs", ())),
                "outlier": reasons[row.get("outlier", "")],
            }
        )
        for row in doc["rows"]
    ]
    return models, rows


EXTRA_MODELS, PUBLISHED = load()


def model_spec(name: str, precision: str) -> ModelSpec:
    spec = MODELS.get(name) or EXTRA_MODELS[name]
    return replace(spec, weight_bytes=1) if precision == "fp8" else spec


def gpu_spec(name: str, precision: str) -> GpuSpec:
    gpu = GPUS[name]
    return replace(gpu, name=gpu.name + " (fp8)", bf16_tflops=gpu.bf16_tflops * 2) if precision == "fp8" else gpu


def roofline_for(p: Published) -> RooflineModel:
    return RooflineModel(gpu_spec(p.gpu, p.precision), model_spec(p.model, p.precision), tp=p.tp)


def kv_capacity_tokens(m: RooflineModel, fraction: float = 0.9) -> float:
    memory = m.gpu.memory_gib * 2**30 * fraction * m.tp
    return max(memory - m.model.weights_bytes, 0.0) / m.model.kv_bytes_per_token


def burst_tpot(m: RooflineModel, inputs: tuple[int, ...], outputs: tuple[int, ...]) -> float:
    """Median over requests of (their decode time) / (their output tokens - 1), decoding together."""
    contexts = [i + 1 for i in inputs]  # after prefill: prompt + first token
    left = [o - 1 for o in outputs]
    elapsed = [0.0] * len(inputs)
    while any(n > 0 for n in left):
        running = [k for k, n in enumerate(left) if n > 0]
        step = m.step_time(Batch(decode_contexts=tuple(contexts[k] for k in running)))
        for k in running:
            elapsed[k] += step
            contexts[k] += 1
            left[k] -= 1
    return statistics.median(elapsed[k] / (o - 1) for k, o in enumerate(outputs) if o > 1)


def static_batch_throughput(m: RooflineModel, batch: int, isl: int, osl: int) -> float:
    t = m.step_time(Batch(prefill=tuple((isl, 0) for _ in range(batch))))
    for i in range(1, osl):
        t += m.step_time(Batch(decode_contexts=(isl + i,) * batch))
    return batch * osl / t


def saturated_throughput(m: RooflineModel, isl: int, osl: int, max_batch: int, tokens: str) -> tuple[float, int]:
    b = int(min(max_batch, kv_capacity_tokens(m) // (isl + osl)))
    if b < 1:
        raise ValueError("not one sequence fits")
    decode = sum(m.step_time(Batch(decode_contexts=(isl + i,) * b)) for i in range(0, osl, max(osl // 16, 1)))
    decode *= osl / len(range(0, osl, max(osl // 16, 1)))
    prefill = b * m.step_time(Batch(prefill=((isl, 0),)))
    counted = osl if tokens == "output" else isl + osl
    return b * counted / (decode + prefill), b


def predict(p: Published) -> tuple[float, dict]:
    m = roofline_for(p)
    if p.kind == "ttft_batch1":
        return m.step_time(Batch(prefill=((p.isl, 0),))) * 1000, {}
    if p.kind == "ttft_burst":
        return m.step_time(Batch(prefill=tuple((n, 0) for n in p.inputs))) * 1000, {"prompt_tokens": sum(p.inputs)}
    if p.kind == "tpot_burst":
        return burst_tpot(m, p.inputs, p.outputs) * 1000, {}
    if p.kind == "static_batch":
        return static_batch_throughput(m, p.batch, p.isl, p.osl), {}
    if p.kind == "saturated":
        value, b = saturated_throughput(m, p.isl, p.osl, p.max_batch, p.tokens)
        return value, {"modelled_batch": b}
    raise ValueError(p.kind)


def rows() -> list[dict]:
    out = []
    for p in PUBLISHED:
        value, extra = predict(p)
        out.append(
            {
                "key": p.key,
                "source": p.source,
                "url": p.url,
                "engine": p.engine,
                "gpu": p.gpu,
                "tp": p.tp,
                "model": p.model,
                "precision": p.precision,
                "kind": p.kind,
                "metric": p.metric,
                "unit": p.unit,
                "published": p.value,
                "predicted": round(value, 2),
                "ratio": round(value / p.value, 3),
                "note": p.note,
                "outlier": p.outlier,
                **extra,
            }
        )
    return out


def summary(table: list[dict]) -> dict:
    """Over the rows not marked as outliers."""
    kept = [r for r in table if not r["outlier"]]
    by_kind: dict[str, list[float]] = {}
    for r in kept:
        by_kind.setdefault(r["kind"], []).append(r["ratio"])
    geo = {k: round(statistics.geometric_mean(v), 3) for k, v in by_kind.items()}
    overall = round(statistics.geometric_mean(r["ratio"] for r in kept), 3)
    return {
        "geomean_ratio_by_kind": geo,
        "geomean_ratio": overall,
        "min_ratio": min(r["ratio"] for r in kept),
        "max_ratio": max(r["ratio"] for r in kept),
        "rows": len(table),
        "outliers": len(table) - len(kept),
    }


def markdown(doc: dict) -> str:
    f = doc["factors"]
    s = doc["summary"]
    rows = [
        [
            r["engine"],
            f"{r['gpu']} × {r['tp']}",
            r["model"],
            r["precision"],
            r["metric"],
            f"{r['published']:,} {r['unit']}",
            f"{r['predicted']:,} {r['unit']}",
            f"{r['ratio']:.2f}{' (outlier¹)' if r['outlier'] else ''}",
            f"[{r['source']}]({r['url']})",
        ]
        for r in doc["rows"]
    ]
    outliers = [
        f"- {', '.join(r['key'] for r in doc['rows'] if r['outlier'] == reason)}: {reason}."
        for reason in dict.fromkeys(r["outlier"] for r in doc["rows"] if r["outlier"])
    ]
    by_kind = ", ".join(f"{k} {v:.2f}" for k, v in s["geomean_ratio_by_kind"].items())
    return (
        f"Roofline factors: MFU {f['mfu']}, MBU {f['mbu']}, {f['step_overhead_s'] * 1000:.1f} ms a step. "
        "Ratio = predicted / published (latency: >1 means the roofline is slower; throughput: >1 means it is "
        "faster).\n\n"
        + report.table(
            ["setup", "GPU × TP", "model", "precision", "metric", "published", "roofline", "ratio", "source"], rows
        )
        + f"\nGeometric mean of the ratio by kind: {by_kind}; overall {s['geomean_ratio']:.2f}; the "
        f"{s['rows'] - s['outliers']} rows not marked outlier lie within "
        f"{s['min_ratio']:.2f}–{s['max_ratio']:.2f}."
        "\n\n¹ Outliers (in the table, not in the band or the means):\n" + "".join(f"{o}\n" for o in outliers)
    )


def main() -> None:
    base = RooflineModel(GPUS["H100"], MODELS["llama-3.1-8b"])
    table = rows()
    doc = {
        "benchmark": "roofline_vs_published",
        "version": 1,
        "factors": {
            "mfu": base.mfu,
            "mbu": base.mbu,
            "step_overhead_s": base.step_overhead_s,
            "allreduce_s_per_layer": base.allreduce_s_per_layer,
        },
        "rows": table,
        "summary": summary(table),
    }
    report.write(launch.RESULTS / "roofline_vs_published.json", doc, markdown)


if __name__ == "__main__":
    main()
