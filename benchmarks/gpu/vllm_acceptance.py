"""Acceptance of the vLLM GPU path, for a person with two or more GPUs (H100s).

NEVER RUN: no GPU machine has been available to this project, so this script
has not run yet. It is built from the same pieces as the CPU experiments
(benchmarks/launch.py: `serve run` of our app, readiness, teardown) and its
configs are checked in CI (tests/unit/test_gpu_acceptance.py); what vLLM,
NIXL and CUDA do on the machine is what it is for.

What it does, from the shipped GPU configs (configs/agg.yaml, configs/disagg.yaml)
scaled to the GPUs given (`--gpus`, default 2):

  1. aggregated: one replica (configs/agg.yaml) answers a fixed set of
     greedy requests (completions of a short and a long prompt, a chat, one
     streamed), the reference outputs;
  2. disaggregated: 1 prefill + 1 decode replica (configs/disagg.yaml) answer
     the same requests; checks that every output equals the aggregated one,
     that the long prompt took the remote-prefill route (the frontend's
     route decisions and KV handoffs, no prefill fallback), and that the
     decode replica's NIXL connector reported the transfer (KV transfers and
     prompt tokens received by transfer > 0, no transfer failure);
  3. overhead: vLLM's own OpenAI server and our aggregated app, one GPU
     each, the same engine settings, the same requests in alternating rounds
     at concurrency 1 and 8: TTFT and ITL p50 of ours over vLLM's.

Writes benchmarks/results/gpu/vllm_acceptance.json (every check with its
evidence, the overhead rounds); exits 1 when a check fails.

    pip install -c constraints/cpu.txt '.[gpu,bench]'    # then:
    python benchmarks/gpu/vllm_acceptance.py [--model meta-llama/Llama-3.1-8B-Instruct] [--gpus 2]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

if __package__ in (None, ""):  # run as `python benchmarks/gpu/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks import launch, report  # noqa: E402
from benchmarks.gpu.checks import check, metric, transfer_totals  # noqa: E402
from orchestrator.config import AppConfig, shipped_config  # noqa: E402
from tools.bench_stats import percentiles  # noqa: E402
from tools.runner import Target, run_concurrency  # noqa: E402
from tools.workloads import LengthDist, SyntheticWorkload, TokenPool  # noqa: E402

OUT = launch.RESULTS / "gpu" / "vllm_acceptance.json"
DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SHORT = "The capital of France is"
LONG = " ".join(f"Fact {i}: the river runs past the mill and the mill grinds the grain." for i in range(120))
CHAT = [{"role": "user", "content": "Name three primary colours, comma separated."}]


def configs(model: str) -> dict[str, AppConfig]:
    """The shipped GPU configs on `model`, one GPU per replica, one frontend: aggregated on 1 GPU,
    disaggregated on 2 (1 prefill + 1 decode)."""
    common = {"model__name": model, "frontend__replicas": 1}
    return {
        "agg": shipped_config(launch.CONFIGS / "agg.yaml", model, decode_pool__replicas=1, **common),
        "disagg": shipped_config(
            launch.CONFIGS / "disagg.yaml", model, prefill_pool__replicas=1, decode_pool__replicas=1, **common
        ),
    }


def bare_vllm_command(cfg: AppConfig, port: int) -> list[str]:
    """vLLM's own OpenAI server with the aggregated pool's engine settings."""
    engine = cfg.decode_pool.engine
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", cfg.model.weights_source]
    cmd += ["--served-model-name", cfg.model.name, "--dtype", cfg.model.dtype]
    cmd += ["--max-model-len", str(cfg.model.max_model_len), "--block-size", str(cfg.kv_cache.block_size)]
    cmd += ["--gpu-memory-utilization", str(engine.gpu_memory_utilization), "--enable-prefix-caching"]
    cmd += ["--enable-prompt-tokens-details", "--host", launch.HOST, "--port", str(port), "--disable-log-stats"]
    if engine.max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(engine.max_num_seqs)]
    if engine.max_num_batched_tokens is not None:
        cmd += ["--max-num-batched-tokens", str(engine.max_num_batched_tokens)]
    return cmd


def answers(url: str, model: str) -> dict[str, str]:
    """Greedy outputs of the fixed requests, whole and streamed."""
    out = {}
    with httpx.Client(base_url=url, timeout=600) as client:
        for name, prompt in (("short", SHORT), ("long", LONG)):
            body = {"model": model, "prompt": prompt, "max_tokens": 32, "temperature": 0}
            out[name] = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
        body = {"model": model, "messages": CHAT, "max_tokens": 32, "temperature": 0}
        out["chat"] = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]["content"]
        streamed = ""
        with client.stream("POST", "/v1/completions", json={**body_of(model, LONG), "stream": True}) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    streamed += "".join(c.get("text", "") for c in json.loads(line[6:]).get("choices", []))
        out["long streamed"] = streamed
    return out


def body_of(model: str, prompt: str) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": 32, "temperature": 0}


def disaggregation_checks(url: str, reference: dict[str, str], model: str, results: list[dict]) -> None:
    before = httpx.get(f"{url}/metrics", timeout=30).text
    got = answers(url, model)
    for name, text in reference.items():
        check(results, f"disaggregated equals aggregated: {name}", got.get(name) == text, ours=got.get(name), agg=text)
    time.sleep(3)  # replicas report their engine stats every second
    after = httpx.get(f"{url}/metrics", timeout=30).text
    remote = metric(after, "orchestrator_route_decisions_total", kind="remote_prefill") - metric(
        before, "orchestrator_route_decisions_total", kind="remote_prefill"
    )
    handoffs = metric(after, "orchestrator_kv_handoffs_total") - metric(before, "orchestrator_kv_handoffs_total")
    fallbacks = metric(after, "orchestrator_prefill_fallbacks_total") - metric(
        before, "orchestrator_prefill_fallbacks_total"
    )
    check(
        results,
        "the long prompts were prefilled remotely",
        remote >= 2 and handoffs >= 2 and fallbacks == 0,
        remote_prefill_routes=remote,
        kv_handoffs=handoffs,
        prefill_fallbacks=fallbacks,
    )
    decode = [r["stats"] or {} for r in httpx.get(f"{url}/pools", timeout=30).json()["pools"]["decode_pool"]]
    totals = transfer_totals(decode)
    transfers, transferred = totals["kv_transfers_total"], totals["prompt_tokens_transferred_total"]
    failures = totals["kv_transfer_failures_total"]
    check(
        results,
        "NIXL connector reported the transfers on the decode replica",
        transfers > 0 and transferred > 0 and failures == 0,
        kv_transfers=transfers,
        prompt_tokens_transferred=transferred,
        kv_transfer_failures=failures,
    )


@contextlib.contextmanager
def on_gpus(devices: str) -> Iterator[None]:
    """Processes started inside see only `devices` (CUDA_VISIBLE_DEVICES), Ray's among them."""
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = devices
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


@contextlib.contextmanager
def bare_vllm(cfg: AppConfig, log: Path) -> Iterator[str]:
    port = launch.free_port()
    proc = subprocess.Popen(
        bare_vllm_command(cfg, port), stdout=log.open("a"), stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        launch.wait_healthy(f"{launch.local_url(port)}/health", procs=[proc], log=log)
        yield launch.local_url(port)
    finally:
        launch.stop(proc)


def overhead(ours_url: str, bare_url: str, model: str, tokenizer_size: int, rounds: int) -> dict[str, Any]:
    """Alternating rounds, same requests to both, at concurrency 1 and 8; ours over vLLM's p50s."""
    workload = SyntheticWorkload(LengthDist(1024), LengthDist(128), TokenPool.vocabulary(tokenizer_size), seed=7)
    rows: dict[str, dict[str, list]] = {}
    for r in range(rounds):
        for concurrency in (1, 8):
            specs = workload.requests(16 * (r + 1) * concurrency)[16 * r * concurrency :]
            order = (("ours", ours_url), ("vllm", bare_url)) if r % 2 == 0 else (("vllm", bare_url), ("ours", ours_url))
            for name, url in order:
                records, _ = asyncio.run(run_concurrency(Target(url, model), specs, concurrency))
                row = rows.setdefault(f"c={concurrency}", {}).setdefault(name, [])
                row.extend(records)
    out = {}
    for level, systems in rows.items():
        stats = {
            name: {
                "ttft_ms": percentiles([r.ttft_s for r in recs if r.ok and r.ttft_s is not None]),
                "itl_ms": percentiles([g for r in recs if r.ok for g in r.itl_s]),
                "failed": sum(not r.ok for r in recs),
            }
            for name, recs in systems.items()
        }
        ratio = {
            k: stats["ours"][k]["p50"] / stats["vllm"][k]["p50"]
            for k in ("ttft_ms", "itl_ms")
            if stats["ours"][k]["p50"] and stats["vllm"][k]["p50"]
        }
        out[level] = {**stats, "ours_over_vllm_p50": ratio}
    return out


def main() -> int:
    p = launch.parser(__doc__)
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--gpus", type=int, default=2, help="GPUs to use (at least 2: the P/D pair)")
    p.add_argument("--rounds", type=int, default=4, help="overhead benchmark: alternating rounds")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args()
    if args.gpus < 2:
        raise SystemExit("the disaggregated check needs 2 GPUs (1 prefill + 1 decode replica)")
    cfgs = configs(args.model)
    log = Path(args.out).with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    doc: dict[str, Any] = {"benchmark": "vllm_gpu_acceptance", "version": 1, "model": args.model}
    with on_gpus("0"), launch.ours(cfgs["agg"], log) as url:
        reference = answers(url, args.model)
    check(results, "aggregated answers every request", all(reference.values()), outputs=reference)
    with on_gpus("0,1"), launch.ours(cfgs["disagg"], log) as url:
        disaggregation_checks(url, reference, args.model, results)
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(cfgs["agg"].model.tokenizer_source))
    with on_gpus("0"), launch.ours(cfgs["agg"], log) as ours_url, on_gpus("1"), bare_vllm(cfgs["agg"], log) as bare:
        doc["overhead"] = overhead(ours_url, bare, args.model, vocab, args.rounds)
    for level, row in doc["overhead"].items():
        check(
            results,
            f"overhead {level}: no request failed",
            row["ours"]["failed"] == row["vllm"]["failed"] == 0,
            ours_over_vllm_p50=row["ours_over_vllm_p50"],
        )
    doc["checks"] = results
    report.write_json(args.out, doc)
    failed = [c["check"] for c in results if not c["ok"]]
    print(f"{len(results) - len(failed)} of {len(results)} checks passed; {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
