"""The SLA planner acting through Ray Serve's autoscaling on the simulated
application: a load step grows the pool that is the bottleneck, and the pool
shrinks again once the load is gone, with every request answered."""

from __future__ import annotations

import random
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.integration

SIM_MODEL = "sim-llama-3.1-8b"


class Load:
    """Requests at a fixed rate on a thread, each checked for a full answer."""

    def __init__(self, apps, app: str, model: str, isl: int, osl: int, rate: float, seconds: float, seed: int) -> None:
        self.results: list[tuple[int, int]] = []  # (status, completion tokens)
        self._threads = []
        rng = random.Random(seed)
        url = apps.url(app, "/v1/completions")

        def one(prompt):
            body = {"model": model, "prompt": prompt, "max_tokens": osl, "ignore_eos": True}
            try:
                r = httpx.post(url, json=body, timeout=300)
                tokens = r.json()["usage"]["completion_tokens"] if r.status_code == 200 else 0
                self.results.append((r.status_code, tokens))
            except Exception:  # counted as lost below
                self.results.append((0, 0))

        def send():
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                prompt = [rng.randrange(10, 600) for _ in range(isl)]
                t = threading.Thread(target=one, args=(prompt,), daemon=True)
                t.start()
                self._threads.append(t)
                time.sleep(1 / rate)

        self._sender = threading.Thread(target=send, daemon=True)
        self._sender.start()

    def join(self) -> list[tuple[int, int]]:
        self._sender.join()
        for t in self._threads:
            t.join(300)
        return self.results


def replica_counts(apps, app: str) -> tuple[int, int]:
    pools = apps.pools(app)
    return len(pools.get("prefill_pool", [])), len(pools.get("decode_pool", []))


def scale_cycle(apps, app, model, isl, osl, rate, grown: tuple[int, int], seed: int, seconds: float = 30,
                start_s: float = 60):
    """`start_s`: how long a new replica may take to come up and serve."""
    apps.wait_until(lambda: replica_counts(apps, app) == (1, 1), 120, "1 prefill + 1 decode replica")
    load = Load(apps, app, model, isl, osl, rate, seconds=seconds, seed=seed)
    apps.wait_until(lambda: replica_counts(apps, app) == grown, start_s, f"the planner to reach {grown}")
    results = load.join()
    apps.wait_until(lambda: replica_counts(apps, app) == (1, 1), 120, "the pools to shrink back")
    assert results and all(r == (200, osl) for r in results), [r for r in results if r != (200, osl)]


def test_prefill_heavy_load_grows_the_prefill_pool_then_shrinks_it(apps):
    # 6 req/s x 4000 prompt tokens: over two simulated H100s' prefill within a 500 ms p99 TTFT.
    scale_cycle(apps, "planner", SIM_MODEL, isl=4000, osl=4, rate=6, grown=(2, 1), seed=1)


def test_long_outputs_grow_the_decode_pool_then_shrink_it(apps):
    # 3 req/s x 200 output tokens at 2000 tokens of context: 4 sequences fit a decode replica's KV.
    scale_cycle(apps, "planner", SIM_MODEL, isl=2000, osl=200, rate=3, grown=(1, 2), seed=2)
