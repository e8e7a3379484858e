"""Wait for a server to be ready, send one streamed chat request, and show
the request, the answer, its time to first token and the way it took: which
prefill replica computed the prompt, how much KV moved to which decode
replica and how long the move took (read from the app's /metrics and /pools
around the request; the app must be otherwise idle)."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.api.sse import parse_events

# Long enough (~1,000 tokens with the tiny model's tokenizer) to be above the
# CPU configs' routing.local_prefill_max_tokens: the sample goes through the
# prefill pool and crosses NIXL.
SAMPLE_PROMPT = "Read these notes, then explain disaggregated prefill and decode in one sentence. " + " ".join(
    f"Note {i}: the prefill replica computes the prompt once, keeps its key and value blocks, and the decode "
    "replica reads them over the network before it writes the answer token by token."
    for i in range(12)
)
ROUTE_COUNTERS = (
    "orchestrator_route_decisions_total",
    "orchestrator_kv_handoff_blocks_total",
    "orchestrator_prefill_fallbacks_total",
)


def wait_ready(client: httpx.Client, url: str, wait_s: float) -> dict:
    deadline = time.monotonic() + wait_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        try:
            r = client.get(f"{url}/health", timeout=5)
            if r.status_code == 200:
                return r.json()
            last = f"{r.status_code} {r.text[:200]}"
        except httpx.HTTPError as e:
            last = f"{type(e).__name__}"
        time.sleep(2)
    raise TimeoutError(f"{url} not ready after {wait_s:.0f}s ({last})")


def _counters(client: httpx.Client, url: str) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(client.get(f"{url}/metrics").text):
        for s in family.samples:
            if s.name in ROUTE_COUNTERS:
                out[(s.name, s.labels.get("kind", ""))] = s.value
    return out


def _replica_stats(client: httpx.Client, url: str) -> dict[tuple[str, str], dict[str, Any]]:
    pools = client.get(f"{url}/pools").json()["pools"]
    return {(pool, r["replica_id"]): r["stats"] or {} for pool, replicas in pools.items() for r in replicas}


def _settled_stats(client: httpx.Client, url: str, quiet_s: float = 2.5, timeout_s: float = 15) -> dict:
    """Replica reports once they stop changing (replicas report every second)."""
    deadline = time.monotonic() + timeout_s
    last = _replica_stats(client, url)
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = _replica_stats(client, url)
        if now == last:
            break
        last = now
    return last


def describe_route(counters_before: dict, counters_after: dict, before: dict, after: dict) -> str:
    """The request's way through the pools, from the counter and report deltas."""

    def grew(field: str, pool: str) -> list[tuple[str, float]]:
        return [
            (rid, after[(p, rid)].get(field, 0) - before.get((p, rid), {}).get(field, 0))
            for (p, rid) in after
            if p == pool and after[(p, rid)].get(field, 0) > before.get((p, rid), {}).get(field, 0)
        ]

    kinds = [
        kind
        for (name, kind), v in counters_after.items()
        if name == "orchestrator_route_decisions_total" and v > counters_before.get((name, kind), 0)
    ]
    decode = grew("generation_tokens_total", "decode_pool")
    decode_at = decode[0][0] if decode else "?"
    if kinds != ["remote_prefill"]:
        return f"route: {kinds[0] if kinds else 'unknown'}, computed and decoded on decode_pool replica {decode_at}"
    prefill = grew("prompt_tokens_computed_total", "prefill_pool")
    blocks = counters_after.get(("orchestrator_kv_handoff_blocks_total", ""), 0) - counters_before.get(
        ("orchestrator_kv_handoff_blocks_total", ""), 0
    )
    moved = dict(grew("kv_transfer_bytes_total", "decode_pool"))
    seconds = dict(grew("kv_transfer_seconds_total", "decode_pool"))
    return "\n".join(
        [
            "route: remote prefill (disaggregated)",
            f"  prefill on prefill_pool replica {prefill[0][0] if prefill else '?'}"
            f" ({int(prefill[0][1]) if prefill else '?'} prompt tokens computed)",
            f"  KV moved over NIXL: {int(blocks)} blocks, {sum(moved.values()) / 2**20:.1f} MiB"
            f" in {1000 * sum(seconds.values()):.1f} ms",
            f"  decode on decode_pool replica {decode_at}",
        ]
    )


def run_sample_request(url: str, wait_s: float, prompt: str, max_tokens: int) -> int:
    with httpx.Client() as client:
        health = wait_ready(client, url, wait_s)
        model = client.get(f"{url}/v1/models").json()["data"][0]["id"]
        body = {
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        counters_before, stats_before = _counters(client, url), _settled_stats(client, url)
        start = time.perf_counter()
        ttft = None
        text = []
        raw = []
        with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                raw.append(line)
                if ttft is None and '"content":"' in line and '"content":""' not in line:
                    ttft = time.perf_counter() - start
        total = time.perf_counter() - start
        route = describe_route(counters_before, _counters(client, url), stats_before, _settled_stats(client, url))
        usage = None
        for event in parse_events("\n".join(raw) + "\n"):
            if isinstance(event, dict):
                for choice in event.get("choices", []):
                    text.append(choice.get("delta", {}).get("content", ""))
                usage = event.get("usage") or usage
    shown = {**body, "messages": [{"role": "user", "content": prompt[:120] + ("..." if len(prompt) > 120 else "")}]}
    print(f"server ready: {json.dumps(health)}")
    print(f"request: POST {url}/v1/chat/completions")
    print(json.dumps(shown, indent=2))
    print(f"answer: {''.join(text)!r}")
    print(route)
    print(f"time to first token: {ttft * 1000:.1f} ms" if ttft is not None else "time to first token: n/a")
    print(f"total: {total * 1000:.1f} ms; usage: {json.dumps(usage)}")
    return 0
