"""`orchestrator simulate`: the cluster simulator (orchestrator/sim/cluster.py)
driven by the same workloads and load modes as `orchestrator bench`, written
out in the same JSON / markdown / PNG format, in virtual time.

    orchestrator simulate --prefill 8 --decode 8 --gpu H100 --model llama-3.1-8b \\
        --workload mooncake --trace-path ../shared/traces/mooncake_conversation.jsonl \\
        --mode trace --num-requests 12031 --out results/sim.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import replace

from orchestrator.config import RoutingConfig, SimEngineConfig
from orchestrator.engines.sim_engine import kv_capacity_blocks, perf_model
from orchestrator.sim.cluster import ClusterSim, ClusterSpec, RequestOutcome
from orchestrator.sim.link import LINKS
from tools.bench import BenchRun, SweepPoint, SystemInfo, run_async, sweep_with, write_outputs
from tools.bench_cli import add_workload_arguments, make_workload, take_requests, token_pool
from tools.bench_stats import RunResult, parse_slo, summarize
from tools.client import RequestRecord
from tools.runner import poisson_offsets
from tools.workloads import RequestSpec, replay_offsets


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefill", type=int, default=0, help="prefill replicas (0: aggregated serving)")
    p.add_argument("--decode", type=int, default=1, help="decode (or aggregated) replicas")
    p.add_argument("--gpu", choices=["H100", "H200", "A100"], default="H100")
    p.add_argument("--sim-model", choices=["llama-3.1-8b", "llama-3.1-70b", "qwen3-32b"], default="llama-3.1-8b")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel GPUs per replica")
    p.add_argument("--profile", help="profile from `orchestrator profile` (replaces the roofline)")
    p.add_argument("--num-gpu-blocks", type=int, help="KV blocks per replica (default: from GPU memory)")
    p.add_argument("--link", choices=sorted(LINKS), default="infiniband")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--routing", choices=["kv_aware", "round_robin"], default="kv_aware")
    p.add_argument("--local-prefill-max-tokens", type=int, default=512)
    p.add_argument("--label", help="system label in the results")
    add_workload_arguments(p)
    p.set_defaults(vocab_size=32000)


def sim_engine_config(args: argparse.Namespace, **more) -> SimEngineConfig:
    """The simulated engine the command line names (--gpu, --sim-model, --tp, --profile, --num-gpu-blocks)."""
    return SimEngineConfig(
        kind="sim",
        gpu=args.gpu,
        model=args.sim_model,
        tensor_parallel_size=args.tp,
        profile=args.profile,
        num_gpu_blocks=args.num_gpu_blocks,
        **more,
    )


def cluster_spec(args: argparse.Namespace) -> tuple[ClusterSpec, SimEngineConfig]:
    engine = sim_engine_config(
        args,
        link=args.link,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
    )
    routing = RoutingConfig(policy=args.routing, local_prefill_max_tokens=args.local_prefill_max_tokens)
    blocks = kv_capacity_blocks(engine, perf_model(engine), args.block_size)
    spec = ClusterSpec(
        args.prefill, args.decode, blocks, args.block_size, args.max_num_seqs, args.max_num_batched_tokens, routing
    )
    return spec, engine


def to_record(o: RequestOutcome) -> RequestRecord:
    """An outcome as the harness would have recorded it over HTTP, one chunk per token."""
    return RequestRecord(
        ok=o.finished,
        start_s=o.arrival_s,
        ttft_s=o.ttft_s,
        itl_s=o.itl_s,
        e2e_s=o.e2e_s,
        output_tokens=len(o.token_times),
        prompt_tokens=o.prompt_tokens,
        cached_tokens=o.cached_tokens,
        error=None if o.finished else "unfinished",
    )


def as_records(outcomes: Sequence[RequestOutcome]) -> tuple[list[RequestRecord], float]:
    """The outcomes as the harness's records, and the run's duration (first arrival to last token)."""
    if not outcomes:
        return [], 0.0
    end = max((o.token_times[-1] for o in outcomes if o.token_times), default=0.0)
    return [to_record(o) for o in outcomes], end - min(o.arrival_s for o in outcomes)


def summarize_outcomes(outcomes: Sequence[RequestOutcome], slo) -> RunResult:
    return summarize(*as_records(outcomes), slo)


def simulate(
    spec: ClusterSpec, engine: SimEngineConfig, specs: Sequence[RequestSpec], seed: int, concurrency: int | None = None
) -> list[RequestOutcome]:
    sim = ClusterSim(spec, perf_model(engine), LINKS[engine.link], seed=seed)
    return sim.run_closed(specs, concurrency) if concurrency else sim.run(specs)


def run_simulation(args: argparse.Namespace) -> int:
    spec, engine = cluster_spec(args)
    workload = make_workload(args, token_pool(args, None))
    slo = parse_slo(args.slo)
    gpus = (spec.prefill_replicas + spec.decode_replicas) * engine.tensor_parallel_size
    label = args.label or f"sim {spec.prefill_replicas}P+{spec.decode_replicas}D {engine.gpu} {args.routing}"
    system = SystemInfo(
        label=label,
        model=engine.model,
        precision="bf16",
        engine="sim",
        engine_version="1",
        notes=f"{gpus} simulated {engine.gpu}; KV blocks/replica {spec.num_blocks}; link {engine.link}",
    )
    started = time.process_time()
    if args.mode == "concurrency":
        levels = [int(c) for c in args.concurrency.split(",")]
        per_point = (lambda c: args.requests_per_point) if args.requests_per_point else (lambda c: max(32, 4 * c))

        async def run_point(concurrency: int, specs: Sequence[RequestSpec]) -> RunResult:
            return summarize_outcomes(simulate(spec, engine, specs, args.seed, concurrency), slo)

        load = {
            "mode": "concurrency",
            "levels": levels,
            "requests_per_point": args.requests_per_point or "max(32, 4c)",
            "max_concurrency": args.max_concurrency,
        }
        run = BenchRun(system, workload.describe(), load, slo)
        run.points = run_async(
            sweep_with(
                run_point, lambda n, offset: take_requests(workload, n, offset), levels, per_point, args.max_concurrency
            )
        )
    else:
        specs = take_requests(workload, args.num_requests)
        if args.mode == "rate":
            if not args.rate:
                raise SystemExit("--rate is required for --mode rate")
            offsets = poisson_offsets(len(specs), args.rate, args.seed)
            load = {"mode": "rate", "rate": args.rate, "requests": len(specs)}
        else:
            offsets = replay_offsets(list(specs), args.time_scale, args.rate_scale)
            load = {
                "mode": "trace",
                "time_scale": args.time_scale,
                "rate_scale": args.rate_scale,
                "requests": len(specs),
            }
        timed = [replace(s, arrival_s=t) for s, t in zip(specs, offsets)]
        result = summarize_outcomes(simulate(spec, engine, timed, args.seed), slo)
        run = BenchRun(system, workload.describe(), load, slo, points=[SweepPoint(0, result)])
    cpu_s = time.process_time() - started
    run.load["simulator_cpu_s"] = round(cpu_s, 2)
    paths = write_outputs(run, args.out)
    knee = run.to_dict()["knee"]
    print(
        json.dumps(
            {
                "outputs": {k: str(v) for k, v in paths.items()},
                "simulator_cpu_s": round(cpu_s, 2),
                "knee_concurrency": knee and knee["concurrency"],
            },
            indent=2,
        )
    )
    return 0
