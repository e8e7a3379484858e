"""Check `orchestrator bench` against an independent harness, NVIDIA's AIPerf.

Both drive the same server (our aggregated CPU app) with the same workload:
fixed ISL and OSL, random token prompts, ignore_eos, streaming, fixed
concurrency. They run alternately (ours, AIPerf, ours, AIPerf) so machine
drift hits both; TTFT, ITL and throughput are compared as ratios.

Definitions line up as follows: TTFT is the same on both sides; AIPerf's
"inter_token_latency" is per request (E2E - TTFT) / (output tokens - 1),
which is our TPOT, so TPOT is compared with it; throughput is output tokens
per second over the run.

AIPerf (PyPI `aiperf`) runs from its own environment under
~/.cache/orchestrator/peers/aiperf. Offline it needs the tokenizer in a
Hugging Face cache layout, which this script builds from the tiny model.
Writes benchmarks/results/aiperf_crosscheck.json.

    .venv/bin/python benchmarks/aiperf_crosscheck.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import peers  # noqa: E402
from harness.bench import hardware  # noqa: E402
from harness.metrics import summarize  # noqa: E402
from harness.runner import Target, run_concurrency  # noqa: E402
from harness.workloads import LengthDist, SyntheticWorkload, TokenPool  # noqa: E402
from orchestrator.prompts import load_tokenizer  # noqa: E402
from orchestrator.tiny_model import make_tiny_model  # noqa: E402

HF_REPO = "local/tiny-llama"
REVISION = "0" * 40


def hf_cache(home: Path) -> Path:
    """The tiny tokenizer as the Hugging Face hub cache lays out a repo."""
    repo = home / "hub" / ("models--" + HF_REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        src = peers.MODEL_DIR / name
        if src.exists():
            shutil.copy(src, snapshot / name)
    (snapshot / "config.json").write_text("{}")
    return home


def run_aiperf(python: Path, url: str, args, out_dir: Path, hf_home: Path) -> dict:
    aiperf = python.parent / "aiperf"
    cmd = [str(aiperf), "profile", "--model", "tiny-llama", "--url", url, "--endpoint-type", "completions",
           "--streaming", "--concurrency", str(args.concurrency), "--request-count", str(args.requests),
           "--synthetic-input-tokens-mean", str(args.isl), "--synthetic-input-tokens-stddev", "0",
           "--output-tokens-mean", str(args.osl), "--output-tokens-stddev", "0",
           "--extra-inputs", "ignore_eos:true", "--extra-inputs", "min_tokens:" + str(args.osl),
           "--tokenizer", HF_REPO, "--artifact-dir", str(out_dir), "--warmup-request-count", "4",
           # Count tokens from the server's usage, as our harness does: re-tokenizing the
           # streamed text with a 618-word vocabulary gives other counts than the ids generated.
           "--use-server-token-count"]
    env = {**os.environ, "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    found = next(out_dir.rglob("profile_export_aiperf.json"))
    data = json.loads(found.read_text())
    records = data.get("records", data)

    def metric(name: str, stat: str) -> float:
        return float(records[name][stat])

    return {
        "ttft_ms_p50": metric("time_to_first_token", "p50"),
        "ttft_ms_avg": metric("time_to_first_token", "avg"),
        "tpot_ms_p50": metric("inter_token_latency", "p50"),
        "tpot_ms_avg": metric("inter_token_latency", "avg"),
        "output_token_throughput": metric("output_token_throughput", "avg"),
        "request_throughput": metric("request_throughput", "avg"),
    }


def run_ours(url: str, args, pool: TokenPool, seed: int) -> dict:
    workload = SyntheticWorkload(LengthDist(args.isl), LengthDist(args.osl), pool, seed=seed)
    target = Target(url, "tiny-llama")
    asyncio.run(run_concurrency(target, workload.requests(4), 4))
    records, duration = asyncio.run(run_concurrency(target, workload.requests(4 + args.requests)[4:], args.concurrency))
    r = summarize(records, duration, [])
    tpots = [((x.e2e_s - x.ttft_s) / (x.output_tokens - 1)) * 1000 for x in records if x.ok and x.output_tokens > 1]
    return {
        "ttft_ms_p50": r.ttft_ms["p50"], "ttft_ms_avg": r.ttft_ms["mean"],
        "tpot_ms_p50": r.tpot_ms["p50"], "tpot_ms_avg": sum(tpots) / len(tpots),
        "output_token_throughput": r.output_token_throughput, "request_throughput": r.request_throughput,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--isl", type=int, default=256)
    p.add_argument("--osl", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "aiperf_crosscheck.json"))
    args = p.parse_args()
    make_tiny_model(peers.MODEL_DIR)
    python = peers.ensure_venv("aiperf", ["aiperf==0.13.0"], constrained=False)
    pool = TokenPool.vocabulary(len(load_tokenizer(str(peers.MODEL_DIR))))
    work = Path(args.out).with_suffix("")
    work.mkdir(parents=True, exist_ok=True)
    hf_home = hf_cache(work / "hf")
    rounds = []
    with peers.ours(peers.app_args("agg-cpu.yaml"), work / "server.log") as url:
        for i in range(args.rounds):
            ours = run_ours(url, args, pool, seed=i)
            theirs = run_aiperf(python, url, args, work / f"aiperf-{i}", hf_home)
            rounds.append({"ours": ours, "aiperf": theirs})
            print(json.dumps(rounds[-1], indent=1), flush=True)
    keys = rounds[0]["ours"].keys()
    mean = {side: {k: sum(r[side][k] for r in rounds) / len(rounds) for k in keys} for side in ("ours", "aiperf")}
    ratio = {k: mean["ours"][k] / mean["aiperf"][k] for k in keys}
    doc = {"benchmark": "aiperf_crosscheck", "version": 1, "hardware": hardware(),
           "workload": {"isl": args.isl, "osl": args.osl, "concurrency": args.concurrency, "requests": args.requests,
                        "prompts": "random token ids", "ignore_eos": True},
           "server": "ours, configs/agg-cpu.yaml", "rounds": rounds, "mean": mean, "ratio_ours_over_aiperf": ratio,
           "within_5_percent": {k: abs(v - 1) <= 0.05 for k, v in ratio.items()}}
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({"ratio": ratio, "within_5_percent": doc["within_5_percent"]}, indent=2))


if __name__ == "__main__":
    main()
