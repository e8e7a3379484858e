"""The OpenAI API over fake pools: request translation, responses, SSE
framing, errors, disaggregation fallback and cancellation."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass
from typing import get_args

import pytest
from openai.types import Completion
from openai.types.completion_choice import CompletionChoice
from vllm.v1.engine import FinishReason as VllmFinishReason

from orchestrator.api import sse
from orchestrator.api.responses import Endpoint
from orchestrator.messages import FinishReason
from tests.factories import MODEL, OUT, FakePool, make_frontend, run, token_text


def _json(body) -> bytes:
    return json.dumps(body).encode()


async def _post(frontend, path: str, body, **kw):
    async with frontend.client() as c:
        if isinstance(body, (bytes, str)):
            return await c.post(path, content=body, headers={"content-type": "application/json"}, **kw)
        return await c.post(path, json=body, **kw)


def test_completion_runs_prefill_then_decode_with_the_transfer():
    fe = make_frontend()
    r = run(_post(fe, "/v1/completions", {"model": MODEL, "prompt": "a b c d", "max_tokens": 3, "temperature": 0}))
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["text"] == "".join(token_text(OUT + i) for i in range(3))
    assert body["choices"][0]["finish_reason"] == "length"
    # 4 prompt tokens, 3 generated; cached tokens as the prefill replica reported them.
    assert body["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 3,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 7},
    }
    (prefill,) = fe.prefill.prefills
    (decode,) = fe.decode.generates
    assert prefill.sampling.max_tokens == 1 and prefill.kv_transfer is None
    assert decode.kv_transfer is not None and decode.kv_transfer.num_tokens == 4
    assert decode.prompt_token_ids == prefill.prompt_token_ids
    assert decode.sampling.temperature == 0 and decode.sampling.max_tokens == 3
    assert fe.metric("orchestrator_kv_handoffs_total") == 1
    assert fe.metric("orchestrator_route_decisions_total", {"kind": "remote_prefill", "reason": "disaggregated"}) == 1
    assert fe.metric("orchestrator_requests_total", {"endpoint": "completions", "outcome": "success"}) == 1
    assert fe.metric("orchestrator_time_to_first_token_seconds_count") == 1
    assert fe.metric("orchestrator_inter_token_latency_seconds_count") == 2


def test_round_robin_spreads_requests_over_replicas():
    fe = make_frontend()
    for _ in range(4):
        run(_post(fe, "/v1/completions", {"model": MODEL, "prompt": "x y", "max_tokens": 1}))
    assert [r.target_replica for r in fe.decode.generates] == ["r0", "r1", "r0", "r1"]
    assert [r.target_replica for r in fe.prefill.prefills] == ["r0", "r1", "r0", "r1"]


def test_aggregated_mode_never_calls_a_prefill_pool():
    fe = make_frontend(disaggregated=False)
    r = run(_post(fe, "/v1/completions", {"model": MODEL, "prompt": "a b", "max_tokens": 2}))
    assert r.status_code == 200
    assert fe.decode.generates[0].kv_transfer is None
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert fe.metric("orchestrator_route_decisions_total", {"kind": "aggregated", "reason": "aggregated"}) == 1


def test_chat_renders_the_template_and_returns_a_message():
    fe = make_frontend()
    body = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi there"}]},
        ],
        "max_completion_tokens": 2,
    }
    r = run(_post(fe, "/v1/chat/completions", body))
    assert r.status_code == 200
    out = r.json()
    assert out["object"] == "chat.completion"
    assert out["choices"][0]["message"] == {"role": "assistant", "content": token_text(OUT) + token_text(OUT + 1)}
    # "<system> be brief <user> hi there <assistant>" is 7 words.
    assert out["usage"]["prompt_tokens"] == 7


def test_chat_without_max_tokens_may_use_the_rest_of_the_context():
    fe = make_frontend(max_model_len=20)
    r = run(_post(fe, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}))
    assert r.status_code == 200
    # "<user> hi <assistant>": 3 prompt tokens, 17 left.
    assert fe.decode.generates[0].sampling.max_tokens == 17


def test_streamed_completion_is_valid_sse_with_usage_last():
    fe = make_frontend()
    body = {
        "model": MODEL,
        "prompt": "a b c",
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    r = run(_post(fe, "/v1/completions", body))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse.parse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == [token_text(OUT + i) for i in range(3)]
    assert [c["choices"][0]["finish_reason"] for c in chunks[:-1]] == [None, None, "length"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert len({c["id"] for c in chunks}) == 1


def test_continuous_usage_stats_put_each_choices_usage_so_far_on_every_event():
    fe = make_frontend()
    options = {"include_usage": True, "continuous_usage_stats": True}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "n": 2}
    events = sse.parse_events(
        run(_post(fe, "/v1/chat/completions", {**body, "stream": True, "stream_options": options})).text
    )
    *choices, last, done = events
    assert done == "[DONE]" and last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    prompt = fe.decode.generates[0].prompt_token_ids
    for index in (0, 1):
        mine = [e for e in choices if e["choices"][0]["index"] == index]
        assert [e["usage"]["completion_tokens"] for e in mine] == [0, 1, 2, 3]  # the role's event first
        assert all(e["usage"]["prompt_tokens"] == len(prompt) for e in mine)
        assert all(e["usage"]["total_tokens"] == len(prompt) + e["usage"]["completion_tokens"] for e in mine)
    completion = {"model": MODEL, "prompt": "a b c", "max_tokens": 2, "stream": True, "stream_options": options}
    streamed = sse.parse_events(run(_post(fe, "/v1/completions", completion)).text)
    assert [e["usage"]["completion_tokens"] for e in streamed[:-2]] == [1, 2]
    without = {**options, "continuous_usage_stats": False}
    plain = sse.parse_events(run(_post(fe, "/v1/completions", {**completion, "stream_options": without})).text)
    assert [("usage" in e) for e in plain[:-1]] == [False, False, True]  # only the last


def test_streamed_chat_starts_with_the_role_and_ends_with_done():
    fe = make_frontend()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
    events = sse.parse_events(run(_post(fe, "/v1/chat/completions", body)).text)
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [e["choices"][0]["delta"].get("content") for e in events[1:-1]] == [token_text(OUT), token_text(OUT + 1)]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1] == "[DONE]"
    assert all("usage" not in e for e in events[:-1])


@pytest.mark.parametrize(
    "body, status, param",
    [
        (b"{not json", 400, None),
        ([1, 2], 400, None),
        ({"model": "other", "prompt": "a"}, 404, "model"),
        ({"model": MODEL}, 400, "prompt"),
        ({"model": MODEL, "prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "a", "max_tokens": "many"}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "a", "temperature": 3}, 400, "temperature"),
        ({"model": MODEL, "prompt": "a", "n": 17}, 400, "n"),
        ({"model": MODEL, "prompt": "a", "prompt_logprobs": 1, "stream": True}, 400, "prompt_logprobs"),
        ({"model": MODEL, "prompt": "a", "prompt_logprobs": 21}, 400, "prompt_logprobs"),
        ({"model": MODEL, "prompt": "a", "prompt_logprobs": -1}, 400, "prompt_logprobs"),
        ({"model": MODEL, "prompt": "a", "prompt_logprobs": -2}, 400, "prompt_logprobs"),
        ({"model": MODEL, "prompt": "a", "best_of": 2}, 400, "best_of"),
        ({"model": MODEL, "prompt": "a", "suffix": "z"}, 400, "suffix"),
        ({"model": MODEL, "prompt": "a", "logprobs": 21}, 400, "logprobs"),
        ({"model": MODEL, "prompt": "a", "logit_bias": {"x": 1}}, 400, "logit_bias"),
        ({"model": MODEL, "prompt": "a", "logit_bias": {"100000": 1}}, 400, "logit_bias"),
        ({"model": MODEL, "prompt": "a", "response_format": {"type": "json_schema"}}, 400, "response_format"),
        ({"model": MODEL, "prompt": "a", "structured_outputs": {}}, 400, "structured_outputs"),
        ({"model": MODEL, "prompt": "a", "frobnicate": 1}, 400, "frobnicate"),
        ({"model": MODEL, "prompt": ["a", ""]}, 400, "prompt"),
        ({"model": MODEL, "prompt": ["a"] * 65}, 400, "prompt"),
        ({"model": MODEL, "prompt": ""}, 400, "prompt"),
        ({"model": MODEL, "prompt": "a", "stop": [""]}, 400, "stop"),
        ({"model": MODEL, "prompt": [5, 1000]}, 400, "prompt"),
        ({"model": MODEL, "prompt": [-1]}, 400, "prompt"),
        ({"model": MODEL, "prompt": "a", "max_tokens": 65}, 400, "max_tokens"),  # beyond max_model_len
        ({"model": MODEL, "prompt": " ".join(["w"] * 64)}, 400, "prompt"),
    ],
)
def test_bad_completion_requests_get_openai_errors_and_reach_no_engine(body, status, param):
    fe = make_frontend()
    r = run(_post(fe, "/v1/completions", body))
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert not fe.decode.generates and not fe.prefill.prefills
    assert fe.metric("orchestrator_requests_total", {"endpoint": "completions", "outcome": "client_error"}) == 1
    # The server keeps serving.
    ok = run(_post(fe, "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 1}))
    assert ok.status_code == 200


@pytest.mark.parametrize(
    "body, param",
    [
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({"model": MODEL, "messages": [{"role": "user"}]}, "messages.0.content"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
            "tools.0.function",
        ),
        (
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"function": {"description": "d"}}],
            },
            "tools.0.function.name",
        ),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "f"}}]},
            "tool_choice",
        ),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, "tool_choice"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
            "top_logprobs",
        ),
    ],
)
def test_bad_chat_requests_name_the_field(body, param):
    fe = make_frontend()
    r = run(_post(fe, "/v1/chat/completions", body))
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param


def test_unknown_routes_and_methods_get_openai_errors():
    fe = make_frontend()

    async def go():
        async with fe.client() as c:
            return await c.get("/v1/nothing"), await c.get("/v1/completions")

    missing, wrong_method = run(go())
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


def test_models_and_metrics_endpoints():
    fe = make_frontend()

    async def go():
        async with fe.client() as c:
            return await c.get("/v1/models"), await c.get("/metrics"), await c.get("/health")

    models, metrics, health = run(go())
    assert models.json()["data"][0]["id"] == MODEL
    assert 'orchestrator_pool_replicas{pool="decode_pool"} 2.0' in metrics.text
    assert health.status_code == 200


def test_failing_prefill_falls_back_to_a_local_prefill_and_is_counted():
    fe = make_frontend(prefill=FakePool("prefill_pool", prefill_error=RuntimeError("prefill replica died")))
    r = run(_post(fe, "/v1/completions", {"model": MODEL, "prompt": "a b c", "max_tokens": 2}))
    assert r.status_code == 200
    assert r.json()["choices"][0]["text"] == token_text(OUT) + token_text(OUT + 1)
    assert fe.decode.generates[0].kv_transfer is None  # prefilled locally
    assert fe.metric("orchestrator_prefill_fallbacks_total", {"reason": "error"}) == 1
    assert fe.metric("orchestrator_kv_handoffs_total") == 0


def test_with_no_live_prefill_replica_the_decode_replica_prefills_at_once():
    fe = make_frontend(prefill=FakePool("prefill_pool", replica_ids=()))
    r = run(_post(fe, "/v1/completions", {"model": MODEL, "prompt": "a b", "max_tokens": 1}))
    assert r.status_code == 200
    assert not fe.prefill.prefills and fe.decode.generates[0].kv_transfer is None
    assert (
        fe.metric("orchestrator_route_decisions_total", {"kind": "local_prefill", "reason": "no_prefill_replica"}) == 1
    )


def test_slow_prefill_times_out_and_falls_back():
    fe = make_frontend(prefill_timeout_s=0.05, prefill=FakePool("prefill_pool", prefill_delay_s=10))
    r = run(_post(fe, "/v1/completions", {"model": MODEL, "prompt": "a b c", "max_tokens": 1}))
    assert r.status_code == 200
    assert fe.decode.generates[0].kv_transfer is None
    assert fe.metric("orchestrator_prefill_fallbacks_total", {"reason": "timeout"}) == 1


def test_decode_failure_mid_stream_ends_the_stream_with_an_error_event():
    fe = make_frontend(decode=FakePool("decode_pool", generate_error_after=1))
    body = {"model": MODEL, "prompt": "a", "max_tokens": 4, "stream": True}
    events = sse.parse_events(run(_post(fe, "/v1/completions", body)).text)
    assert events[0]["choices"][0]["text"] == token_text(OUT)
    assert events[-2]["error"]["type"] == "server_error"
    assert events[-1] == "[DONE]"
    assert fe.metric("orchestrator_requests_total", {"endpoint": "completions", "outcome": "server_error"}) == 1


def test_an_engine_rejection_is_a_400_with_the_engine_message_only():
    from orchestrator.engines.base import EngineRequestRejected

    class RemoteRejection(EngineRequestRejected):  # how a transport wraps a replica's exception
        def __init__(self):
            super().__init__("Traceback (most recent call last): ... long remote trace")
            self.cause = EngineRequestRejected("prompt too long for the engine")

    fe = make_frontend(decode=FakePool("decode_pool", generate_error_after=0))
    fe.decode.generate_error = RemoteRejection()
    r = run(_post(fe, "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 2}))
    assert r.status_code == 400 and r.json()["error"]["message"] == "prompt too long for the engine"


def test_decode_failure_without_streaming_is_a_500():
    fe = make_frontend(decode=FakePool("decode_pool", generate_error_after=0))
    r = run(_post(fe, "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 2}))
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"


def test_closing_a_stream_early_closes_the_decode_call():
    fe = make_frontend(max_model_len=4096, decode=FakePool("decode_pool", chunk_delay_s=0.01))

    async def go():
        stream = await fe.service.handle(
            Endpoint.COMPLETIONS, _json({"model": MODEL, "prompt": "a", "max_tokens": 1000, "stream": True})
        )
        got = [await anext(stream) for _ in range(3)]
        await stream.aclose()
        return got

    got = run(go())
    assert len(got) == 3
    assert fe.decode.closed == [fe.decode.generates[0].request_id]
    assert fe.metric("orchestrator_requests_total", {"endpoint": "completions", "outcome": "cancelled"}) == 1


def test_cancelling_a_whole_request_closes_the_decode_call():
    fe = make_frontend(max_model_len=4096, decode=FakePool("decode_pool", chunk_delay_s=0.01))

    async def go():
        task = asyncio.create_task(
            fe.service.handle(Endpoint.COMPLETIONS, _json({"model": MODEL, "prompt": "a", "max_tokens": 1000}))
        )
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(go())
    assert len(fe.decode.closed) == 1
    assert fe.decode.generates[0].sampling.max_tokens == 1000


def test_stop_and_sampling_fields_reach_the_engine_request():
    fe = make_frontend()
    body = {
        "model": MODEL,
        "prompt": "a",
        "max_tokens": 2,
        "stop": "END",
        "top_k": -1,
        "top_p": 0.5,
        "seed": 3,
        "ignore_eos": True,
        "min_tokens": 1,
        "stop_token_ids": [5],
        "repetition_penalty": 1.1,
    }
    assert run(_post(fe, "/v1/completions", body)).status_code == 200
    s = fe.decode.generates[0].sampling
    assert (s.stop, s.top_k, s.top_p, s.seed, s.ignore_eos, s.min_tokens, s.stop_token_ids, s.repetition_penalty) == (
        ("END",),
        None,
        0.5,
        3,
        True,
        1,
        (5,),
        1.1,
    )
    assert fe.prefill.prefills[0].sampling.min_tokens == 0


@dataclass
class _EndingWith(FakePool):
    """A decode pool whose outputs end with `reason` (FakePool's end on max_tokens or a stop string)."""

    reason: FinishReason = FinishReason.STOP

    async def generate(self, request, view=None):
        async for chunk in super().generate(request, view):
            yield dataclasses.replace(chunk, finish_reason=self.reason) if chunk.finished else chunk


def test_finish_reasons_are_the_strings_vllms_server_shows_its_clients():
    """Our finish reasons are those vLLM's engine reports (`str()` of its FinishReason: its
    RequestOutput's `finish_reason`) but "error", which vLLM's server answers with a 500 instead of
    showing. Each reaches the client as that string, and an answer ending with one that OpenAI's
    client types too parses as the `openai` package's own `Completion`."""
    shown = [r for r in VllmFinishReason if r is not VllmFinishReason.ERROR]
    assert {r.value for r in FinishReason} == {str(r) for r in shown}
    openai_typed = set(get_args(CompletionChoice.model_fields["finish_reason"].annotation))
    assert openai_typed & {str(r) for r in shown}  # stop and length
    for vllm_reason in shown:
        fe = make_frontend(decode=_EndingWith("decode_pool", reason=FinishReason(str(vllm_reason))))
        body = run(_post(fe, "/v1/completions", {"model": MODEL, "prompt": "a b", "max_tokens": 2})).json()
        assert body["choices"][0]["finish_reason"] == str(vllm_reason)
        if str(vllm_reason) in openai_typed:
            assert Completion.model_validate(body).choices[0].finish_reason == str(vllm_reason)


def test_sse_events_stay_on_one_line_whatever_the_text():
    text = "a\u2028b\u2029c\u0085d\ne\rf"
    line = sse.event({"choices": [{"text": text}]})
    assert line.endswith("\n\n") and len(line[:-2].splitlines()) == 1
    assert sse.parse_events(line) == [{"choices": [{"text": text}]}]


def test_a_decode_replica_failing_mid_stream_is_migrated_without_a_gap():
    fe = make_frontend(decode=FakePool("decode_pool", generate_error_after=3, failing_replica="r0"))
    body = {"model": MODEL, "prompt": "a b c", "max_tokens": 8, "stream": True}
    events = sse.parse_events(run(_post(fe, "/v1/completions", body)).text)
    text = "".join(e["choices"][0]["text"] for e in events[:-1] if "choices" in e and e["choices"])
    assert text == "".join(token_text(OUT + i) for i in range(8))  # no token lost or repeated
    first, second = fe.decode.generates
    assert first.target_replica == "r0" and second.target_replica == "r1"
    assert second.prompt_token_ids == first.prompt_token_ids + tuple(OUT + i for i in range(3))
    assert second.sampling.max_tokens == 5
    assert fe.metric("orchestrator_decode_migrations_total") == 1


def test_a_migrated_stream_text_is_the_frontends_not_the_new_engines():
    decode = FakePool("decode_pool", generate_error_after=3, failing_replica="r0", continuation_seam_text="<prompt>")
    fe = make_frontend(decode=decode)
    body = {"model": MODEL, "prompt": "a b c", "max_tokens": 8, "stream": True}
    events = sse.parse_events(run(_post(fe, "/v1/completions", body)).text)
    text = "".join(e["choices"][0]["text"] for e in events[:-1] if "choices" in e and e["choices"])
    assert text == "".join(token_text(OUT + i) for i in range(8))


def test_migration_is_bounded_and_then_the_error_reaches_the_client():
    fe = make_frontend(decode=FakePool("decode_pool", generate_error_after=1))  # every replica fails
    r = run(_post(fe, "/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 8}))
    assert r.status_code == 500
    assert len(fe.decode.generates) == 3  # the first try and 2 migrations
    assert fe.metric("orchestrator_decode_migrations_total") == 2


def test_return_token_ids_carries_the_output_and_prompt_ids_as_vllms_server_does():
    fe = make_frontend(max_model_len=4096)
    body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2, "return_token_ids": True}

    async def go():
        async with fe.client() as c:
            whole = (await c.post("/v1/completions", json=body)).json()
            streamed = await c.post("/v1/completions", json=body | {"stream": True})
            chat = await c.post(
                "/v1/chat/completions",
                json={
                    "model": MODEL,
                    "messages": [{"role": "user", "content": "a b"}],
                    "max_tokens": 2,
                    "return_token_ids": True,
                    "stream": True,
                },
            )
            return whole, streamed.text, chat.text

    whole, streamed, chat = run(go())
    assert whole["choices"][0]["token_ids"] == [5000, 5001] and whole["choices"][0]["prompt_token_ids"] == [1, 2, 3]
    events = [e for e in sse.parse_events(streamed) if isinstance(e, dict)]
    assert [e["choices"][0]["token_ids"] for e in events] == [[5000], [5001]]
    assert (
        events[0]["choices"][0]["prompt_token_ids"] == [1, 2, 3] and "prompt_token_ids" not in events[1]["choices"][0]
    )
    chat_events = [e for e in sse.parse_events(chat) if isinstance(e, dict)]
    assert chat_events[0]["prompt_token_ids"] and [e["choices"][0]["token_ids"] for e in chat_events[1:]] == [
        [5000],
        [5001],
    ]


def test_the_stop_string_that_ended_an_answer_is_its_stop_reason_as_vllm_reports_it():
    fe = make_frontend(decode=FakePool("decode_pool", script=("a", "b")))
    body = {"model": MODEL, "prompt": "x y", "max_tokens": 5, "stop": ["END"]}
    whole = run(_post(fe, "/v1/completions", body)).json()["choices"][0]
    assert (whole["finish_reason"], whole["stop_reason"]) == ("stop", "END")
    long = run(_post(fe, "/v1/completions", {**body, "max_tokens": 1})).json()["choices"][0]
    assert (long["finish_reason"], long["stop_reason"]) == ("length", None)
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stop": "END"}
    events = sse.parse_events(run(_post(fe, "/v1/chat/completions", {**chat, "stream": True})).text)[:-1]
    # As vLLM streams chat: the finishing delta alone says what stopped it.
    assert [e["choices"][0].get("stop_reason", "-") for e in events] == ["-", "-", "END"]
    assert run(_post(fe, "/v1/chat/completions", chat)).json()["choices"][0]["stop_reason"] == "END"
    streamed = sse.parse_events(run(_post(fe, "/v1/completions", {**body, "stream": True})).text)[:-1]
    assert [e["choices"][0]["stop_reason"] for e in streamed] == [None, "END"]  # completions: on every chunk
