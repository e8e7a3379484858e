"""Overload is turned away at the door: offered far more than it admits, the
app answers what it admitted in full and rejects the rest at once with 429
and Retry-After; nothing piles up in front of the admission gate (HAProxy,
the frontend's HTTP server), so the client's in-flight count stays bounded."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

pytestmark = pytest.mark.integration

LIMIT = 16  # the overload app's frontend.max_in_flight (conftest)
RATE = 50.0  # requests/s offered; each admitted one streams for about a second
SECONDS = 4.0


async def _offer(url: str, model: str) -> dict:
    outcomes: dict[str, int] = {}
    rejected_s: list[float] = []
    in_flight = {"now": 0, "max": 0}

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=1024)) as client:

        async def one(i: int) -> None:
            start = time.perf_counter()
            in_flight["now"] += 1
            in_flight["max"] = max(in_flight["max"], in_flight["now"])
            body = {
                "model": model,
                "prompt": [10 + (i * 7 + k) % 400 for k in range(64)],
                "max_tokens": 200,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            try:
                async with client.stream("POST", url, json=body) as r:
                    text = (await r.aread()).decode()
                if r.status_code == 429:
                    rejected_s.append(time.perf_counter() - start)
                    kind = "rejected" if r.headers.get("retry-after") and '"rate_limit_exceeded"' in text else "bad_429"
                elif r.status_code == 200 and '"completion_tokens":200' in text and text.endswith("data: [DONE]\n\n"):
                    kind = "answered"
                else:
                    kind = f"lost_{r.status_code}"
            except httpx.HTTPError as e:
                kind = f"lost_{type(e).__name__}"
            finally:
                in_flight["now"] -= 1
            outcomes[kind] = outcomes.get(kind, 0) + 1

        tasks = []
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < SECONDS:
            tasks.append(asyncio.create_task(one(i)))
            i += 1
            await asyncio.sleep(1 / RATE)
        await asyncio.gather(*tasks)
    return {"outcomes": outcomes, "rejected_s": rejected_s, "in_flight_max": in_flight["max"], "sent": i}


def test_overload_is_rejected_fast_and_nothing_queues_before_admission(apps):
    model = apps.http.get(apps.url("overload", "/v1/models")).json()["data"][0]["id"]
    rejected_before = apps.metric("overload", "orchestrator_requests_total", {"outcome": "rejected"})
    run = asyncio.run(_offer(apps.url("overload", "/v1/completions"), model))
    outcomes = run["outcomes"]
    assert set(outcomes) <= {"answered", "rejected"}, (
        outcomes
    )  # nothing lost, every 429 an OpenAI error with Retry-After
    assert outcomes.get("answered", 0) >= LIMIT and outcomes.get("rejected", 0) >= run["sent"] // 3, outcomes
    assert run["in_flight_max"] <= 2 * LIMIT, run["in_flight_max"]
    assert np.percentile(run["rejected_s"], 99) < 0.25, sorted(run["rejected_s"])[-5:]
    rejected = apps.metric("overload", "orchestrator_requests_total", {"outcome": "rejected"}) - rejected_before
    assert rejected == outcomes["rejected"]
    # And it keeps serving.
    r = apps.post("overload", "/v1/completions", {"model": model, "prompt": "hi", "max_tokens": 4})
    assert r.status_code == 200
