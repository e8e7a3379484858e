"""Arguments and entry of `orchestrator bench`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import httpx

from tools.bench import (
    DEFAULT_CONCURRENCY,
    BenchRun,
    SweepPoint,
    SystemInfo,
    run_async,
    run_rate,
    run_trace,
    sweep,
    warm_up,
    write_outputs,
)
from tools.bench_stats import parse_slo
from tools.runner import Target
from tools.workloads import AzureTrace, LengthDist, MooncakeTrace, SyntheticWorkload, TokenPool


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`orchestrator bench`: a server, and the workload and load to offer it."""
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", help="model name to send (default: the server's first /v1/models entry)")
    p.add_argument("--label", help="system label in the results (default: the URL)")
    p.add_argument("--engine", default="unknown")
    p.add_argument("--engine-version", default="unknown")
    p.add_argument("--precision", default="unknown")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--no-ignore-eos", action="store_true", help="let requests stop at EOS (lengths then vary)")
    p.add_argument(
        "--text-prompts",
        action="store_true",
        help="send prompts as text (needs --tokenizer; prompts use whole-word tokens that round-trip)",
    )
    add_workload_arguments(p)


def add_workload_arguments(p: argparse.ArgumentParser) -> None:
    """The workload and the load mode, shared by `bench` and `simulate`."""
    p.add_argument("--vocab-size", type=int, help="token ids are drawn below this")
    p.add_argument("--tokenizer", help="tokenizer directory to read the vocabulary size from")
    p.add_argument("--workload", choices=["synthetic", "mooncake", "azure"], default="synthetic")
    p.add_argument("--isl", type=int, default=256)
    p.add_argument("--isl-std", type=float, default=0.0)
    p.add_argument("--osl", type=int, default=64)
    p.add_argument("--osl-std", type=float, default=0.0)
    p.add_argument("--shared-prefix", type=float, default=0.0, help="fraction of each prompt from a shared prefix")
    p.add_argument("--num-prefixes", type=int, default=1)
    p.add_argument("--trace-path", help="trace file (mooncake .jsonl or azure .csv)")
    p.add_argument("--block-tokens", type=int, default=32, help="mooncake: tokens per hash id after scaling")
    p.add_argument("--isl-scale", type=float, default=1.0, help="azure: multiply prompt lengths")
    p.add_argument("--osl-scale", type=float, help="scale output lengths (mooncake default: the block scale)")
    p.add_argument("--max-isl", type=int)
    p.add_argument("--max-osl", type=int)
    p.add_argument("--mode", choices=["concurrency", "rate", "trace"], default="concurrency")
    p.add_argument("--concurrency", default=",".join(map(str, DEFAULT_CONCURRENCY)))
    p.add_argument("--max-concurrency", type=int, default=256)
    p.add_argument("--requests-per-point", type=int, help="default: max(32, 4 x concurrency)")
    p.add_argument("--rate", type=float, help="requests/s for --mode rate")
    p.add_argument("--num-requests", type=int, default=200, help="requests for --mode rate/trace")
    p.add_argument("--time-scale", type=float, default=1.0, help="trace: <1 replays faster")
    p.add_argument("--rate-scale", type=float, default=1.0, help="trace: >1 sends at a higher rate")
    p.add_argument("--slo", nargs="*", default=[], help="e.g. ttft_p99_ms=500 itl_p50_ms=30")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="result JSON path (a .md and .png are written beside it)")


def _tokenizer(args: argparse.Namespace):
    if not args.tokenizer:
        return None
    from orchestrator.prompts import load_tokenizer

    return load_tokenizer(str(Path(args.tokenizer).expanduser()))


def token_pool(args: argparse.Namespace, tokenizer) -> TokenPool:
    if getattr(args, "text_prompts", False):
        if tokenizer is None:
            raise SystemExit("--text-prompts needs --tokenizer")
        return TokenPool.words(tokenizer)
    if args.vocab_size:
        return TokenPool.vocabulary(args.vocab_size)
    if tokenizer is not None:
        return TokenPool.vocabulary(len(tokenizer))
    raise SystemExit("give --vocab-size or --tokenizer so that token ids stay in the vocabulary")


def make_workload(args: argparse.Namespace, pool: TokenPool):
    if args.workload == "synthetic":
        return SyntheticWorkload(
            isl=LengthDist(args.isl, args.isl_std, max=args.max_isl),
            osl=LengthDist(args.osl, args.osl_std, max=args.max_osl),
            pool=pool,
            shared_prefix_fraction=args.shared_prefix,
            num_prefixes=args.num_prefixes,
            seed=args.seed,
        )
    if not args.trace_path:
        raise SystemExit("--trace-path is required for trace workloads")
    if args.workload == "mooncake":
        return MooncakeTrace(
            args.trace_path,
            pool,
            block_tokens=args.block_tokens,
            osl_scale=args.osl_scale,
            max_osl=args.max_osl,
            max_isl=args.max_isl,
        )
    return AzureTrace(
        args.trace_path,
        pool,
        isl_scale=args.isl_scale,
        osl_scale=args.osl_scale or 1.0,
        max_isl=args.max_isl,
        max_osl=args.max_osl,
        seed=args.seed,
    )


def take_requests(workload, n: int, skip: int = 0):
    return workload.requests(skip + n)[skip:]


def _model(url: str) -> str:
    return httpx.get(f"{url.rstrip('/')}/v1/models", timeout=30).json()["data"][0]["id"]


def run_bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    tokenizer = _tokenizer(args)
    workload = make_workload(args, token_pool(args, tokenizer))
    model = args.model or _model(args.url)
    detokenize = (lambda ids: tokenizer.decode(list(ids))) if args.text_prompts else None
    target = Target(args.url, model, ignore_eos=not args.no_ignore_eos, detokenize=detokenize)
    slo = parse_slo(args.slo)
    system = SystemInfo(
        label=args.label or args.url,
        model=model,
        precision=args.precision,
        engine=args.engine,
        engine_version=args.engine_version,
    )
    warmups = take_requests(workload, args.warmup) if args.warmup else []
    run_async(warm_up(target, warmups))
    skip = len(warmups)
    bar = tqdm(unit="req", desc=args.mode)

    def progress(n: int):
        bar.total = (bar.total or 0) + n
        bar.refresh()
        return lambda: bar.update(1)

    if args.mode == "concurrency":
        levels = [int(c) for c in args.concurrency.split(",")]
        per_point = (lambda c: args.requests_per_point) if args.requests_per_point else (lambda c: max(32, 4 * c))
        load = {
            "mode": "concurrency",
            "levels": levels,
            "requests_per_point": args.requests_per_point or "max(32, 4c)",
            "max_concurrency": args.max_concurrency,
            "warmup": args.warmup,
        }
        run = BenchRun(system, workload.describe(), load, slo)
        run.points = run_async(
            sweep(
                target,
                lambda n, offset: take_requests(workload, n, skip + offset),
                levels,
                per_point,
                slo,
                args.max_concurrency,
                on_point=lambda p: bar.write(
                    f"concurrency {p.concurrency}: "
                    f"{p.result.request_throughput:.2f} req/s, goodput "
                    f"{p.result.goodput_requests:.2f}"
                ),
                progress=progress,
            )
        )
    else:
        specs = take_requests(workload, args.num_requests, skip)
        tick = progress(len(specs))
        if args.mode == "rate":
            if not args.rate:
                raise SystemExit("--rate is required for --mode rate")
            load = {"mode": "rate", "rate": args.rate, "requests": len(specs), "warmup": args.warmup}
            result = run_async(run_rate(target, specs, args.rate, slo, args.seed, tick))
        else:
            load = {
                "mode": "trace",
                "time_scale": args.time_scale,
                "rate_scale": args.rate_scale,
                "requests": len(specs),
                "warmup": args.warmup,
            }
            result = run_async(run_trace(target, specs, args.time_scale, args.rate_scale, slo, tick))
        run = BenchRun(system, workload.describe(), load, slo, points=[SweepPoint(0, result)])
    bar.close()
    paths = write_outputs(run, args.out)
    knee = run.to_dict()["knee"]
    print(
        json.dumps(
            {"outputs": {k: str(v) for k, v in paths.items()}, "knee_concurrency": knee and knee["concurrency"]},
            indent=2,
        )
    )
    return 0
