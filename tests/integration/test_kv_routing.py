"""KV-locality routing with real engines: requests sharing a prefix land where
its blocks are (from the engines' KV events, or in approximate mode from the
scheduler's own memory), and the engines confirm the cache hits."""

from __future__ import annotations

import pytest

from tests.integration.test_disaggregated_serving import MODEL, token_prompt

pytestmark = pytest.mark.integration

PREFIX_TOKENS = 640  # 20 blocks of 32
PREFIXES = 3


def complete(apps, app, prompt):
    r = apps.post(app, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def cached_metrics(apps, app):
    return (
        apps.metric(app, "orchestrator_predicted_cached_prompt_tokens_total"),
        apps.metric(app, "orchestrator_engine_cached_prompt_tokens_total"),
    )


def _second_requests_hit_the_cache(apps, app, seed, wait_for_index):
    hits = []
    for i in range(PREFIXES):
        prefix = token_prompt(PREFIX_TOKENS, seed=seed + i)
        blocks_before = apps.http.get(apps.url(app, "/pools")).json()["kv_index"]["blocks"]
        complete(apps, app, prefix + token_prompt(16, seed=seed + 100 + i))
        if wait_for_index:  # the engines' events must reach the index; nothing else feeds it here
            wanted = blocks_before + PREFIX_TOKENS // 32
            apps.wait_until(
                lambda wanted=wanted: apps.http.get(apps.url(app, "/pools")).json()["kv_index"]["blocks"] >= wanted,
                20,
                "the prefix's KV events",
            )
        predicted_before, engine_before = cached_metrics(apps, app)
        usage = complete(apps, app, prefix + token_prompt(16, seed=seed + 200 + i))
        predicted_after, engine_after = cached_metrics(apps, app)
        hits.append(
            (
                usage["prompt_tokens_details"]["cached_tokens"],
                predicted_after - predicted_before,
                engine_after - engine_before,
            )
        )
    return hits


def test_shared_prefixes_land_on_the_replica_holding_them_by_kv_events(apps):
    hits = _second_requests_hit_the_cache(apps, "disagg", seed=5000, wait_for_index=True)
    # With 2 decode replicas, chance alone would miss about half of these.
    assert hits == [(PREFIX_TOKENS, PREFIX_TOKENS, PREFIX_TOKENS)] * PREFIXES
    assert apps.metric("disagg", "orchestrator_kv_event_batches_total") > 0
    assert apps.metric("disagg", "orchestrator_kv_events_malformed_total") == 0


def test_approximate_mode_keeps_a_prefix_on_one_replica_without_events(apps):
    hits = _second_requests_hit_the_cache(apps, "approx", seed=6000, wait_for_index=False)
    assert hits == [(PREFIX_TOKENS, PREFIX_TOKENS, PREFIX_TOKENS)] * PREFIXES
    assert apps.metric("approx", "orchestrator_kv_event_batches_total") == 0
    assert apps.http.get(apps.url("approx", "/pools")).json()["kv_index"]["following"] == []


def test_a_short_unique_prompt_is_prefilled_on_the_decode_replica(apps):
    prefill_before = apps.settled_engine_stats("disagg", "prefill_pool")
    local_before = apps.metric(
        "disagg", "orchestrator_route_decisions_total", {"kind": "local_prefill", "reason": "short_uncached"}
    )
    complete(apps, "disagg", token_prompt(100, seed=7070))
    assert (
        apps.metric(
            "disagg", "orchestrator_route_decisions_total", {"kind": "local_prefill", "reason": "short_uncached"}
        )
        == local_before + 1
    )
    prefill_after = apps.settled_engine_stats("disagg", "prefill_pool")
    assert prefill_after["prompt_tokens_computed_total"] == prefill_before["prompt_tokens_computed_total"]


def test_every_live_replica_publishes_and_is_followed(apps):
    report = apps.http.get(apps.url("disagg", "/pools")).json()
    replicas = [r["replica_id"] for pool in report["pools"].values() for r in pool]
    assert sorted(report["kv_index"]["following"]) == sorted(replicas)
    assert all(
        r["info"]["kv_events_endpoint"].startswith("tcp://127.0.0.1:")
        for pool in report["pools"].values()
        for r in pool
    )
