"""Wait for a server to be ready, send one streamed chat request, and show
the request, the answer and its time to first token."""

from __future__ import annotations

import json
import time

import httpx

from orchestrator.api.sse import parse_events


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
        usage = None
        for event in parse_events("\n".join(raw) + "\n"):
            if isinstance(event, dict):
                for choice in event.get("choices", []):
                    text.append(choice.get("delta", {}).get("content", ""))
                usage = event.get("usage") or usage
    print(f"server ready: {json.dumps(health)}")
    print(f"request: POST {url}/v1/chat/completions")
    print(json.dumps(body, indent=2))
    print(f"answer: {''.join(text)!r}")
    print(f"time to first token: {ttft * 1000:.1f} ms" if ttft is not None else "time to first token: n/a")
    print(f"total: {total * 1000:.1f} ms; usage: {json.dumps(usage)}")
    return 0
