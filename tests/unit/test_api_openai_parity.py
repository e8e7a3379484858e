"""OpenAI parameters beyond the basics over fake pools: n, batched prompts, echo,
logprobs, prompt logprobs, logit_bias, structured outputs and forced tool calls. What the
engine is asked for, and what the client gets, whole and streamed."""

from __future__ import annotations

import json

from orchestrator.engines.base import EngineRequestRejected
from orchestrator.messages import RepetitionDetection, StructuredKind, StructuredOutput
from tests.factories import (
    MODEL,
    OUT,
    FakePool,
    chat,
    json_events,
    make_frontend,
    post,
    tiny_tokenizer,
    token_text,
)


def _completion(fe, **body):
    return post(fe, "/v1/completions", {"model": MODEL, **body})


def _chat(fe, **body):
    return chat(fe, "hi", **body)


def test_n_samples_share_one_remote_prefill_and_follow_its_decode_replica():
    fe = make_frontend()
    r = _completion(fe, prompt="a b c d", max_tokens=2, n=3, seed=7)
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert len(fe.prefill.prefills) == 1  # one prompt, one prefill
    lead, *siblings = fe.decode.generates
    assert lead.kv_transfer is not None
    assert all(s.kv_transfer is None and s.target_replica == lead.target_replica for s in siblings)
    assert sorted(g.sampling.seed for g in fe.decode.generates) == [7, 8, 9]  # vLLM's child seeds
    assert fe.metric("orchestrator_route_decisions_total", {"kind": "local_prefill", "reason": "sibling_sample"}) == 2
    assert body["usage"]["prompt_tokens"] == 4 and body["usage"]["completion_tokens"] == 6


def test_batched_prompts_get_one_choice_each_per_sample_in_order():
    fe = make_frontend()
    body = _completion(fe, prompt=["a b", "c d e"], max_tokens=1, n=2).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    prompts = {g.request_id: len(g.prompt_token_ids) for g in fe.decode.generates}
    assert prompts == {"req0-0": 2, "req0-1": 2, "req0-2": 3, "req0-3": 3}
    assert body["usage"]["prompt_tokens"] == 5 and body["usage"]["completion_tokens"] == 4


def test_streamed_samples_carry_their_index_and_each_finishes():
    fe = make_frontend()
    events = json_events(_chat(fe, max_tokens=2, n=2, stream=True))
    roles = [e["choices"][0]["index"] for e in events if e["choices"][0]["delta"].get("role")]
    assert roles == [0, 1]
    for index in (0, 1):
        mine = [e["choices"][0] for e in events if e["choices"][0]["index"] == index]
        assert "".join(c["delta"].get("content", "") for c in mine) == token_text(OUT) + token_text(OUT + 1)
        assert mine[-1]["finish_reason"] == "length"


def test_echo_writes_the_prompt_before_the_output_whole_and_streamed():
    fe = make_frontend(disaggregated=False)
    whole = _completion(fe, prompt=[11, 12], max_tokens=1, echo=True).json()
    assert whole["choices"][0]["text"] == token_text(11) + token_text(12) + token_text(OUT)
    streamed = json_events(_completion(fe, prompt=[11, 12], max_tokens=2, echo=True, stream=True))
    assert [e["choices"][0]["text"] for e in streamed] == [
        token_text(11) + token_text(12) + token_text(OUT),
        token_text(OUT + 1),
    ]


def test_an_echo_with_max_tokens_0_scores_the_prompt_alone_whole_and_streamed():
    """vLLM's echo without generation (evaluation harnesses' log-likelihood requests): the engine
    samples one token, which the answer leaves out; the text and logprobs are the prompt's."""
    fe = make_frontend(disaggregated=False)
    whole = _completion(fe, prompt=[11, 12, 13], max_tokens=0, echo=True, logprobs=1).json()
    choice = whole["choices"][0]
    assert choice["text"] == token_text(11) + token_text(12) + token_text(13)
    assert choice["logprobs"]["tokens"] == [token_text(11), token_text(12), token_text(13)]
    assert choice["logprobs"]["token_logprobs"] == [None, -1.5, -1.5]
    assert choice["finish_reason"] == "length" and whole["usage"]["completion_tokens"] == 1  # as vLLM counts it
    assert fe.decode.generates[-1].sampling.max_tokens == 1
    streamed = json_events(_completion(fe, prompt=[11, 12, 13], max_tokens=0, echo=True, logprobs=1, stream=True))
    assert "".join(e["choices"][0]["text"] for e in streamed) == choice["text"]
    assert [t for e in streamed for t in e["choices"][0]["logprobs"]["tokens"]] == choice["logprobs"]["tokens"]
    refused = _completion(fe, prompt=[11, 12], max_tokens=0)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"


def test_max_tokens_past_the_context_is_clamped_and_null_is_16_as_vllm_reads_them():
    fe = make_frontend(max_model_len=64)
    assert _completion(fe, prompt="a b c d", max_tokens=64).status_code == 200
    assert fe.decode.generates[-1].sampling.max_tokens == 60  # what the 4-token prompt leaves
    assert _completion(fe, prompt="a b", max_tokens=None).status_code == 200
    assert fe.decode.generates[-1].sampling.max_tokens == 16  # vLLM's completions default
    too_many = _completion(fe, prompt="a b", max_tokens=65)
    assert too_many.status_code == 400
    assert too_many.json()["error"]["message"].startswith("max_tokens=65 cannot be greater than max_model_len=64")


def test_completion_logprobs_in_vllms_form_whole_equals_streamed():
    fe = make_frontend()
    whole = _completion(fe, prompt="a b", max_tokens=2, logprobs=2).json()["choices"][0]["logprobs"]
    assert whole["tokens"] == [token_text(OUT), token_text(OUT + 1)]
    assert whole["token_logprobs"] == [-0.5, -0.5]
    assert whole["text_offset"] == [0, len(token_text(OUT))]
    assert whole["top_logprobs"][0] == {token_text(OUT): -0.5, "t0": -1.0}  # the sampled token, then the top ranks
    streamed = [
        e["choices"][0]["logprobs"]
        for e in json_events(_completion(fe, prompt="a b", max_tokens=2, logprobs=2, stream=True))
    ]
    assert [s["text_offset"][0] for s in streamed] == whole["text_offset"]
    assert [s["top_logprobs"][0] for s in streamed] == whole["top_logprobs"]
    (prefill,) = fe.prefill.prefills[-1:]
    assert prefill.sampling.logprobs is None  # the decode replica samples the first token


def test_chat_logprobs_with_top_logprobs_whole_equals_streamed():
    fe = make_frontend()
    whole = _chat(fe, max_tokens=2, logprobs=True, top_logprobs=2).json()["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in whole] == [token_text(OUT), token_text(OUT + 1)]
    assert whole[0]["bytes"] == list(token_text(OUT).encode())
    assert [t["token"] for t in whole[0]["top_logprobs"]] == [token_text(OUT), "t0"]
    events = json_events(_chat(fe, max_tokens=2, logprobs=True, top_logprobs=2, stream=True))
    streamed = [c for e in events if e["choices"][0]["logprobs"] for c in e["choices"][0]["logprobs"]["content"]]
    assert streamed == whole
    plain = _chat(fe, max_tokens=1, logprobs=True).json()["choices"][0]["logprobs"]["content"][0]
    assert plain["top_logprobs"] == [] and plain["logprob"] == -0.5
    assert fe.decode.generates[-1].sampling.logprobs == 0


def test_logprob_token_ids_list_those_tokens_after_the_sampled_one_whole_and_streamed():
    """vLLM's `logprob_token_ids`: every position lists the sampled token, then the asked tokens (all the
    engine scored, whatever top_logprobs / logprobs say); chat needs logprobs: true, as vLLM."""
    fe = make_frontend()
    body = {"max_tokens": 2, "logprobs": True, "logprob_token_ids": [9, 3]}
    whole = _chat(fe, **body).json()["choices"][0]["logprobs"]["content"]
    assert [[t["token"] for t in c["top_logprobs"]] for c in whole] == [[token_text(OUT), "t9", "t3"]] + [
        [token_text(OUT + 1), "t9", "t3"]
    ]
    asked = fe.decode.generates[-1].sampling
    assert asked.logprob_token_ids == (9, 3) and fe.prefill.prefills[-1].sampling.logprob_token_ids is None
    events = json_events(_chat(fe, stream=True, **body))
    assert [c for e in events if e["choices"][0]["logprobs"] for c in e["choices"][0]["logprobs"]["content"]] == whole
    completion = _completion(fe, prompt="a b", max_tokens=1, logprobs=0, logprob_token_ids=[9])
    assert completion.json()["choices"][0]["logprobs"]["top_logprobs"] == [{token_text(OUT): -0.5, "t9": -10.0}]
    unscored = _completion(fe, prompt="a b", max_tokens=1, logprob_token_ids=[9]).json()["choices"][0]
    assert unscored["logprobs"] is None  # completions without logprobs answer none, as vLLM
    for bad, param in (
        ({"logprob_token_ids": [9]}, "logprob_token_ids"),  # chat without logprobs: true
        ({"logprobs": True, "logprob_token_ids": [10**6]}, "logprob_token_ids"),
        ({"logprobs": True, "logprob_token_ids": list(range(129))}, "logprob_token_ids"),
    ):
        r = _chat(fe, max_tokens=1, **bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_repetition_detection_and_vllm_xargs_reach_the_engine_and_bad_ones_are_400s():
    fe = make_frontend()
    loop = {"max_pattern_size": 2, "min_pattern_size": 1, "min_count": 3}
    assert _chat(fe, max_tokens=2, repetition_detection=loop, vllm_xargs={"labels": [1, 2]}).status_code == 200
    sampling = fe.decode.generates[-1].sampling
    assert sampling.repetition_detection == RepetitionDetection(2, 1, 3)
    assert sampling.extra_args == (("labels", (1, 2)),)
    for bad, param, says in (
        ({"repetition_detection": {"max_pattern_size": 2, "min_count": 1}}, "repetition_detection", "min_count"),
        ({"repetition_detection": {"max_pattern_size": 1, "min_pattern_size": 2}}, "repetition_detection", "<="),
        ({"vllm_xargs": {"kv_transfer_params": "remote"}}, "vllm_xargs", "moves the KV cache itself"),
    ):
        r = _chat(fe, max_tokens=1, **bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == param and says in r.json()["error"]["message"]


def test_prompt_logprobs_prefill_on_the_decode_replica_and_come_in_vllms_form():
    fe = make_frontend()
    body = _completion(fe, prompt=[11, 12, 13, 14], max_tokens=1, prompt_logprobs=1).json()
    assert fe.prefill.prefills == []  # a prefill replica's prompt logprobs would stay there
    (engine_request,) = fe.decode.generates
    assert engine_request.kv_transfer is None and engine_request.sampling.prompt_logprobs == 1
    assert fe.metric("orchestrator_route_decisions_total", {"kind": "local_prefill", "reason": "prompt_logprobs"}) == 1
    prompt = body["choices"][0]["prompt_logprobs"]
    assert len(prompt) == 4 and prompt[0] is None
    assert prompt[1] == {
        "12": {"logprob": -1.5, "rank": 3, "decoded_token": token_text(12)},
        "7": {"logprob": -0.1, "rank": 1, "decoded_token": "t0"},
    }
    assert body["choices"][0]["logprobs"] is None  # output logprobs were not asked for
    plain = _completion(fe, prompt=[11, 12, 13, 14], max_tokens=1).json()["choices"][0]
    assert "prompt_logprobs" not in plain and fe.decode.generates[-1].kv_transfer is not None


def test_echo_with_logprobs_scores_the_prompt_then_the_output_whole_equals_streamed():
    fe = make_frontend()
    whole = _completion(fe, prompt=[11, 12], max_tokens=2, echo=True, logprobs=1).json()["choices"][0]
    lp = whole["logprobs"]
    assert lp["tokens"] == [token_text(11), token_text(12), token_text(OUT), token_text(OUT + 1)]
    assert lp["token_logprobs"] == [None, -1.5, -0.5, -0.5]  # the first prompt token has none, as in vLLM
    assert lp["top_logprobs"][0] is None
    assert lp["top_logprobs"][1] == {token_text(12): -1.5, "t0": -0.1}  # the token, then the top 1
    assert lp["text_offset"] == [0, 4, 8, 14]
    assert whole["text"] == "".join(lp["tokens"]) and whole["prompt_logprobs"][0] is None
    assert fe.decode.generates[-1].sampling.prompt_logprobs == 1  # logprobs, as vLLM asks for echo
    events = json_events(_completion(fe, prompt=[11, 12], max_tokens=2, echo=True, logprobs=1, stream=True))
    streamed = [e["choices"][0]["logprobs"] for e in events]
    assert [t for s in streamed for t in s["tokens"]] == lp["tokens"]
    assert [o for s in streamed for o in s["text_offset"]] == lp["text_offset"]
    assert [v for s in streamed for v in s["token_logprobs"]] == lp["token_logprobs"]
    assert "prompt_logprobs" not in events[0]["choices"][0]  # vLLM streams them only as the echo's


def test_chat_prompt_logprobs_sit_at_the_top_of_the_answer_and_a_stream_never_asks_the_engine():
    fe = make_frontend()
    body = _chat(fe, max_tokens=1, prompt_logprobs=0).json()
    assert body["prompt_logprobs"][0] is None and len(body["prompt_logprobs"]) == len(
        fe.decode.generates[0].prompt_token_ids
    )
    assert all(len(p) == 1 for p in body["prompt_logprobs"][1:])  # the prompt token only
    _chat(fe, max_tokens=1, prompt_logprobs=0, stream=True)
    assert fe.decode.generates[-1].sampling.prompt_logprobs is None


def test_a_migrated_stream_asks_for_prompt_logprobs_only_before_its_first_token():
    fe = make_frontend(
        disaggregated=False, decode=FakePool("decode_pool", generate_error_after=1, failing_replica="r0")
    )
    body = _completion(fe, prompt=[11, 12], max_tokens=3, prompt_logprobs=0).json()
    assert [len(g.prompt_token_ids) for g in fe.decode.generates] == [2, 3]
    assert [g.sampling.prompt_logprobs for g in fe.decode.generates] == [0, None]
    assert len(body["choices"][0]["prompt_logprobs"]) == 2


def test_vllms_output_and_token_options_reach_the_engine():
    fe = make_frontend()
    options = {"skip_special_tokens": False, "spaces_between_special_tokens": False}
    options |= {"include_stop_str_in_output": True, "allowed_token_ids": [3, 4], "bad_words": ["no"]}
    assert _completion(fe, prompt="a b c d", max_tokens=1, **options).status_code == 200
    s = fe.decode.generates[0].sampling
    assert (s.skip_special_tokens, s.spaces_between_special_tokens, s.include_stop_str_in_output) == (
        False,
        False,
        True,
    )
    assert s.allowed_token_ids == (3, 4) and s.bad_words == ("no",)
    bad = _completion(fe, prompt="a", allowed_token_ids=[10**6])
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "allowed_token_ids"


def test_truncate_prompt_tokens_keeps_the_prompts_last_tokens():
    fe = make_frontend(disaggregated=False)
    _completion(fe, prompt=[11, 12, 13, 14], max_tokens=1, truncate_prompt_tokens=2)
    assert fe.decode.generates[0].prompt_token_ids == (13, 14)
    assert _completion(fe, prompt=[11, 12], max_tokens=1, truncate_prompt_tokens=0).status_code == 400


def test_chat_template_options_and_variables_reach_the_template():
    fe = make_frontend(disaggregated=False)
    _chat(fe, max_tokens=1, chat_template_kwargs={"enable_thinking": False})
    _chat(fe, max_tokens=1, add_generation_prompt=False, continue_final_message=True)
    encode = fe.service.preparer.renderer.tokenizer.encode
    with_vars, open_end = (g.prompt_token_ids for g in fe.decode.generates)
    assert with_vars == tuple(encode("<user> hi enable_thinking=False <assistant>", add_special_tokens=False))
    assert open_end == tuple(encode("<user> hi", add_special_tokens=False))
    both = _chat(fe, continue_final_message=True)  # add_generation_prompt defaults to true
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"
    reserved = _chat(fe, chat_template_kwargs={"tokenize": True})
    assert reserved.status_code == 400 and reserved.json()["error"]["param"] == "chat_template_kwargs"
    refused = _chat(fe, max_tokens=1, chat_template_kwargs={"raise_exception": "roles must alternate"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages"
    assert "roles must alternate" in refused.json()["error"]["message"]
    assert _chat(fe, max_tokens=1).status_code == 200  # and the server keeps serving


def test_logit_bias_reaches_the_engine_clamped_as_vllm_clamps_it():
    fe = make_frontend()
    _completion(fe, prompt="a", max_tokens=1, logit_bias={"5": 250, "6": -3.5})
    assert fe.decode.generates[0].sampling.logit_bias == ((5, 100.0), (6, -3.5))


def test_response_format_constrains_the_decode_side_only():
    fe = make_frontend()
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert _chat(fe, max_tokens=2, response_format=fmt).status_code == 200
    assert fe.decode.generates[0].sampling.structured == StructuredOutput(StructuredKind.JSON, json.dumps(schema))
    assert fe.prefill.prefills[0].sampling.structured is None
    _completion(fe, prompt="a", max_tokens=1, structured_outputs={"choice": ["yes", "no"]})
    assert fe.decode.generates[-1].sampling.structured == StructuredOutput(StructuredKind.CHOICE, ("yes", "no"))
    _chat(fe, max_tokens=1, response_format={"type": "json_object"})
    assert fe.decode.generates[-1].sampling.structured == StructuredOutput(StructuredKind.JSON_OBJECT)


def test_structural_tags_in_both_forms_and_grammar_options_reach_the_engine_as_vllm_sends_them():
    fe = make_frontend()
    tag = {"type": "tag", "begin": "<f>", "content": {"type": "json_schema", "json_schema": {}}, "end": "</f>"}
    assert _chat(fe, max_tokens=2, response_format={"type": "structural_tag", "format": tag}).status_code == 200
    assert fe.decode.generates[-1].sampling.structured == StructuredOutput(
        StructuredKind.STRUCTURAL_TAG, json.dumps({"type": "structural_tag", "format": tag})
    )
    legacy = {"type": "structural_tag", "structures": [{"begin": "<f>", "end": "</f>"}], "triggers": ["<f"]}
    assert _chat(fe, max_tokens=2, response_format=legacy).status_code == 200
    sent = json.loads(fe.decode.generates[-1].sampling.structured.value)
    assert sent == {
        "type": "structural_tag",
        "structures": [{"begin": "<f>", "schema": None, "end": "</f>"}],
        "triggers": ["<f"],
    }
    options = {"disable_any_whitespace": True, "disable_additional_properties": True, "whitespace_pattern": " "}
    _completion(fe, prompt="a", max_tokens=1, structured_outputs={"json": {"type": "object"}, **options})
    assert fe.decode.generates[-1].sampling.structured == StructuredOutput(
        StructuredKind.JSON, '{"type": "object"}', **options
    )
    _completion(fe, prompt="a", max_tokens=1, structured_outputs={"structural_tag": json.dumps(tag)})
    assert fe.decode.generates[-1].sampling.structured.kind is StructuredKind.STRUCTURAL_TAG
    half = _chat(fe, max_tokens=2, response_format={"type": "structural_tag", "structures": []})
    assert half.status_code == 400 and half.json()["error"]["param"] == "response_format"


def test_a_schema_the_engine_cannot_compile_is_a_400_naming_the_field_and_the_server_keeps_serving():
    decode = FakePool(
        "decode_pool", generate_error_after=0, generate_error=EngineRequestRejected("Grammar error: Invalid type: nope")
    )
    fe = make_frontend(decode=decode)
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}
    r = _chat(fe, max_tokens=2, response_format=fmt)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    decode.generate_error_after = None
    assert _chat(fe, max_tokens=1).status_code == 200


def test_a_constrained_stream_is_not_resumed_mid_output_elsewhere():
    decode = FakePool("decode_pool", generate_error_after=1)
    fe = make_frontend(decode=decode)
    events = json_events(_chat(fe, max_tokens=3, stream=True, response_format={"type": "json_object"}))
    assert events[-1]["error"]["type"] == "server_error"
    assert fe.metric("orchestrator_decode_migrations_total") == 0
    unconstrained = json_events(_chat(fe, max_tokens=2, stream=True))  # the same failure, no constraint: resumed
    assert unconstrained[-1]["choices"][0]["finish_reason"] == "length"
    assert fe.metric("orchestrator_decode_migrations_total") == 1


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
]


def test_a_named_tool_choice_constrains_to_its_parameters_and_returns_the_call():
    decode = FakePool("decode_pool", script=('{"city": ', '"Oslo"}'))
    fe = make_frontend(decode=decode)
    choice = {"type": "function", "function": {"name": "get_weather"}}
    body = _chat(fe, max_tokens=8, tools=TOOLS, tool_choice=choice).json()["choices"][0]
    (call,) = body["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert call["id"].startswith("chatcmpl-tool-") and body["finish_reason"] == "stop"
    constraint = fe.decode.generates[0].sampling.structured
    assert json.loads(constraint.value) == TOOLS[0]["function"]["parameters"]
    events = json_events(_chat(fe, max_tokens=8, tools=TOOLS, tool_choice=choice, stream=True))
    calls = [d["tool_calls"][0] for e in events if (d := e["choices"][0]["delta"]).get("tool_calls")]
    assert calls[0]["function"]["name"] == "get_weather" and calls[0]["id"] == calls[0]["id"]
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city": "Oslo"}'


def test_required_tool_choice_reads_each_call_from_the_constrained_list():
    script = ('[{"name": "get_time", "parameters": {}}, ', '{"name": "get_weather", "parameters": {"city": "Rome"}}]')
    fe = make_frontend(decode=FakePool("decode_pool", script=script))
    body = _chat(fe, max_tokens=8, tools=TOOLS, tool_choice="required").json()["choices"][0]
    assert [c["function"]["name"] for c in body["message"]["tool_calls"]] == ["get_time", "get_weather"]
    assert json.loads(body["message"]["tool_calls"][1]["function"]["arguments"]) == {"city": "Rome"}
    assert body["finish_reason"] == "tool_calls"
    schema = json.loads(fe.decode.generates[0].sampling.structured.value)
    assert schema["type"] == "array" and schema["minItems"] == 1
    assert [s["properties"]["name"]["enum"] for s in schema["items"]["anyOf"]] == [["get_weather"], ["get_time"]]
    events = json_events(_chat(fe, max_tokens=8, tools=TOOLS, tool_choice="required", stream=True))
    (last,) = [e["choices"][0] for e in events if e["choices"][0]["finish_reason"]]
    assert [c["index"] for c in last["delta"]["tool_calls"]] == [0, 1] and last["finish_reason"] == "tool_calls"


def test_required_tool_choice_output_that_is_no_list_of_calls_is_answered_as_vllms_server_answers_it():
    """vLLM 0.32 (parser/abstract_parser.py, chat_completion/serving.py): whole, the failed list parse gives
    content "" and `tool_calls: []`, and finish "tool_calls" where the engine stopped ("length" stays);
    streamed, only the list's calls are sent, so nothing is, and the finish is the engine's."""
    for max_tokens, finish in ((8, "stop"), (1, "length")):
        fe = make_frontend(decode=FakePool("decode_pool", script=("Sorry, ", "no tool.")))
        body = _chat(fe, max_tokens=max_tokens, tools=TOOLS, tool_choice="required").json()["choices"][0]
        assert body["message"]["content"] == "" and body["message"]["tool_calls"] == []
        assert body["finish_reason"] == ("tool_calls" if finish == "stop" else "length")
        events = json_events(_chat(fe, max_tokens=max_tokens, tools=TOOLS, tool_choice="required", stream=True))
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
        assert not any(d.get("content") or d.get("tool_calls") for d in deltas)
        assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == finish


# A tool-calling template in the style of Hermes 2 Pro's and Qwen2.5's (its text in expressions, which the
# environment's trim_blocks leaves whole): an assistant's calls as <tool_call> JSON with the arguments as an object,
# the results together in one user turn of <tool_response>s.
HERMES_TOOL_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\n<tool_response>\n' + m.content + '\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% else %}"
    "{{ '<|im_start|>' + m.role }}{% if m.content %}{{ '\n' + m.content }}{% endif %}"
    "{% for call in m.tool_calls or [] %}"
    "{{ '\n<tool_call>\n' }}{{ {'name': call.function.name, 'arguments': call.function.arguments} | tojson }}"
    "{{ '\n</tool_call>' }}"
    "{% endfor %}{{ '<|im_end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
HERMES_TOKENS = ["<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]


def _prompt_vllms_server_renders(model_dir, tokenizer, messages) -> str:
    """The chat prompt vLLM 0.32's server makes of `messages`, served with `--chat-template` the tokenizer's own
    (HfRenderer.render_messages: its request model, parse_chat_messages in the template's content format,
    safe_apply_chat_template with the generation prompt)."""
    from vllm.config import ModelConfig
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.renderers.chat_utils import parse_chat_messages
    from vllm.renderers.hf import resolve_chat_template_content_format, safe_apply_chat_template

    config = ModelConfig(model=str(model_dir), tokenizer=str(model_dir))
    template = tokenizer.chat_template
    parsed = ChatCompletionRequest(model=MODEL, messages=json.loads(json.dumps(messages))).messages
    content_format = resolve_chat_template_content_format(template, None, "auto", tokenizer, model_config=config)
    conversation, _, _ = parse_chat_messages(parsed, config, content_format)
    return safe_apply_chat_template(
        config, tokenizer, conversation, chat_template=template, tokenize=False, add_generation_prompt=True
    )


def test_assistant_tool_calls_and_tool_results_reach_the_engine_rendered_as_vllm_renders_them(tmp_path):
    tokenizer = tiny_tokenizer(tmp_path, HERMES_TOKENS)
    tokenizer.chat_template = HERMES_TOOL_TEMPLATE
    fe = make_frontend(max_model_len=512, tokenizer=tokenizer)
    messages = [
        {"role": "user", "content": "weather in Oslo, and the time?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
                {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "noon"},
    ]
    assert post(fe, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 1}).status_code == 200
    theirs = _prompt_vllms_server_renders(tmp_path, tokenizer, messages)
    # The calls and their results are in the prompt, each argument string as the object the template dumps.
    assert (
        "<|im_start|>assistant"
        '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
        '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nnoon\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    ) in theirs
    # Both engines are asked for exactly that prompt: vLLM's text, tokenized as vLLM's server tokenizes a chat.
    (prefilled,), (decoded,) = fe.prefill.prefills, fe.decode.generates
    seen = decoded.prompt_token_ids
    assert tokenizer.decode(seen) == theirs
    assert seen == tuple(tokenizer.encode(theirs, add_special_tokens=False)) and prefilled.prompt_token_ids == seen


def test_auto_tool_choice_is_refused_with_the_reason():
    fe = make_frontend()
    r = _chat(fe, max_tokens=1, tools=TOOLS)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    assert _chat(fe, max_tokens=1, tools=TOOLS, tool_choice="none").status_code == 200


def test_request_id_names_the_answer_as_vllm_names_it():
    fe = make_frontend()
    assert _completion(fe, prompt="a", max_tokens=1, request_id="abc").json()["id"] == "cmpl-abc"
    events = json_events(_chat(fe, max_tokens=2, request_id="xyz", stream=True))
    assert {e["id"] for e in events} == {"chatcmpl-xyz"}
    assert _completion(fe, prompt="a", max_tokens=1, session_id="s1").status_code == 200  # metadata


def test_priority_other_than_zero_and_beam_search_are_refused_naming_the_field():
    fe = make_frontend()
    assert (
        _completion(fe, prompt="a", max_tokens=1, priority=0, use_beam_search=False, length_penalty=1.0).status_code
        == 200
    )
    for field, value in (("priority", 1), ("use_beam_search", True)):
        r = _completion(fe, prompt="a", max_tokens=1, **{field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field
    assert _chat(fe, max_tokens=1, chat_template="{{ messages }}").json()["error"]["param"] == "chat_template"


def test_cache_salt_reaches_the_prefill_and_the_decode_engine_and_a_bad_one_gets_vllms_400():
    fe = make_frontend()
    assert _completion(fe, prompt="a b c d", max_tokens=2, n=2, cache_salt="tenant-a").status_code == 200
    assert _chat(fe, max_tokens=1, cache_salt="tenant-b").status_code == 200
    sent = fe.prefill.prefills + fe.decode.generates
    assert [r.cache_salt for r in fe.prefill.prefills] == ["tenant-a", "tenant-b"]
    assert [r.cache_salt for r in fe.decode.generates] == ["tenant-a", "tenant-a", "tenant-b"] and len(sent) == 5
    for bad in ("", "a/b", "x" * 129):
        r = _completion(fe, prompt="a", max_tokens=1, cache_salt=bad)
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"
        assert "Parameter 'cache_salt' must be" in r.json()["error"]["message"]


def test_truncation_side_right_keeps_the_prompts_first_tokens():
    fe = make_frontend(disaggregated=False)
    _completion(fe, prompt=[11, 12, 13, 14], max_tokens=1, truncate_prompt_tokens=2, truncation_side="right")
    _completion(fe, prompt=[11, 12, 13, 14], max_tokens=1, truncate_prompt_tokens=2, truncation_side="left")
    assert [g.prompt_token_ids for g in fe.decode.generates] == [(11, 12), (13, 14)]


def test_tokens_as_token_ids_name_every_logprob_token_by_its_id():
    fe = make_frontend()
    lp = _completion(fe, prompt=[11, 12], max_tokens=1, echo=True, logprobs=2, return_tokens_as_token_ids=True)
    lp = lp.json()["choices"][0]["logprobs"]
    assert lp["tokens"] == ["token_id:11", "token_id:12", f"token_id:{OUT}"]
    assert lp["top_logprobs"][2] == {f"token_id:{OUT}": -0.5, "token_id:7": -1.0}
    assert lp["text_offset"] == [0, 11, 22]  # offsets run over the names, as vLLM's do
    content = _chat(fe, max_tokens=1, logprobs=True, top_logprobs=2, return_tokens_as_token_ids=True)
    (first,) = content.json()["choices"][0]["logprobs"]["content"]
    assert first["token"] == f"token_id:{OUT}" and first["bytes"] == list(token_text(OUT).encode())
    assert [t["token"] for t in first["top_logprobs"]] == [f"token_id:{OUT}", "token_id:7"]
    assert first["top_logprobs"][1]["bytes"] == list(b"token_id:7")


def test_chat_echo_writes_the_continued_message_before_the_answer_whole_and_streamed():
    fe = make_frontend(disaggregated=False)
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure,"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 2, "echo": True}
    body |= {"add_generation_prompt": False, "continue_final_message": True}
    message = post(fe, "/v1/chat/completions", body).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": "Sure," + token_text(OUT) + token_text(OUT + 1)}
    events = json_events(post(fe, "/v1/chat/completions", body | {"stream": True}))
    deltas = [e["choices"][0]["delta"] for e in events]
    assert deltas[0] == {"role": "assistant", "content": ""} and deltas[1] == {"content": "Sure,"}
    assert "".join(d.get("content", "") for d in deltas) == message["content"]
    # A new assistant turn: the last message is the user's, nothing is echoed (vLLM's rule).
    plain = _chat(fe, max_tokens=1, echo=True).json()["choices"][0]["message"]["content"]
    assert plain == token_text(OUT)


def test_a_continued_message_keeps_its_role():
    fe = make_frontend(disaggregated=False)
    messages = [{"role": "user", "content": "hi"}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 1, "add_generation_prompt": False}
    assert post(fe, "/v1/chat/completions", body).json()["choices"][0]["message"]["role"] == "user"
    events = json_events(post(fe, "/v1/chat/completions", body | {"stream": True}))
    assert events[0]["choices"][0]["delta"]["role"] == "user"


def test_reasoning_effort_and_documents_reach_the_template_as_vllm_merges_them():
    fe = make_frontend(disaggregated=False)
    _chat(fe, max_tokens=1, reasoning_effort="none")
    _chat(fe, max_tokens=1, reasoning_effort="high", chat_template_kwargs={"enable_thinking": False})
    _chat(fe, max_tokens=1, documents=[{"title": "t", "text": "x"}])
    encode = fe.service.preparer.renderer.tokenizer.encode
    prompts = [g.prompt_token_ids for g in fe.decode.generates]
    assert prompts[0] == tuple(encode("<user> hi enable_thinking=False reasoning_effort=none <assistant>", False))
    assert prompts[1] == tuple(encode("<user> hi enable_thinking=False reasoning_effort=high <assistant>", False))
    assert prompts[2] == tuple(encode("<user> hi documents=[{'title': 't', 'text': 'x'}] <assistant>", False))


def test_stream_interval_batches_tokens_and_sends_the_first_and_last_at_once():
    fe = make_frontend(disaggregated=False)
    events = json_events(
        _completion(fe, prompt="a", max_tokens=6, stream=True, stream_interval=4, return_token_ids=True)
    )
    assert [len(e["choices"][0]["token_ids"]) for e in events] == [1, 4, 1]
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    whole = _completion(fe, prompt="a", max_tokens=6, stream_interval=4).json()["choices"][0]["text"]
    assert "".join(e["choices"][0]["text"] for e in events) == whole
