"""Our sampling spec as vLLM's SamplingParams, and vLLM's logprobs as ours (vLLM's own classes)."""

from __future__ import annotations

from vllm.logprobs import Logprob

from orchestrator.engines.vllm_engine import (
    VllmEngine,
    position_logprobs,
    prompt_position_logprobs,
    structured_outputs_params,
)
from orchestrator.messages import (
    EngineRequest,
    RepetitionDetection,
    SamplingSpec,
    StructuredKind,
    StructuredOutput,
    TokenLogprob,
)


def test_each_constraint_kind_is_vllms_field_of_that_name():
    schema = '{"type": "object"}'
    assert structured_outputs_params(StructuredOutput(StructuredKind.JSON, schema)).json == schema
    assert structured_outputs_params(StructuredOutput(StructuredKind.JSON_OBJECT)).json_object is True
    assert structured_outputs_params(StructuredOutput(StructuredKind.REGEX, "a+")).regex == "a+"
    assert structured_outputs_params(StructuredOutput(StructuredKind.CHOICE, ("x", "y"))).choice == ["x", "y"]
    assert structured_outputs_params(StructuredOutput(StructuredKind.GRAMMAR, "root ::= 'a'")).grammar == "root ::= 'a'"
    tag = '{"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}'
    assert structured_outputs_params(StructuredOutput(StructuredKind.STRUCTURAL_TAG, tag)).structural_tag == tag
    assert structured_outputs_params(None) is None


def test_grammar_options_are_vllms_fields_of_those_names():
    spec = StructuredOutput(
        StructuredKind.JSON,
        '{"type": "object"}',
        disable_any_whitespace=True,
        disable_additional_properties=True,
        whitespace_pattern=" ?",
    )
    params = structured_outputs_params(spec)
    assert (params.disable_any_whitespace, params.disable_additional_properties) == (True, True)
    assert params.whitespace_pattern == " ?"
    plain = structured_outputs_params(StructuredOutput(StructuredKind.REGEX, "a+"))
    assert (plain.disable_any_whitespace, plain.disable_additional_properties, plain.whitespace_pattern) == (
        False,
        False,
        None,
    )


def test_sampling_params_carry_logprobs_bias_and_constraint():
    spec = SamplingSpec(
        max_tokens=5,
        logprobs=3,
        logit_bias=((7, 2.5),),
        structured=StructuredOutput(StructuredKind.REGEX, "[ab]+"),
    )
    params = VllmEngine._sampling_params(None, EngineRequest("r", (1, 2), spec), None)
    assert params.logprobs == 3 and params.logit_bias == {7: 2.5} and params.prompt_logprobs is None
    assert params.structured_outputs.regex == "[ab]+"
    restricted = SamplingSpec(max_tokens=5, allowed_token_ids=(3, 4), bad_words=("x",), include_stop_str_in_output=True)
    vllm_params = VllmEngine._sampling_params(None, EngineRequest("r", (1, 2), restricted), None)
    assert vllm_params.allowed_token_ids == [3, 4] and vllm_params.bad_words == ["x"]
    assert vllm_params.include_stop_str_in_output is True and vllm_params.spaces_between_special_tokens is True
    plain = VllmEngine._sampling_params(None, EngineRequest("r", (1, 2), SamplingSpec(max_tokens=5)), None)
    assert plain.logprobs is None and plain.logit_bias is None and plain.structured_outputs is None


def test_vllms_logprob_dicts_keep_their_order_and_find_the_sampled_token():
    step = {9: Logprob(-0.7, rank=3, decoded_token="c"), 4: Logprob(-0.1, rank=1, decoded_token="a")}
    (position,) = position_logprobs([9], [step])
    assert position.sampled == TokenLogprob(9, -0.7, "c", rank=3)
    assert [c.token_id for c in position.candidates] == [9, 4]
    assert position_logprobs([9], None) is None


def test_prompt_logprobs_reach_vllm_and_come_back_with_the_first_position_empty():
    spec = SamplingSpec(max_tokens=1, prompt_logprobs=2)
    assert VllmEngine._sampling_params(None, EngineRequest("r", (1, 2), spec), None).prompt_logprobs == 2
    second = {2: Logprob(-3.0, rank=40, decoded_token="b"), 8: Logprob(-0.2, rank=1, decoded_token="z")}
    first, position = prompt_position_logprobs([1, 2], [None, second])
    assert first is None
    assert position.sampled == TokenLogprob(2, -3.0, "b", rank=40)
    assert [c.rank for c in position.candidates] == [40, 1]
    assert prompt_position_logprobs([1, 2], None) is None


def test_scored_tokens_repetition_detection_and_extra_args_reach_vllm_and_the_kv_transfer_stays_ours():
    spec = SamplingSpec(
        max_tokens=5,
        logprobs=0,
        logprob_token_ids=(4, 9),
        repetition_detection=RepetitionDetection(max_pattern_size=2, min_pattern_size=1, min_count=3),
        extra_args=(("labels", (1, 2)), ("mode", "x")),
    )
    params = VllmEngine._sampling_params(None, EngineRequest("r", (1, 2), spec), {"remote_block_ids": [1]})
    assert params.logprobs is None and params.logprob_token_ids == [4, 9]  # vLLM's rule: the ids replace the top k
    assert (params.repetition_detection.max_pattern_size, params.repetition_detection.min_count) == (2, 3)
    assert params.extra_args == {"labels": [1, 2], "mode": "x", "kv_transfer_params": {"remote_block_ids": [1]}}
    plain = VllmEngine._sampling_params(None, EngineRequest("r", (1, 2), SamplingSpec(max_tokens=5)), None)
    assert plain.logprob_token_ids is None and plain.repetition_detection is None and plain.extra_args is None
