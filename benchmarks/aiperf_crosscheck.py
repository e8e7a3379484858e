"""Check `orchestrator bench` against an independent harness, NVIDIA's AIPerf.

Both drive the same server with the same workload: fixed ISL and OSL, text
prompts the server tokenizes (AIPerf's synthetic text; ours whole-word
tokens sent as text, `--prompts ids` for token ids), ignore_eos, streaming
completions, fixed concurrency, token counts from the server's usage
(`--use-server-token-count`), a new seed every run (the server's prefix cache
would hold a repeated run's prompts). After a warm-up run of ours (a fresh
server is slower for its first minute), they run alternately, who goes first
alternating too (ours, AIPerf, AIPerf, ours, ...), so drift hits both;
TTFT, TPOT and throughput are compared as ratios.

Definitions line up (read from AIPerf 0.13.0's source): TTFT = first content
chunk - request start on both sides; AIPerf's "inter_token_latency" is per
request (E2E - TTFT) / (output tokens - 1), which is our TPOT, so TPOT is
compared with it; throughput is completed requests (output tokens) over the
first send to the last response.

Two servers:

  fixed  a stand-in OpenAI server whose timing is sleeps, not compute
         (TTFT 50 ms, then one token every 10 ms): it checks the
         definitions and the load generation, whatever CPU the tools use.
  real   our aggregated CPU app (configs/agg-cpu.yaml).

Why the real server needs care on a small machine: with `--concurrency`
alone AIPerf 0.13.0 issues requests in its CONCURRENCY_BURST mode, whose
credit loop in the timing-manager process busy-polls (`await asyncio.sleep(0)`
while every slot is taken): measured, ~0.85 of a core for the whole run, while
its HTTP worker uses ~0.03 and our harness ~0.08. On 2 cores that core is
taken from the engine, so the server AIPerf measures is slower than the one
our harness measures. AIPerf set-ups (`--real-modes`):

  fair        one HTTP worker and one record processor, no /metrics scraping
              or GPU-telemetry polling, and a request-rate ceiling of
              `--fair-rate` (1000 req/s, constant) with the same concurrency
              cap: the credit loop sleeps to the next 1 ms tick instead of
              spinning; a freed slot is refilled within ~1 ms.
  niced       the same without the rate ceiling, the busy process at nice 19.
  as-shipped  AIPerf's defaults (what the first cross-check ran).

`--pin`: the server (every process it starts: Ray, the engine, the
frontend) on CPU 0 and the load generators (our harness, every AIPerf
process) on CPU 1, so the CPU a tool spends on itself (AIPerf: ~12 CPU
seconds a run in five processes; ours ~2) is never taken from the server it
measures. Processes inherit the affinity of the process that forks them.

The JSON keeps each run's CPU seconds per load-generator process, the
concurrency each tool actually kept and AIPerf's end-to-next-send gap.

AIPerf (PyPI `aiperf`) runs from its own environment under
~/.cache/orchestrator/peers/aiperf. Offline it needs the tokenizer in a
Hugging Face cache layout, which this script builds from the tiny model.
Writes benchmarks/results/aiperf_crosscheck.json (earlier results kept under
"history").

    .venv/bin/python benchmarks/aiperf_crosscheck.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, peers, report  # noqa: E402
from benchmarks.launch import MODEL_DIR  # noqa: E402
from tools.bench import hardware  # noqa: E402
from tools.bench_stats import summarize  # noqa: E402
from tools.runner import Target, run_concurrency  # noqa: E402
from tools.workloads import LengthDist, SyntheticWorkload, TokenPool  # noqa: E402

HF_REPO = "local/tiny-llama"
REVISION = "0" * 40
AIPERF_VERSION = "0.13.0"
METRICS = ("ttft_ms_p50", "ttft_ms_avg", "tpot_ms_p50", "tpot_ms_avg", "output_token_throughput", "request_throughput")
# AIPerf's process that keeps a core busy (its process title, as /proc/<pid>/comm shows it, 15 characters).
AIPERF_BUSY_PROCESS = "aiperf timing_m"


@contextlib.contextmanager
def pinned(cpus: set[int] | None):
    """Processes started inside run on `cpus` (None: no change); this process returns to its CPUs after."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def hf_cache(home: Path) -> Path:
    """The tiny tokenizer as the Hugging Face hub cache lays out a repo."""
    repo = home / "hub" / ("models--" + HF_REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        src = MODEL_DIR / name
        if src.exists():
            shutil.copy(src, snapshot / name)
    (snapshot / "config.json").write_text("{}")
    return home


@contextlib.contextmanager
def fixed_server(ttft_ms: float, itl_ms: float, log: Path):
    """benchmarks/peer_env/fixed_server.py in our venv's python; yields its URL."""
    port = launch.free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            str(launch.PEER_ENV / "fixed_server.py"),
            str(port),
            str(ttft_ms),
            str(itl_ms),
            str(MODEL_DIR / "tokenizer.json"),
            "tiny-llama",
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        launch.wait_healthy(f"{launch.local_url(port)}/v1/models", timeout_s=60, procs=[proc])
        yield launch.local_url(port)
    finally:
        launch.stop(proc)


class ProcessWatch:
    """CPU seconds of a process tree, per process title (sampled twice a second: processes that exit
    keep their last reading), and optionally a lower priority for the process titled `renice`."""

    def __init__(self, root: int, renice: str | None = None, niceness: int = 19):
        self.root, self.renice, self.niceness = root, renice, niceness
        self.seen: dict[int, tuple[str, float]] = {}
        self.reniced: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        import psutil

        while not self._stop.wait(0.5):
            try:
                root = psutil.Process(self.root)
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for proc in tree:
                with contextlib.suppress(psutil.Error):
                    times = proc.cpu_times()
                    name = proc.name()
                    self.seen[proc.pid] = (name, times.user + times.system)
                    if self.renice and name == self.renice and proc.pid not in self.reniced:
                        proc.nice(self.niceness)
                        self.reniced.append(proc.pid)

    def by_name(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name, cpu in self.seen.values():
            out[name] = round(out.get(name, 0.0) + cpu, 2)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def run_aiperf(url: str, args, out_dir: Path, hf_home: Path, mode: str, concurrency: int, seed: int) -> dict:
    aiperf = peers.PEERS_DIR / "aiperf" / "bin" / "aiperf"
    cmd = [
        str(aiperf),
        "profile",
        "--model",
        "tiny-llama",
        "--url",
        url,
        "--endpoint-type",
        "completions",
        "--streaming",
        "--concurrency",
        str(concurrency),
        "--request-count",
        str(args.requests),
        "--synthetic-input-tokens-mean",
        str(args.isl),
        "--synthetic-input-tokens-stddev",
        "0",
        "--output-tokens-mean",
        str(args.osl),
        "--output-tokens-stddev",
        "0",
        "--extra-inputs",
        "ignore_eos:true",
        "--extra-inputs",
        "min_tokens:" + str(args.osl),
        "--extra-inputs",
        "temperature:0",  # greedy, as our harness sends
        "--tokenizer",
        HF_REPO,
        "--artifact-dir",
        str(out_dir),
        "--warmup-request-count",
        "4",
        # A new seed every run, as ours: the same seed gives the same prompts, and the server's
        # prefix cache (524k tokens) still holds the last run's, so its TTFT would be a cache hit's.
        "--random-seed",
        str(seed),
        "--num-dataset-entries",
        str(args.requests + 4),
        # Count tokens from the server's usage, as our harness does: re-tokenizing the
        # streamed text with a 618-word vocabulary gives other counts than the ids generated.
        "--use-server-token-count",
    ]
    if mode in ("fair", "niced"):
        # One HTTP worker and one record processor (ours is one process), no polling of the server's
        # /metrics or of a GPU exporter while timing (ours does neither), no console UI.
        cmd += [
            "--workers-max",
            "1",
            "--record-processors",
            "1",
            "--no-server-metrics",
            "--no-gpu-telemetry",
            "--ui",
            "none",
        ]
    if mode == "fair":
        # With --concurrency alone AIPerf issues credits in its CONCURRENCY_BURST mode: a zero-interval loop
        # in the timing manager that, while every slot is busy, retries after `await asyncio.sleep(0)`:
        # a busy poll, a whole core for the whole run. A request-rate ceiling far above what the server
        # serves, with the same concurrency cap, makes that loop sleep to the next 1 ms tick instead:
        # the same closed loop (a freed slot is refilled within 1 ms), without the spinning core.
        cmd += ["--request-rate", str(args.fair_rate), "--request-rate-mode", "constant"]
    # Start-up on 2 busy cores can take longer than AIPerf's 30 s registration timeout.
    env = {
        **os.environ,
        "HF_HOME": str(hf_home),
        "HF_HUB_OFFLINE": "1",
        "AIPERF_SERVICE_REGISTRATION_TIMEOUT": "300",
        "AIPERF_SERVICE_REGISTRATION_MAX_ATTEMPTS": "300",
        "AIPERF_SERVICE_START_TIMEOUT": "300",
        "AIPERF_SERVICE_PROFILE_CONFIGURE_TIMEOUT": "600",
    }
    with (out_dir.parent / f"{out_dir.name}.log").open("w") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        with ProcessWatch(proc.pid, renice=AIPERF_BUSY_PROCESS if mode == "niced" else None) as watch:
            rc = proc.wait()
    if rc != 0:
        raise RuntimeError(f"aiperf exited with {rc}; see {out_dir}.log")
    data = json.loads(next(out_dir.rglob("profile_export_aiperf.json")).read_text())
    records = data.get("records", data)

    def metric(name: str, stat: str) -> float:
        return float(records[name][stat])

    out = {
        "ttft_ms_p50": metric("time_to_first_token", "p50"),
        "ttft_ms_avg": metric("time_to_first_token", "avg"),
        "tpot_ms_p50": metric("inter_token_latency", "p50"),
        "tpot_ms_avg": metric("inter_token_latency", "avg"),
        "output_token_throughput": metric("output_token_throughput", "avg"),
        "request_throughput": metric("request_throughput", "avg"),
        "isl_mean": metric("input_sequence_length", "avg"),
        "osl_mean": metric("output_sequence_length", "avg"),
        "duration_s": metric("benchmark_duration", "avg"),
    }
    out |= _load_shape(next(out_dir.rglob("profile_export.jsonl")))
    out["cpu_s"] = watch.by_name()
    out["reniced"] = len(watch.reniced)
    return out


def _load_shape(jsonl: Path) -> dict:
    """From AIPerf's per-request records: the concurrency it actually kept and its gap between a
    response's end and the next send."""
    rows = [json.loads(line)["metadata"] for line in jsonl.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("benchmark_phase") == "profiling"]
    starts = sorted(r["request_start_ns"] / 1e9 for r in rows)
    ends = sorted(r["request_end_ns"] / 1e9 for r in rows)
    busy = sum((r["request_end_ns"] - r["request_start_ns"]) / 1e9 for r in rows)
    gaps = []
    for end in ends:
        later = [s for s in starts if s >= end]
        if later:
            gaps.append(later[0] - end)
    gaps.sort()
    return {
        "mean_in_flight": busy / (max(ends) - min(starts)),
        "end_to_next_send_ms_p50": gaps[len(gaps) // 2] * 1000 if gaps else None,
    }


def run_ours(url: str, args, pool: TokenPool, seed: int, concurrency: int, detokenize=None) -> dict:
    workload = SyntheticWorkload(LengthDist(args.isl), LengthDist(args.osl), pool, seed=seed)
    target = Target(url, "tiny-llama", detokenize=detokenize)
    asyncio.run(run_concurrency(target, workload.requests(4), 4))
    before = resource.getrusage(resource.RUSAGE_SELF)
    records, duration = asyncio.run(run_concurrency(target, workload.requests(4 + args.requests)[4:], concurrency))
    after = resource.getrusage(resource.RUSAGE_SELF)
    r = summarize(records, duration, [])
    tpots = [((x.e2e_s - x.ttft_s) / (x.output_tokens - 1)) * 1000 for x in records if x.ok and x.output_tokens > 1]
    busy = sum(x.e2e_s for x in records if x.ok)
    return {
        "ttft_ms_p50": r.ttft_ms["p50"],
        "ttft_ms_avg": r.ttft_ms["mean"],
        "tpot_ms_p50": r.tpot_ms["p50"],
        "tpot_ms_avg": sum(tpots) / len(tpots),
        "output_token_throughput": r.output_token_throughput,
        "request_throughput": r.request_throughput,
        "isl_mean": r.prompt_tokens / max(r.completed, 1),
        "osl_mean": r.output_tokens / max(r.completed, 1),
        "duration_s": duration,
        "mean_in_flight": busy / duration,
        "failed": r.failed,
        "cpu_s": {"harness": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 2)},
    }


def compare(rounds: list[dict]) -> dict:
    mean = {side: {k: sum(r[side][k] for r in rounds) / len(rounds) for k in METRICS} for side in ("ours", "aiperf")}
    ratio = {k: mean["ours"][k] / mean["aiperf"][k] for k in METRICS}
    return {
        "rounds": rounds,
        "mean": mean,
        "ratio_ours_over_aiperf": ratio,
        "within_5_percent": {k: abs(v - 1) <= 0.05 for k, v in ratio.items()},
    }


def arguments() -> argparse.Namespace:
    p = launch.parser(__doc__)
    p.add_argument("--isl", type=int, default=256)
    p.add_argument("--osl", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--servers", default="fixed,real", help="fixed and/or real")
    p.add_argument(
        "--real-modes",
        default="fair,as-shipped",
        help="AIPerf set-ups against the real server: fair (1 worker, no scraping, a 1 ms request-rate "
        "tick instead of its busy loop), niced (1 worker, no scraping, busy loop at nice 19), "
        "as-shipped (its defaults)",
    )
    p.add_argument(
        "--fair-rate",
        type=float,
        default=1000.0,
        help="request-rate ceiling (req/s) of the fair mode; far above what the server serves",
    )
    p.add_argument("--fixed-ttft-ms", type=float, default=50.0)
    p.add_argument("--fixed-itl-ms", type=float, default=10.0)
    p.add_argument("--out", default=str(launch.RESULTS / "aiperf_crosscheck.json"))
    p.add_argument(
        "--merge",
        action="store_true",
        help="add this run's results to those in --out (keys suffixed with --tag) instead of replacing them",
    )
    p.add_argument("--tag", default="", help="suffix for this run's result keys, e.g. '-repeat'")
    p.add_argument(
        "--prompts",
        choices=["text", "ids"],
        default="text",
        help="what our harness sends: text (as AIPerf does; the server tokenizes it) or token ids",
    )
    p.add_argument(
        "--warm-up-requests",
        type=int,
        default=100,
        help="a first run of ours on a fresh server, not counted (a cold server is slower for a minute)",
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help="server on CPU 0, load generators on CPU 1 (each tool's own CPU use not taken from the server)",
    )
    return p.parse_args()


def main() -> None:
    args = arguments()
    server_cpus, client_cpus = ({0}, {1}) if args.pin else (None, None)
    tokenizer = launch.tiny_model()
    peers.ensure_venv("aiperf", [f"aiperf=={AIPERF_VERSION}"], constrained=False)
    if args.prompts == "text":
        # Text the server tokenizes, as AIPerf sends: whole-word tokens, so that the length is exact.
        pool, detokenize = TokenPool.words(tokenizer), (lambda ids: tokenizer.decode(list(ids)))
    else:
        pool, detokenize = TokenPool.vocabulary(len(tokenizer)), None
    work = Path(args.out).with_suffix("")
    work.mkdir(parents=True, exist_ok=True)
    hf_home = hf_cache(work / "hf")
    out = Path(args.out)
    history: list[dict] = []
    kept: dict[str, dict] = {}
    if out.exists():
        previous = json.loads(out.read_text())
        history = previous.pop("history", [])
        if args.merge:
            kept = previous.get("results", {})
        else:
            history.append(previous)
    results: dict[str, dict] = {}

    def alternate(url: str, key: str, mode: str) -> None:
        key += args.tag
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        rounds = []
        with pinned(client_cpus):
            if args.warm_up_requests:
                warm = argparse.Namespace(**{**vars(args), "requests": args.warm_up_requests})
                run_ours(url, warm, pool, seed=999, concurrency=args.concurrency, detokenize=detokenize)
        for i in range(args.rounds):
            # Alternate who goes first (ours, AIPerf, AIPerf, ours, ...): a server drifting over the run
            # favours neither.
            with pinned(client_cpus):

                def ours(i=i):
                    return run_ours(url, args, pool, seed=i, concurrency=args.concurrency, detokenize=detokenize)

                def theirs(i=i):
                    return run_aiperf(url, args, work / f"{key}-{i}", hf_home, mode, args.concurrency, seed=1000 + i)

                if i % 2 == 0:
                    result = {"ours": ours(), "aiperf": theirs()}
                else:
                    result = {"aiperf": theirs(), "ours": ours()}
            rounds.append(result)
            print(key, json.dumps(rounds[-1]), flush=True)
        results[key] = compare(rounds) | {"started_at": started}
        print(key, json.dumps(results[key]["ratio_ours_over_aiperf"]), flush=True)

    servers = args.servers.split(",")
    if "fixed" in servers:
        with contextlib.ExitStack() as stack:
            with pinned(server_cpus):
                url = stack.enter_context(
                    fixed_server(args.fixed_ttft_ms, args.fixed_itl_ms, work / "fixed-server.log")
                )
            alternate(url, "fixed-fair", "fair")
            results["fixed-fair" + args.tag]["expected"] = {
                "ttft_ms": args.fixed_ttft_ms,
                "tpot_ms": args.fixed_itl_ms,
                "request_throughput_upper_bound": args.concurrency
                * 1000
                / (args.fixed_ttft_ms + (args.osl - 1) * args.fixed_itl_ms),
            }
    if "real" in servers:
        with contextlib.ExitStack() as stack:
            with pinned(server_cpus):
                url = stack.enter_context(launch.ours(launch.app_args("agg-cpu.yaml"), work / "server.log"))
            for mode in args.real_modes.split(","):
                alternate(url, f"real-{mode}", mode)
    doc = {
        "benchmark": "aiperf_crosscheck",
        "version": 2,
        "hardware": hardware(),
        "aiperf": AIPERF_VERSION,
        "workload": {
            "isl": args.isl,
            "osl": args.osl,
            "concurrency": args.concurrency,
            "requests": args.requests,
            "prompts": (
                f"ours: {args.prompts} "
                f"({'whole-word tokens as text' if args.prompts == 'text' else 'random token ids'}); "
                "AIPerf: its synthetic text of the same token count"
            ),
            "warm_up_requests": args.warm_up_requests,
            "order": "alternating (ours first in even rounds)",
            "ignore_eos": True,
            "temperature": 0,
            "endpoint": "/v1/completions, streaming",
            "pinned": {"server_cpus": sorted(server_cpus), "load_generator_cpus": sorted(client_cpus)}
            if args.pin
            else None,
        },
        "servers": {
            "fixed": f"sleeps: TTFT {args.fixed_ttft_ms} ms, then a token every {args.fixed_itl_ms} ms",
            "real": "ours, configs/agg-cpu.yaml",
        },
        "results": kept | results,
        "history": history,
    }
    report.write_json(out, doc)
    print(
        json.dumps(
            {
                k: {"ratio": v["ratio_ours_over_aiperf"], "within_5_percent": v["within_5_percent"]}
                for k, v in results.items()
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
