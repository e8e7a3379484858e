"""SGLang engines behind our frontend, disaggregated, on a GPU machine.

VERIFIED ONLY ON A GPU MACHINE: SGLang needs CUDA, so this script cannot run
on the CPU machines that run the rest of the suite, and it has not been run
yet. Until it is, the SGLang engine kind is tested only against the pinned
SGLang's own classes and source, and output dicts recorded from that source
(tests/unit/test_sglang_adapter.py), never against a running engine.

What it does: serves configs/disagg-sglang.yaml with `serve run` (by
default its 1 prefill + 1 decode variant, 2 GPUs; `--full` for the shipped
4 + 4), then

  1. sends greedy completion and chat requests, whole and streamed, and
     checks each answer (200, non-empty text, usage adding up, the streamed
     text equal to the whole one for the same greedy prompt);
  2. checks that KV went from the prefill pool to the decode pool: the
     frontend counted handoffs and no prefill fallback, the decode replicas
     report prompt tokens received by transfer and transfers done, the
     prefill replicas report prompt tokens computed, and no two prefill
     replicas on one node share a bootstrap port;
  3. checks that the frontends follow the prefill replicas' KV events: the
     index holds blocks of prefill replicas and no batch was malformed;
  4. sends a long shared prefix twice and reports the prefill replica's
     prefix-cache hit on the second request;
  5. checks what the prefill engine's first token must carry, since SGLang's
     decode engine continues from it: a JSON-schema chat answer parses whole
     (its first token under the grammar), and greedy log-probabilities score
     every output token, the first included, each the top of its own list.

Writes benchmarks/results/gpu/sglang_pd.json (every check with its
evidence); exits 1 when a check fails.

    pip install -c constraints/sglang.txt '.[sglang]'    # not with '.[gpu]': they conflict (that file)
    python benchmarks/gpu/sglang_pd.py [--model meta-llama/Llama-3.1-8B-Instruct] [--full]
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import httpx

if __package__ in (None, ""):  # run as `python benchmarks/gpu/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks import launch, report  # noqa: E402
from benchmarks.gpu.checks import check, metric, transfer_totals  # noqa: E402
from benchmarks.launch import ROOT  # noqa: E402
from orchestrator.config import AppConfig, load_app_config, shipped_config  # noqa: E402

CONFIG = launch.CONFIGS / "disagg-sglang.yaml"
OUT = launch.RESULTS / "gpu" / "sglang_pd.json"
PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name three primary colours, comma separated."}]


def app_config(model: str | None, full: bool) -> AppConfig:
    """The shipped config's application: `model` (HF id or local path) as its name and source if given; unless
    `full`, one replica of each pool and of the frontend."""
    overrides: dict[str, Any] = {} if model is None else {"model__name": model}
    if not full:
        overrides |= {"prefill_pool__replicas": 1, "decode_pool__replicas": 1, "frontend__replicas": 1}
    return shipped_config(CONFIG, model or load_app_config(CONFIG).model.source, **overrides)


def serving(cfg: AppConfig, log, timeout_s: float):
    """Our app through `serve run`, which starts Ray itself (all of this machine's CPUs and GPUs), in this
    process's environment as it is (no HAProxy switches added); yields its URL."""
    return launch.ours(cfg, log, ingress=False, num_cpus=None, ray_start=False, timeout_s=timeout_s, stop_wait_s=120)


def sse_text(response: httpx.Response, chat: bool) -> tuple[str, dict | None]:
    text, usage = "", None
    for line in response.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        usage = event.get("usage") or usage
        for choice in event.get("choices", []):
            text += (choice.get("delta", {}).get("content") or "") if chat else choice.get("text", "")
    return text, usage


def requests_and_outputs(url: str, model: str, results: list[dict]) -> None:
    with httpx.Client(base_url=url, timeout=300) as client:
        body = {"model": model, "prompt": PROMPT, "max_tokens": 32, "temperature": 0}
        whole = client.post("/v1/completions", json=body)
        answer = whole.json() if whole.status_code == 200 else {}
        text = answer.get("choices", [{}])[0].get("text", "")
        usage = answer.get("usage", {})
        check(
            results,
            "completion",
            whole.status_code == 200 and text.strip() != "" and 0 < usage.get("completion_tokens", 0) <= 32,
            status=whole.status_code,
            text=text,
            usage=usage,
        )

        with client.stream(
            "POST", "/v1/completions", json={**body, "stream": True, "stream_options": {"include_usage": True}}
        ) as r:
            streamed, s_usage = sse_text(r, chat=False)
        check(results, "completion streamed equals whole (greedy)", streamed == text, streamed=streamed)

        chat = client.post(
            "/v1/chat/completions", json={"model": model, "messages": CHAT, "max_tokens": 32, "temperature": 0}
        )
        content = chat.json()["choices"][0]["message"]["content"] if chat.status_code == 200 else ""
        check(
            results, "chat", chat.status_code == 200 and content.strip() != "", status=chat.status_code, content=content
        )
        with client.stream(
            "POST",
            "/v1/chat/completions",
            json={"model": model, "messages": CHAT, "max_tokens": 32, "temperature": 0, "stream": True},
        ) as r:
            streamed_chat, _ = sse_text(r, chat=True)
        check(results, "chat streamed equals whole (greedy)", streamed_chat == content, streamed=streamed_chat)

        prefix = " ".join(f"fact {i}: the sky is blue." for i in range(150))
        cached = []
        for question in ("What colour is the sky?", "Is the sky blue?"):
            r = client.post(
                "/v1/completions",
                json={"model": model, "prompt": f"{prefix}\n{question}", "max_tokens": 8, "temperature": 0},
            )
            cached.append(
                r.json().get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens", 0)
                if r.status_code == 200
                else None
            )
        check(
            results,
            "shared prefix reused on the prefill replica",
            cached[1] is not None and cached[1] > 0,
            cached_tokens=cached,
        )


def first_token_shaped_by_the_prefill(url: str, model: str, results: list[dict]) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    with httpx.Client(base_url=url, timeout=300) as client:
        constrained = client.post(
            "/v1/chat/completions",
            json={
                "model": model,
                "messages": CHAT,
                "max_tokens": 64,
                "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
            },
        )
        content = constrained.json()["choices"][0]["message"]["content"] if constrained.status_code == 200 else ""
        try:
            parsed = json.loads(content)
        except ValueError:
            parsed = None
        check(
            results,
            "constrained output parses from its first token",
            isinstance(parsed, dict) and isinstance(parsed.get("colour"), str),
            status=constrained.status_code,
            content=content,
        )
        scored = client.post(
            "/v1/completions",
            json={"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 3},
        )
        choice = scored.json()["choices"][0] if scored.status_code == 200 else {}
        lp = choice.get("logprobs") or {}
        tokens, values, tops = lp.get("tokens", []), lp.get("token_logprobs", []), lp.get("top_logprobs", [])
        greedy_tops = [top and max(top, key=top.get) == token for token, top in zip(tokens, tops, strict=False)]
        check(
            results,
            "greedy log-probabilities score every token, the first included",
            scored.status_code == 200
            and len(tokens) == len(values) == len(tops) > 0
            and all(v is not None and v <= 0 for v in values)
            and all(greedy_tops),
            status=scored.status_code,
            tokens=tokens,
            token_logprobs=values,
        )


def kv_transferred(url: str, results: list[dict]) -> None:
    time.sleep(3)  # replicas report their stats every second
    pools = httpx.get(f"{url}/pools", timeout=30).json()["pools"]
    decode = [r["stats"] or {} for r in pools["decode_pool"]]
    prefill = [r["stats"] or {} for r in pools["prefill_pool"]]
    infos = [r["info"] or {} for r in pools["prefill_pool"] + pools["decode_pool"]]
    check(
        results,
        "engines are SGLang with a concurrent handoff",
        all(i.get("engine_kind") == "sglang" and i.get("kv_handoff") == "concurrent" for i in infos),
        versions=sorted({i.get("engine_version") for i in infos}),
    )
    bootstrap = [(i.get("host"), i.get("bootstrap_port")) for i in (r["info"] or {} for r in pools["prefill_pool"])]
    check(
        results,
        "prefill replicas have bootstrap ports of their own",
        len(set(bootstrap)) == len(bootstrap) and all(port is not None for _, port in bootstrap),
        host_ports=bootstrap,
    )
    totals = transfer_totals(decode)
    transfers, transferred = totals["kv_transfers_total"], totals["prompt_tokens_transferred_total"]
    failures = totals["kv_transfer_failures_total"]
    computed_on_decode = sum(s.get("prompt_tokens_computed_total", 0) for s in decode)
    computed_on_prefill = sum(s.get("prompt_tokens_computed_total", 0) for s in prefill)
    check(
        results,
        "decode replicas received prompts by KV transfer",
        transferred > 0 and transfers > 0 and failures == 0 and computed_on_decode == 0,
        prompt_tokens_transferred=transferred,
        kv_transfers=transfers,
        failures=failures,
        prompt_tokens_computed_on_decode=computed_on_decode,
    )
    check(
        results,
        "prefill replicas computed the prompts",
        computed_on_prefill > 0,
        prompt_tokens_computed_on_prefill=computed_on_prefill,
    )
    text = httpx.get(f"{url}/metrics", timeout=30).text
    handoffs = metric(text, "orchestrator_kv_handoffs_total")
    fallbacks = metric(text, "orchestrator_prefill_fallbacks_total")
    check(
        results,
        "frontend counted handoffs and no prefill fallback",
        handoffs > 0 and fallbacks == 0,
        kv_handoffs=handoffs,
        prefill_fallbacks=fallbacks,
    )
    indexed = [r.get("indexed_blocks", 0) for r in pools["prefill_pool"]]
    malformed = metric(text, "orchestrator_kv_events_malformed_total")
    check(
        results,
        "KV events of prefill replicas indexed, none malformed",
        sum(indexed) > 0 and malformed == 0,
        indexed_blocks=indexed,
        malformed_batches=malformed,
    )


def main() -> int:
    parser = launch.parser(__doc__)
    parser.add_argument("--model", default=None, help="HF id or local path; default: the config's")
    parser.add_argument("--full", action="store_true", help="the shipped 4 prefill + 4 decode replicas (8 GPUs)")
    parser.add_argument("--ready-timeout-s", type=float, default=1800)
    args = parser.parse_args()
    cfg = app_config(args.model, args.full)
    model = cfg.model.name
    OUT.parent.mkdir(parents=True, exist_ok=True)
    log = OUT.with_suffix(".log")
    results: list[dict] = []
    started = time.time()
    try:
        with serving(cfg, log, args.ready_timeout_s) as url:
            requests_and_outputs(url, model, results)
            first_token_shaped_by_the_prefill(url, model, results)
            kv_transferred(url, results)
    except Exception as e:  # the run itself failed: record why
        check(results, "serve and run", False, error=f"{type(e).__name__}: {e}")
    doc = {
        "config": str(CONFIG.relative_to(ROOT)),
        "full": args.full,
        "model": model,
        "started": started,
        "seconds": round(time.time() - started, 1),
        "ok": all(r["ok"] for r in results),
        "checks": results,
        "log": str(log.relative_to(ROOT)),
    }
    report.write_json(OUT, doc)
    print(f"wrote {OUT.relative_to(ROOT)}: {'all checks passed' if doc['ok'] else 'FAILED'}")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
