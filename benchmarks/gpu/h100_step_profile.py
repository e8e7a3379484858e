"""Ground truth for the simulator's H100 model (issue 40): a Llama-shaped decoder layer's prefill and
decode steps, the LM head with sampling, and KV block copies, timed on random bf16 weights with nothing
but PyTorch.

It needs only what the lent GPU machine has (PyTorch, no vLLM, no network, no model weights) and imports
nothing from this project, so it runs there from a bare copy of the tree:

    python3 benchmarks/gpu/h100_step_profile.py --out "$OUT"            # the H100 run, <= 8 min
    python3 benchmarks/gpu/h100_step_profile.py --device cpu --shapes tiny --out /tmp/p \
        --isl 16,48 --batch 1,2 --context 32,64 --chunk-tokens 32 --copy-blocks 1,4   # CI: it runs; no timing claim

What is timed (median of `--repeats` after `--warmup`, CUDA events on a GPU, the wall clock on CPU):
  layer prefill  one prompt of ISL tokens through one decoder layer (RMSNorm, QKV, RoPE, causal attention
                 by PyTorch's scaled-dot-product attention, whichever backend it picks, output projection,
                 RMSNorm, SwiGLU MLP); prompts longer than `--chunk-tokens` (vLLM's default on an H100
                 server, 8192) as the chunks vLLM runs, each attending to the chunks before it
  layer decode   B sequences of context C each adding one token: its K/V written into the cache, attention
                 over C + 1 positions read from a contiguous per-sequence cache (what a paged kernel such as
                 FlashAttention's with a block table approaches); `paged` also reads it from a paged cache
                 ([blocks, kv heads, block, head dim], a shuffled block table) by gathering the sequence's
                 blocks first, an upper bound recorded beside it
  lm head        final RMSNorm, logits of S sequences' last tokens (fp32), softmax and one sample each
  kv copies      blocks of one layer's K and V at the engine's block size (16): device to device between
                 shuffled block slots, device to pinned host and back, as GB/s
Layer steps run as CUDA graphs when capture works (vLLM runs decode, and prompt chunks up to 512 tokens,
as graphs), else eagerly; the raw points say which.

The whole model's step is layers x the layer step + the LM head: `profile-<shape>.json` in the
simulator's profile format (`orchestrator-profile/1`, loaded by `ProfileModel.load`), beside the raw
points (`raw.jsonl`, one line per point as measured, and `raw.json`). Not in these times: the engine's
host work between steps (scheduling, input preparation; the roofline's `step_overhead_s`) and, for the
TP-4 shard of the 70B model, the all-reduces between GPUs (one GPU here). Each shape runs in its own
process against a shared deadline (`--time-limit-s`): a point that fails is recorded as failed, a
process that dies or runs out of time loses only its remaining points, and whatever was measured is
written. `benchmarks/roofline_vs_measured.py` sets the roofline beside the profile.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SCHEMA = "orchestrator-profile/1"
BLOCK_SIZE = 16  # vLLM's default KV block on CUDA
GRAPH_MAX_TOKENS = 512  # vLLM's largest CUDA-graph capture size


@dataclass(frozen=True)
class Shape:
    """One GPU's share of a Llama-architecture model (`tp` > 1: the shard of one of `tp` GPUs)."""

    name: str
    sim_model: str | None  # the simulator's preset of the whole model (orchestrator/sim/perf_model.py MODELS)
    hf_name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tp: int = 1

    @property
    def kv_bytes_per_token_all_gpus(self) -> int:
        """The whole model's K and V per token in bf16, as the simulator counts it (all shards)."""
        return 2 * self.layers * self.kv_heads * self.tp * self.head_dim * 2

    @property
    def layer_params(self) -> int:
        attention = self.hidden * (self.q_heads + 2 * self.kv_heads) * self.head_dim
        attention += self.q_heads * self.head_dim * self.hidden
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden


SHAPES = {
    "llama-3.1-8b": Shape(
        "llama-3.1-8b", "llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct", 32, 4096, 32, 8, 128, 14336, 128256
    ),
    # One GPU's shard at TP 4: heads, MLP and vocabulary split four ways (vLLM's column/row parallel layers).
    "llama-3.1-70b-tp4": Shape(
        "llama-3.1-70b-tp4",
        "llama-3.1-70b",
        "meta-llama/Llama-3.1-70B-Instruct",
        80,
        8192,
        16,
        2,
        128,
        7168,
        32064,
        tp=4,
    ),
    "tiny": Shape("tiny", None, "tiny-llama (random)", 2, 64, 4, 2, 16, 128, 256),
}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="folder for raw.jsonl, raw.json and profile-<shape>.json")
    p.add_argument("--device", default="cuda", help="cuda | cpu")
    p.add_argument("--shapes", default="llama-3.1-8b,llama-3.1-70b-tp4", help=f"of {', '.join(SHAPES)}")
    p.add_argument("--isl", default="128,256,512,1024,2048,4096,8192,16384")
    p.add_argument("--batch", default="1,2,4,8,16,32,64,128,256")
    p.add_argument("--context", default="1024,2048,4096,8192")
    p.add_argument("--chunk-tokens", type=int, default=8192, help="vLLM's max_num_batched_tokens on an H100 server")
    p.add_argument("--copy-blocks", default="1,16,256,4096", help="KV blocks per copy")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--no-graphs", action="store_true", help="time every step eagerly")
    p.add_argument("--time-limit-s", type=float, default=450.0, help="the whole run, shapes and copies")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--child", help=argparse.SUPPRESS)  # a shape's name, or 'copies': run that part only
    p.add_argument("--deadline", type=float, help=argparse.SUPPRESS)  # epoch seconds, set by the parent
    return p.parse_args(argv)


# --------------------------------------------------------------------------------------------- the parent


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return run_child(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    raw_lines = out / "raw.jsonl"
    raw_lines.unlink(missing_ok=True)
    started = time.time()
    deadline = started + args.time_limit_s
    parts = [*(s for s in args.shapes.split(",") if s), "copies"]
    unknown = [s for s in parts if s != "copies" and s not in SHAPES]
    if unknown:
        raise SystemExit(f"unknown shape(s) {unknown}; known: {', '.join(SHAPES)}")
    outcomes = {}
    for part in parts:
        outcomes[part] = run_part(part, argv if argv is not None else sys.argv[1:], deadline)
    points = read_points(raw_lines)
    document = {
        "benchmark": "h100_step_profile",
        "started_at": started,
        "seconds": time.time() - started,
        "args": {k: v for k, v in vars(args).items() if k not in ("child", "deadline")},
        "parts": outcomes,
        "points": points,
    }
    (out / "raw.json").write_text(json.dumps(document, indent=1))
    written = []
    for name in (s for s in parts if s != "copies"):
        profile = build_profile(SHAPES[name], [p for p in points if p.get("shape") == name], args)
        if profile is not None:
            path = out / f"profile-{name}.json"
            path.write_text(json.dumps(profile, indent=1))
            written.append(str(path))
    print(json.dumps({"parts": outcomes, "profiles": written, "seconds": round(document["seconds"], 1)}))
    return 0 if written else 1


def run_part(part: str, argv: list[str], deadline: float) -> dict:
    """One part in its own process (a CUDA error or a crash costs that part only), killed at the deadline."""
    left = deadline - time.time()
    if left < 5:
        return {"status": "skipped: no time left"}
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--child", part, "--deadline", str(deadline)]
    begun = time.time()
    try:
        rc = subprocess.run(cmd, timeout=left).returncode
        status = "ok" if rc == 0 else f"exit {rc}"
    except subprocess.TimeoutExpired:
        status = "killed at the time limit"
    return {"status": status, "seconds": round(time.time() - begun, 1)}


def read_points(path: Path) -> list[dict]:
    if not path.exists():
        return []
    points = []
    for line in path.read_text().splitlines():
        try:
            points.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by a kill
            continue
    return points


def build_profile(shape: Shape, points: list[dict], args: argparse.Namespace) -> dict | None:
    """The whole model's step times from one layer's: layers x layer + the LM head of the step's sequences.

    prefill[tokens]            sum over the prompt's chunks of a chunk's layer time x layers, + LM head(1)
    decode[batch, context]     layer decode time x layers + LM head(batch)
    """
    ok = [p for p in points if "seconds" in p]
    lm_head = {p["sequences"]: p["seconds"] for p in ok if p["kind"] == "lm_head"}
    if not lm_head:
        return None
    chunks = {(p["tokens"], p["context"]): p["seconds"] for p in ok if p["kind"] == "layer_prefill"}
    prefill = []
    for isl in _ints(args.isl):
        parts = prompt_chunks(isl, args.chunk_tokens)
        if all(c in chunks for c in parts):
            seconds = shape.layers * sum(chunks[c] for c in parts) + _nearest(lm_head, 1)
            prefill.append({"tokens": isl, "seconds": seconds, "tokens_per_s": isl / seconds, "chunks": len(parts)})
    decode = []
    for p in ok:
        if p["kind"] == "layer_decode" and p["layout"] == "contiguous":
            seconds = shape.layers * p["seconds"] + _nearest(lm_head, p["batch"])
            decode.append(
                {
                    "batch": p["batch"],
                    "context": p["context"],
                    "step_seconds": seconds,
                    "tokens_per_s": p["batch"] / seconds,
                }
            )
    if not prefill and not decode:
        return None
    env = next((p for p in points if p["kind"] == "environment"), {})
    return {
        "schema": SCHEMA,
        "created_at": time.time(),
        "meta": {
            "model": shape.hf_name,
            "sim_model": shape.sim_model,
            "shape": asdict(shape),
            "dtype": "bfloat16",
            "engine": "pytorch decoder layers (random weights; benchmarks/gpu/h100_step_profile.py)",
            "engine_version": env.get("torch"),
            "hardware": {"gpu": env.get("gpu"), "device": env.get("device"), "cpu_threads": env.get("cpu_threads")},
            "tensor_parallel_size": shape.tp,
            "block_size": BLOCK_SIZE,
            "kv_capacity_tokens": None,
            "served": False,
            "measured": (
                "GPU time of layers x one layer's step + the LM head with sampling; excludes the engine's host work "
                "between steps" + (" and the all-reduces between the TP shards (one GPU)" if shape.tp > 1 else "")
            ),
            "chunk_tokens": args.chunk_tokens,
        },
        "kv_bytes_per_token": shape.kv_bytes_per_token_all_gpus,
        "prefill": prefill,
        "prefill_batch": [],
        "decode": sorted(decode, key=lambda d: (d["batch"], d["context"])),
        "mixed": [],
    }


def prompt_chunks(isl: int, chunk: int) -> list[tuple[int, int]]:
    """(new tokens, context before them) of each step vLLM's chunked prefill runs for one prompt."""
    return [(min(chunk, isl - start), start) for start in range(0, isl, chunk)]


def _nearest(table: dict[int, float], key: int) -> float:
    return table[min(table, key=lambda k: (abs(k - key), k))]


# ---------------------------------------------------------------------------------------------- a child


def run_child(args: argparse.Namespace) -> int:
    import torch

    device = torch.device(args.device)
    out = Path(args.out) / "raw.jsonl"
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    bench = Bench(torch, device, args, out)
    bench.emit(
        {
            "kind": "environment",
            "shape": args.child,
            "torch": torch.__version__,
            "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "cpu_threads": torch.get_num_threads(),
            "graphs": bench.graphs,
        }
    )
    if args.child == "copies":
        shape = SHAPES[next(s for s in args.shapes.split(",") if s)]
        KvCopies(bench, shape).run(_ints(args.copy_blocks))
        return 0
    shape = SHAPES[args.child]
    layer = DecoderLayer(torch, shape, device)
    for sequences in sorted({1, *_ints(args.batch)}):
        bench.point(
            {"shape": shape.name, "kind": "lm_head", "sequences": sequences}, lambda s=sequences: layer.lm_head_step(s)
        )
    for batch in _ints(args.batch):  # decode first: the points that matter most are batch 8-128
        for context in _ints(args.context):
            for layout in ("contiguous", "paged"):
                key = {
                    "shape": shape.name,
                    "kind": "layer_decode",
                    "batch": batch,
                    "context": context,
                    "layout": layout,
                }
                bench.point(key, lambda b=batch, c=context, lay=layout: layer.decode_step(b, c, lay))
    steps = sorted({c for isl in _ints(args.isl) for c in prompt_chunks(isl, args.chunk_tokens)})
    for tokens, context in steps:
        key = {"shape": shape.name, "kind": "layer_prefill", "tokens": tokens, "context": context}
        bench.point(key, lambda t=tokens, c=context: layer.prefill_step(t, c))
    return 0


class Bench:
    """Times a step and writes each point as one JSON line at once; past the deadline it records the point as
    skipped. A step is built by a callable returning (the function to time, whether it may run as a graph)."""

    def __init__(self, torch, device, args: argparse.Namespace, out: Path):
        self.torch, self.device, self.args, self.out = torch, device, args, out
        self.graphs = device.type == "cuda" and not args.no_graphs and self._graphs_work()

    def emit(self, record: dict) -> None:
        with self.out.open("a") as f:
            f.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)

    def point(self, key: dict, build) -> None:
        if self.args.deadline and time.time() > self.args.deadline - 3:
            self.emit({**key, "skipped": "time limit"})
            return
        try:
            step, graphable = build()
            seconds, graphed = self.time(step, graphable)
            self.emit({**key, "seconds": seconds, "graph": graphed})
        except Exception as e:  # recorded, never fatal: the other points still run
            self.emit({**key, "error": f"{type(e).__name__}: {e}"[:300]})
        finally:
            if self.device.type == "cuda":
                self.torch.cuda.empty_cache()

    def time(self, step, graphable: bool) -> tuple[float, bool]:
        if self.graphs and graphable:
            graph = self._capture(step)
            if graph is not None:
                return self._median(graph.replay), True
        return self._median(step), False

    def _median(self, fn) -> float:
        torch = self.torch
        for _ in range(self.args.warmup):
            fn()
        times = []
        if self.device.type == "cuda":
            for _ in range(self.args.repeats):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1000)
        else:
            for _ in range(self.args.repeats):
                begun = time.perf_counter()
                fn()
                times.append(time.perf_counter() - begun)
        return statistics.median(times)

    def _capture(self, step):
        torch = self.torch
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
            return graph
        except Exception:
            torch.cuda.synchronize()
            return None

    def _graphs_work(self) -> bool:
        torch = self.torch
        try:
            a = torch.ones(64, 64, device=self.device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                b = a @ a
            graph.replay()
            torch.cuda.synchronize()
            return bool(b[0, 0].item() == 64)
        except Exception:
            return False


class DecoderLayer:
    """One Llama decoder layer and the LM head, random bf16 weights (bf16 on CPU too)."""

    def __init__(self, torch, shape: Shape, device):
        self.torch, self.shape, self.device = torch, shape, device
        self.dtype = torch.bfloat16
        s = shape

        def weight(*size):
            return torch.randn(*size, device=device, dtype=self.dtype) * 0.02

        self.wqkv = weight(s.hidden, (s.q_heads + 2 * s.kv_heads) * s.head_dim)
        self.wo = weight(s.q_heads * s.head_dim, s.hidden)
        self.wgu = weight(s.hidden, 2 * s.intermediate)
        self.wd = weight(s.intermediate, s.hidden)
        self.ln1 = torch.ones(s.hidden, device=device, dtype=self.dtype)
        self.ln2 = torch.ones(s.hidden, device=device, dtype=self.dtype)
        self.final_ln = torch.ones(s.hidden, device=device, dtype=self.dtype)
        self.lm = weight(s.hidden, s.vocab)
        self._rope: dict[int, tuple] = {}

    # -- building blocks

    def _rms(self, x, w):
        return self.torch.nn.functional.rms_norm(x, (x.shape[-1],), w, 1e-5)

    def _rope_tables(self, positions: int):
        if positions not in self._rope:
            torch, d = self.torch, self.shape.head_dim
            inv = 1.0 / (500000.0 ** (torch.arange(0, d, 2, device=self.device, dtype=torch.float32) / d))
            angles = torch.outer(torch.arange(positions, device=self.device, dtype=torch.float32), inv)
            self._rope = {positions: (angles.cos().to(self.dtype), angles.sin().to(self.dtype))}
        return self._rope[positions]

    def _rotate(self, x, cos, sin):  # x [T, heads, d]; cos/sin [T, d/2]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        cos, sin = cos[:, None, :], sin[:, None, :]
        return self.torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    def _qkv(self, x, cos, sin):
        s = self.shape
        t = x.shape[0]
        q, k, v = (self._rms(x, self.ln1) @ self.wqkv).split(
            [s.q_heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], dim=-1
        )
        q = self._rotate(q.view(t, s.q_heads, s.head_dim), cos, sin)
        k = self._rotate(k.view(t, s.kv_heads, s.head_dim), cos, sin)
        return q, k, v.view(t, s.kv_heads, s.head_dim)

    def _finish(self, x, attention):
        x = x + attention @ self.wo
        g, u = (self._rms(x, self.ln2) @ self.wgu).chunk(2, dim=-1)
        return x + (self.torch.nn.functional.silu(g) * u) @ self.wd

    # -- the timed steps: each builds its inputs and returns (the step, its new tokens)

    def prefill_step(self, tokens: int, context: int):
        """One prompt chunk of `tokens` on top of `context` cached tokens: its K/V written into the cache
        ([1, kv heads, context + tokens, d]), causal attention lower-right aligned."""
        torch, s = self.torch, self.shape
        total = context + tokens
        cos, sin = self._rope_tables(total)
        cos, sin = cos[context:], sin[context:]
        x = torch.randn(tokens, s.hidden, device=self.device, dtype=self.dtype)
        k_cache = torch.randn(1, s.kv_heads, total, s.head_dim, device=self.device, dtype=self.dtype)
        v_cache = torch.randn_like(k_cache)
        attend = self._causal_attention(tokens, total)

        def step():
            q, k, v = self._qkv(x, cos, sin)
            k_cache[0, :, context:] = k.transpose(0, 1)
            v_cache[0, :, context:] = v.transpose(0, 1)
            a = attend(q.transpose(0, 1)[None], k_cache, v_cache)
            return self._finish(x, a[0].transpose(0, 1).reshape(tokens, s.q_heads * s.head_dim))

        return step, tokens <= GRAPH_MAX_TOKENS

    def _causal_attention(self, tokens: int, total: int):
        """SDPA with grouped K/V heads and a lower-right causal mask; where this PyTorch lacks either,
        the heads repeated and the mask built (checked once on the real inputs' shapes)."""
        torch = self.torch
        F = torch.nn.functional
        group = self.shape.q_heads // self.shape.kv_heads

        def native(q, k, v):
            if tokens == total:
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            from torch.nn.attention.bias import causal_lower_right

            return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(tokens, total), enable_gqa=True)

        mask = None

        def fallback(q, k, v):
            nonlocal mask
            if mask is None:
                mask = torch.ones(tokens, total, device=self.device, dtype=torch.bool).tril(total - tokens)
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        probe = [
            torch.randn(1, self.shape.q_heads, tokens, self.shape.head_dim, device=self.device, dtype=self.dtype),
            torch.randn(1, self.shape.kv_heads, total, self.shape.head_dim, device=self.device, dtype=self.dtype),
        ]
        try:
            native(probe[0], probe[1], probe[1])
            return native
        except Exception:
            return fallback

    def decode_step(self, batch: int, context: int, layout: str):
        """`batch` sequences of `context` cached tokens each adding one. GQA folded into the query length
        (a decode query is one position, so a K/V head's `group` query heads are its `group` queries)."""
        torch, s = self.torch, self.shape
        F = torch.nn.functional
        group = s.q_heads // s.kv_heads
        total = context + 1
        cos, sin = self._rope_tables(total)
        cos, sin = cos[context:total].expand(batch, -1), sin[context:total].expand(batch, -1)
        x = torch.randn(batch, s.hidden, device=self.device, dtype=self.dtype)
        if layout == "contiguous":
            k_cache = torch.randn(batch, s.kv_heads, total, s.head_dim, device=self.device, dtype=self.dtype)
            v_cache = torch.randn_like(k_cache)

            def read(k, v):
                k_cache[:, :, context] = k
                v_cache[:, :, context] = v
                return k_cache, v_cache
        else:
            blocks_per_seq = -(-total // BLOCK_SIZE)
            order = list(range(batch * blocks_per_seq))
            random.shuffle(order)
            table = torch.tensor(order, device=self.device).view(batch, blocks_per_seq)
            k_pages = torch.randn(
                batch * blocks_per_seq, s.kv_heads, BLOCK_SIZE, s.head_dim, device=self.device, dtype=self.dtype
            )
            v_pages = torch.randn_like(k_pages)
            slot_block, slot_offset = table[:, context // BLOCK_SIZE], context % BLOCK_SIZE

            def gather(pages):
                seq = pages[table]  # [batch, blocks, kv heads, block, d]
                seq = seq.permute(0, 2, 1, 3, 4).reshape(batch, s.kv_heads, blocks_per_seq * BLOCK_SIZE, s.head_dim)
                return seq[:, :, :total]

            def read(k, v):
                k_pages[slot_block, :, slot_offset] = k
                v_pages[slot_block, :, slot_offset] = v
                return gather(k_pages), gather(v_pages)

        def step():
            q, k, v = self._qkv(x, cos, sin)
            keys, values = read(k, v)
            a = F.scaled_dot_product_attention(q.view(batch, s.kv_heads, group, s.head_dim), keys, values)
            return self._finish(x, a.reshape(batch, s.q_heads * s.head_dim))

        return step, batch <= GRAPH_MAX_TOKENS

    def lm_head_step(self, sequences: int):
        """The last hidden state of each sequence to one sampled token: RMSNorm, logits in fp32, softmax,
        a multinomial draw (vLLM's sampler, without its penalties and top-k/top-p). Eager: a failed capture of
        the draw would cost the shape's later points."""
        torch = self.torch
        x = torch.randn(sequences, self.shape.hidden, device=self.device, dtype=self.dtype)

        def step():
            logits = (self._rms(x, self.final_ln) @ self.lm).float()
            return torch.multinomial(torch.softmax(logits, dim=-1), 1)

        return step, False


class KvCopies:
    """Copies of one layer's K and V blocks ([blocks, kv heads, block, d] each, bf16) at the engine's block
    size: device to device between shuffled slots (what a local KV move or a same-GPU NIXL loopback
    bounds), device to pinned host and pinned host to device (CPU offload, a host-staged transfer)."""

    def __init__(self, bench: Bench, shape: Shape):
        self.bench, self.shape = bench, shape
        self.block_bytes = 2 * shape.kv_heads * BLOCK_SIZE * shape.head_dim * 2  # K and V, bf16

    def run(self, counts: list[int]) -> None:
        for blocks in counts:
            for direction in ("d2d", "d2h", "h2d"):
                key = {
                    "shape": self.shape.name,
                    "kind": "kv_copy",
                    "direction": direction,
                    "blocks": blocks,
                    "bytes": blocks * self.block_bytes,
                }
                self.bench.point(key, lambda n=blocks, d=direction: self._copy(n, d))
        for p in read_points(self.bench.out):
            if p.get("kind") == "kv_copy" and "seconds" in p and p["seconds"] > 0:
                print(f"kv copy {p['direction']} {p['blocks']} blocks: {p['bytes'] / p['seconds'] / 1e9:.1f} GB/s")

    def _copy(self, blocks: int, direction: str):
        torch, bench = self.bench.torch, self.bench
        s = self.shape
        row = 2 * s.kv_heads * BLOCK_SIZE * s.head_dim  # elements of a block's K and V
        pool = 2 * blocks
        cuda = bench.device.type == "cuda"
        if direction == "d2d":
            src = torch.randn(pool, row, device=bench.device, dtype=torch.bfloat16)
            dst = torch.empty_like(src)
            order = torch.randperm(pool, device=bench.device)
            from_slots, to_slots = order[:blocks], order[blocks:]

            def step():
                dst.index_copy_(0, to_slots, src.index_select(0, from_slots))

            return step, False
        device_side = torch.randn(blocks, row, device=bench.device, dtype=torch.bfloat16)
        host_side = torch.empty(blocks, row, dtype=torch.bfloat16, pin_memory=cuda)
        if direction == "d2h":
            return (lambda: host_side.copy_(device_side, non_blocking=True)), False
        host_side.normal_()
        return (lambda: device_side.copy_(host_side, non_blocking=True)), False


if __name__ == "__main__":
    sys.exit(main())
