"""Faults on the real CPU application: a failed KV transfer, a decode replica
killed mid-stream, an engine that crashes, a prefill replica that dies under
load. Each must cost time, never a request or a token. Runs last: it kills
replicas of the shared application (Serve replaces them)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from dataclasses import replace

import httpx
import psutil
import pytest
import ray
from ray import serve

from orchestrator.api import sse
from orchestrator.messages import EngineRequest, SamplingSpec
from tests.integration.test_disaggregated_serving import MODEL, completion_text, text_prompt, token_prompt

pytestmark = pytest.mark.integration


def _replicas(apps, pool):
    return {r["replica_id"]: r for r in apps.pools("disagg")[pool]}


def _wait_for_replicas(apps, pool, n, timeout_s=240):
    return apps.wait_until(
        lambda: len(_replicas(apps, pool)) >= n and _replicas(apps, pool), timeout_s, f"{n} live {pool} replicas"
    )


def _kill_replica_actor(pool, replica_id):
    ray.kill(ray.get_actor(f"SERVE_REPLICA::disagg#{pool}#{replica_id}", namespace="serve"), no_restart=True)


def _wait_gone(processes, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes):
        assert time.monotonic() < deadline, f"processes outlived their parent: {processes}"
        time.sleep(0.5)


class StreamInBackground:
    """A streamed completion read on a thread, so that the test can act mid-stream."""

    def __init__(self, apps, body):
        self.text, self.events, self.error = "", [], None
        self.chunks = 0
        self._thread = threading.Thread(target=self._run, args=(apps, body), daemon=True)
        self._thread.start()

    def _run(self, apps, body):
        try:
            with httpx.Client(timeout=300) as client:
                with client.stream("POST", apps.url("disagg", "/v1/completions"), json={**body, "stream": True}) as r:
                    raw = ""
                    for text in r.iter_text():
                        raw += text
                        self.chunks = raw.count("data: ")
            self.events = sse.parse_events(raw)
            self.text = "".join(e["choices"][0]["text"] for e in self.events[:-1] if e.get("choices"))
        except Exception as e:  # reported by the assertions
            self.error = e

    def wait_for_chunks(self, n, timeout_s=60):
        deadline = time.monotonic() + timeout_s
        while self.chunks < n:
            assert time.monotonic() < deadline and self._thread.is_alive(), "the stream never got going"
            time.sleep(0.05)

    def join(self):
        self._thread.join(300)
        assert self.error is None, self.error
        return self.text


def _serving_decode_replica(apps, timeout_s=10):
    def busy():
        return next(
            (rid for rid, r in _replicas(apps, "decode_pool").items() if r["stats"] and r["stats"]["num_running"]), None
        )

    return apps.wait_until(busy, timeout_s, "the decode replica serving the stream")


def test_a_failed_kv_transfer_is_computed_by_the_decode_engine(apps):
    prompt = tuple(token_prompt(700, seed=8080))
    request = EngineRequest(
        f"kvfail-{uuid.uuid4().hex}", prompt, SamplingSpec(max_tokens=16, temperature=0, ignore_eos=True)
    )
    expected = completion_text(
        apps, "agg", {"model": MODEL, "prompt": list(prompt), "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    )
    decode_before = apps.settled_engine_stats("disagg", "decode_pool")

    async def go():
        prefill = serve.get_deployment_handle("prefill_pool", "disagg")
        decode = serve.get_deployment_handle("decode_pool", "disagg").options(stream=True)
        result = await prefill.prefill.remote(request.for_prefill(None))
        # Point the decode engine at a prefill engine that is not there.
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed_port = s.getsockname()[1]
        params = {**result.kv_transfer.engine_params, "remote_port": closed_port, "remote_engine_id": uuid.uuid4().hex}
        bogus = replace(result.kv_transfer, engine_params=params)
        return "".join([c.text async for c in decode.generate.remote(request.for_decode(None, bogus))])

    assert asyncio.run(go()) == expected
    decode_after = apps.settled_engine_stats("disagg", "decode_pool")
    assert decode_after["kv_transfer_failures_total"] > decode_before["kv_transfer_failures_total"]
    assert decode_after["prompt_tokens_computed_total"] - decode_before["prompt_tokens_computed_total"] >= 700


def test_a_prefill_whose_decode_never_comes_frees_its_blocks_when_the_lease_lapses(apps):
    """vLLM's KV lease (`network.kv_lease_s`, 10 s in this app): the prefill replica holds a prompt's blocks
    for its decode replica, and frees them when no decode reads them in time."""
    usage = lambda: apps.engine_stats("disagg", "prefill_pool")["kv_cache_usage"]  # noqa: E731
    before = apps.settled_engine_stats("disagg", "prefill_pool")["kv_cache_usage"]
    prompt = tuple(token_prompt(700, seed=8181))
    request = EngineRequest(f"orphan-{uuid.uuid4().hex}", prompt, SamplingSpec(max_tokens=16, temperature=0))

    async def prefill_only():
        return await serve.get_deployment_handle("prefill_pool", "disagg").prefill.remote(request.for_prefill(None))

    result = asyncio.run(prefill_only())
    prefilled_at = time.monotonic()
    assert result.kv_transfer is not None and result.kv_transfer.num_tokens == 700
    apps.wait_until(lambda: usage() > before, 8, "the prefill replica holding the prompt's blocks")
    apps.wait_until(lambda: usage() <= before, 40, "the prompt's blocks freed once the lease lapsed")
    assert time.monotonic() - prefilled_at >= 8  # held for the lease (10 s, less a report's lag), not dropped


def test_a_decode_replica_killed_mid_stream_hands_the_stream_on(apps):
    _wait_for_replicas(apps, "decode_pool", 2)
    body = {
        "model": MODEL,
        "prompt": text_prompt(40, seed=31),
        "max_tokens": 1200,
        "temperature": 0,
        "ignore_eos": True,
    }
    expected = completion_text(apps, "agg", body)
    migrations_before = apps.metric("disagg", "orchestrator_decode_migrations_total")
    stream = StreamInBackground(apps, body)
    stream.wait_for_chunks(40)
    victim = _serving_decode_replica(apps)
    _kill_replica_actor("decode_pool", victim)
    assert stream.join() == expected  # nothing lost, nothing repeated
    assert apps.metric("disagg", "orchestrator_decode_migrations_total") == migrations_before + 1


def test_a_crashed_engine_migrates_its_stream_and_its_replica_is_replaced(apps):
    replicas = _wait_for_replicas(apps, "decode_pool", 2)
    body = {
        "model": MODEL,
        "prompt": text_prompt(40, seed=32),
        "max_tokens": 1200,
        "temperature": 0,
        "ignore_eos": True,
    }
    expected = completion_text(apps, "agg", body)
    stream = StreamInBackground(apps, body)
    stream.wait_for_chunks(40)
    victim = _serving_decode_replica(apps)
    replica_process = psutil.Process(replicas[victim]["info"]["pid"])
    engine_core = next(p for p in replica_process.children() if "EngineCore" in p.name())
    workers = engine_core.children(recursive=True)
    engine_core.kill()  # the OOM killer, a segfault
    assert stream.join() == expected
    _wait_gone(workers)  # no orphan engine processes
    # The replica's health check fails and Serve starts a new one in its place.
    apps.wait_until(
        lambda: victim not in _replicas(apps, "decode_pool") and len(_replicas(apps, "decode_pool")) == 2,
        300,
        "the crashed replica to be replaced",
    )


def test_a_prefill_replica_dying_under_load_costs_local_prefills_not_requests(apps):
    _wait_for_replicas(apps, "decode_pool", 2)
    (victim,) = _wait_for_replicas(apps, "prefill_pool", 1)
    bodies = [
        {
            "model": MODEL,
            "prompt": text_prompt(700, seed=900 + i),
            "max_tokens": 16,
            "temperature": 0,
            "ignore_eos": True,
        }
        for i in range(6)
    ]
    expected = [completion_text(apps, "agg", b) for b in bodies]
    fallbacks_before = apps.metric("disagg", "orchestrator_prefill_fallbacks_total")
    local_before = apps.metric("disagg", "orchestrator_route_decisions_total", {"reason": "no_prefill_replica"})

    async def load():
        async with httpx.AsyncClient(timeout=120) as client:

            async def one(b, delay):
                await asyncio.sleep(delay)
                r = await client.post(apps.url("disagg", "/v1/completions"), json=b)
                return r.status_code, r.json()["choices"][0]["text"] if r.status_code == 200 else r.text

            return await asyncio.gather(*(one(b, 0.3 * i) for i, b in enumerate(bodies)))

    def kill_soon():
        time.sleep(0.5)
        _kill_replica_actor("prefill_pool", victim)

    killer = threading.Thread(target=kill_soon)
    killer.start()
    results = asyncio.run(load())
    killer.join()
    assert results == [(200, e) for e in expected]
    # Requests in the prefill pool when it died fell back; later ones prefilled locally at once.
    fell_back = apps.metric("disagg", "orchestrator_prefill_fallbacks_total") - fallbacks_before
    routed_local = (
        apps.metric("disagg", "orchestrator_route_decisions_total", {"reason": "no_prefill_replica"}) - local_before
    )
    assert fell_back + routed_local >= 1
    # Serve replaces the replica; the index forgets the dead one's blocks.
    apps.wait_until(lambda: (set(_replicas(apps, "prefill_pool")) - {victim}) or None, 300, "a new prefill replica")
    report = apps.http.get(apps.url("disagg", "/pools")).json()
    assert victim not in report["kv_index"]["following"]
