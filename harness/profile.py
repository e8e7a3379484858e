"""`orchestrator profile`: measure one engine configuration, in process,
through the same `Engine` interface the pools use (real vLLM, or simulated).

    prefill  batch 1, unique prompts of each ISL in the grid, max_tokens 1:
             TTFT = time to the first token (median of `repeats`)
    prefill batches  k unique prompts of n tokens submitted together
             (`--prefill-batch`, k x n within one step's token budget):
             time until the last first token; with the batch-1 times this
             gives the step's fixed cost, paid once for all k
    decode   `batch` requests with `context`-token prompts decoding together:
             step time = median gap between a request's tokens once all of
             them are decoding (prefill steps excluded), per (batch, context)
             with batch x (context + output) within the KV capacity

Writes a versioned profile (`orchestrator-profile/1`: model, engine and
version, hardware, parallelism, block size, KV capacity, raw points) that
the simulated engine (`engine.profile`) and the planner load, and a plot.

    orchestrator profile --config configs/agg-cpu.yaml --out profiles/tiny-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from harness.bench import hardware
from orchestrator.config import AppConfig, load_app_config
from orchestrator.engines import create_engine, process_env
from orchestrator.engines.base import Engine, EngineInfo, EngineRole
from orchestrator.requests import EngineRequest, SamplingSpec

SCHEMA = "orchestrator-profile/1"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="a Serve config; its decode pool's engine is profiled")
    p.add_argument("--pool", choices=["decode_pool", "prefill_pool"], default="decode_pool")
    p.add_argument("--model-dir", help="override model.source (e.g. the tiny model's directory)")
    p.add_argument("--isl", default="128,256,512,1024,2048", help="prefill grid (prompt tokens)")
    p.add_argument("--batch", default="1,2,4,8,16", help="decode grid (concurrent sequences)")
    p.add_argument("--context", default="128,512,1024", help="decode grid (prompt tokens per sequence)")
    p.add_argument("--prefill-batch", default="2x256,4x256,4x512,2x1024",
                   help="prompts submitted together, KxN (K prompts of N tokens): the step's fixed cost")
    p.add_argument("--decode-tokens", type=int, default=32, help="output tokens per decode measurement")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)


class _Prompts:
    """Unique random prompts (no prefix-cache hits between measurements)."""

    def __init__(self, vocab_size: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.vocab_size = vocab_size
        self.count = 0

    def request(self, tokens: int, max_tokens: int) -> EngineRequest:
        self.count += 1
        ids = tuple(self.rng.randrange(10, self.vocab_size) for _ in range(tokens))
        return EngineRequest(f"profile-{self.count}", ids, SamplingSpec(max_tokens=max_tokens, temperature=0.0,
                                                                       ignore_eos=True))


async def _token_times(engine: Engine, request: EngineRequest) -> list[float]:
    times = []
    async for chunk in engine.generate(request):
        times.extend([time.perf_counter()] * len(chunk.token_ids))
    return times


async def measure_prefill(engine: Engine, prompts: _Prompts, isl: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        await _token_times(engine, prompts.request(isl, 1))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


async def measure_prefill_batch(engine: Engine, prompts: _Prompts, batch: int, isl: int, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        await asyncio.gather(*(_token_times(engine, prompts.request(isl, 1)) for _ in range(batch)))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


async def measure_decode(engine: Engine, prompts: _Prompts, batch: int, context: int, tokens: int) -> float:
    runs = await asyncio.gather(*(_token_times(engine, prompts.request(context, tokens)) for _ in range(batch)))
    all_decoding = max(t[0] for t in runs)  # every sequence has its prompt done
    gaps = [b - a for t in runs for a, b in zip(t, t[1:]) if a >= all_decoding]
    return statistics.median(gaps) if gaps else float("nan")


def kv_bytes_per_token(app: AppConfig, info: EngineInfo) -> int:
    """As the engine reports it, or from the model's config.json."""
    if info.kv_bytes_per_token:
        return info.kv_bytes_per_token
    config = json.loads((Path(app.model.weights_source) / "config.json").read_text())
    heads = config.get("num_key_value_heads", config["num_attention_heads"])
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    dtype_bytes = {"float32": 4, "bfloat16": 2, "float16": 2}.get(app.model.dtype, 2)
    return 2 * config["num_hidden_layers"] * heads * head_dim * dtype_bytes


async def profile(app: AppConfig, pool_name: str, args: argparse.Namespace) -> dict[str, Any]:
    pool = getattr(app, pool_name)
    os.environ.update(process_env(app, pool))
    engine = create_engine(app, pool, EngineRole.AGGREGATED, "127.0.0.1")
    info = await engine.start()
    try:
        from orchestrator.prompts import load_tokenizer

        vocab = len(await asyncio.to_thread(load_tokenizer, app.model.tokenizer_source))
        prompts = _Prompts(vocab, args.seed)
        capacity_tokens = (info.kv_capacity_blocks or 0) * info.block_size
        await measure_prefill(engine, prompts, 64, 2)  # warm-up
        prefill = []
        for isl in (int(x) for x in args.isl.split(",")):
            if isl >= app.model.max_model_len:
                continue
            seconds = await measure_prefill(engine, prompts, isl, args.repeats)
            prefill.append({"tokens": isl, "seconds": seconds, "tokens_per_s": isl / seconds})
            print(f"prefill {isl}: {seconds * 1000:.1f} ms", flush=True)
        prefill_batch = []
        for item in filter(None, args.prefill_batch.split(",")):
            k, n = (int(x) for x in item.lower().split("x"))
            if n >= app.model.max_model_len:
                continue
            seconds = await measure_prefill_batch(engine, prompts, k, n, args.repeats)
            prefill_batch.append({"batch": k, "tokens": n, "seconds": seconds})
            print(f"prefill {k} x {n}: {seconds * 1000:.1f} ms", flush=True)
        decode = []
        for context in (int(x) for x in args.context.split(",")):
            for batch in (int(x) for x in args.batch.split(",")):
                if capacity_tokens and batch * (context + args.decode_tokens + info.block_size) > capacity_tokens:
                    continue
                step = await measure_decode(engine, prompts, batch, context, args.decode_tokens)
                decode.append({"batch": batch, "context": context, "step_seconds": step, "tokens_per_s": batch / step})
                print(f"decode batch {batch} context {context}: {step * 1000:.2f} ms/step", flush=True)
        return {
            "schema": SCHEMA,
            "created_at": time.time(),
            "meta": {"model": app.model.name, "model_source": app.model.source, "dtype": app.model.dtype,
                     "engine": info.engine_kind, "engine_version": info.engine_version,
                     "engine_config": pool.engine.model_dump(mode="json"), "hardware": hardware(),
                     "tensor_parallel_size": getattr(pool.engine, "tensor_parallel_size", 1),
                     "block_size": info.block_size, "kv_capacity_tokens": capacity_tokens},
            "kv_bytes_per_token": kv_bytes_per_token(app, info),
            "prefill": prefill,
            "prefill_batch": prefill_batch,
            "decode": decode,
        }
    finally:
        engine.shutdown()


def plot_profile(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_p, ax_d) = plt.subplots(1, 2, figsize=(12, 4.5))
    ax_p.plot([p["tokens"] for p in doc["prefill"]], [p["seconds"] * 1000 for p in doc["prefill"]], "o-")
    ax_p.set_xlabel("prompt tokens (batch 1)")
    ax_p.set_ylabel("TTFT, ms")
    ax_p.set_title("prefill")
    for context in sorted({p["context"] for p in doc["decode"]}):
        points = [p for p in doc["decode"] if p["context"] == context]
        ax_d.plot([p["batch"] for p in points], [p["step_seconds"] * 1000 for p in points], "o-",
                  label=f"context {context}")
    ax_d.set_xlabel("concurrent sequences")
    ax_d.set_ylabel("ITL (decode step), ms")
    ax_d.set_title("decode")
    ax_d.legend()
    for ax in (ax_p, ax_d):
        ax.grid(alpha=0.3)
    meta = doc["meta"]
    fig.suptitle(f"{meta['model']} on {meta['engine']} {meta['engine_version']} ({meta['hardware'].get('cpu')})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_profile(args: argparse.Namespace) -> int:
    app = load_app_config(args.config)
    if args.model_dir:
        app = app.model_copy(update={"model": app.model.model_copy(update={"source": args.model_dir})})
    doc = asyncio.run(profile(app, args.pool, args))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    plot_profile(doc, out.with_suffix(".png"))
    print(json.dumps({"profile": str(out), "plot": str(out.with_suffix(".png"))}))
    return 0
