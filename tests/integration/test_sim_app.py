"""The disaggregated application on simulated engines (configs/disagg-sim.yaml,
2 prefill + 2 decode simulated H100 replicas) through Ray Serve: the real
frontend, scheduler and KV index in front of them, over HTTP."""

from __future__ import annotations

import pytest

from tests.integration.test_disaggregated_serving import completion_text, token_prompt

pytestmark = pytest.mark.integration

SIM_MODEL = "sim-llama-3.1-8b"
PREFIX_TOKENS = 640  # 20 blocks of 32


def complete(apps, prompt, max_tokens=4, **extra):
    body = {"model": SIM_MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    r = apps.post("sim", "/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_simulated_app_answers_completions_and_chat_whole_and_streamed(apps):
    prompt = token_prompt(300, seed=9100)
    whole = complete(apps, prompt, max_tokens=12)
    assert whole["usage"]["completion_tokens"] == 12 and whole["choices"][0]["finish_reason"] == "length"
    # Output is a function of the context, like greedy decoding: the same prompt streams the same text.
    body = {"model": SIM_MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0, "stream": True}
    assert completion_text(apps, "sim", body) == whole["choices"][0]["text"]
    chat = apps.post(
        "sim",
        "/v1/chat/completions",
        {"model": SIM_MODEL, "messages": [{"role": "user", "content": "route the prompt"}], "max_tokens": 5},
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["usage"]["completion_tokens"] == 5


def test_a_long_prompt_is_prefilled_remotely_and_its_kv_handed_to_decode(apps):
    decode_before = apps.settled_engine_stats("sim", "decode_pool")
    prefill_before = apps.settled_engine_stats("sim", "prefill_pool")
    complete(apps, token_prompt(900, seed=9200))
    decode_after = apps.settled_engine_stats("sim", "decode_pool")
    prefill_after = apps.settled_engine_stats("sim", "prefill_pool")
    assert prefill_after["prompt_tokens_computed_total"] - prefill_before["prompt_tokens_computed_total"] == 900
    assert decode_after["kv_transfers_total"] == decode_before["kv_transfers_total"] + 1
    assert decode_after["prompt_tokens_transferred_total"] - decode_before["prompt_tokens_transferred_total"] == 899


def frontend_reports(apps, tries=40) -> dict[str, dict]:
    """/pools of each frontend replica (Serve's proxy picks one per request)."""
    reports = {}
    for _ in range(tries):
        report = apps.http.get(apps.url("sim", "/pools")).json()
        reports[report["frontend_replica"]] = report
        if len(reports) == 2:
            break
    return reports


def test_shared_prefixes_land_where_the_simulated_engines_events_say_they_are(apps):
    hits = []
    for i in range(3):
        prefix = token_prompt(PREFIX_TOKENS, seed=9300 + i)
        before = {f: r["kv_index"]["blocks"] for f, r in frontend_reports(apps).items()}
        complete(apps, prefix + token_prompt(16, seed=9400 + i))
        # Only the engines' events feed the indexes here (no route memory): both
        # frontends must learn the prefix, whichever one routed it.
        apps.wait_until(
            lambda before=before: all(
                r["kv_index"]["blocks"] >= before.get(f, 0) + PREFIX_TOKENS // 32
                for f, r in frontend_reports(apps).items()
            ),
            20,
            "the prefix's KV events",
        )
        usage = complete(apps, prefix + token_prompt(16, seed=9500 + i))["usage"]
        hits.append(usage["prompt_tokens_details"]["cached_tokens"])
    # With 2 decode replicas, chance alone would miss about half of these.
    assert hits == [PREFIX_TOKENS] * 3
    reports = frontend_reports(apps)
    assert len(reports) == 2
    for report in reports.values():
        replicas = [r["replica_id"] for pool in report["pools"].values() for r in pool]
        assert sorted(report["kv_index"]["following"]) == sorted(replicas)
    assert apps.metric("sim", "orchestrator_kv_events_malformed_total") == 0
