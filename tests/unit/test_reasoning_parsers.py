"""The model's thinking split from its answer: our `think` reader against vLLM's own
DeepSeek-R1 parser on the same outputs, and through the API, whole and streamed alike."""

from __future__ import annotations

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.reasoning import ReasoningParserManager
from vllm.reasoning.deepseek_r1_reasoning_parser import DeepSeekR1ReasoningParser

from orchestrator.api.reasoning_parsers import PARSERS
from tests.factories import FakePool, chat, json_events, make_frontend, tiny_tokenizer

OUTPUTS = [
    "<think>Two and two.</think>Four.",
    "Two and two.</think>Four.",  # the template wrote the start tag
    "<think>Still thinking",  # no end tag: all reasoning
    "<think>Done.</think>",  # nothing after: content None
    "Plain answer.",
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tiny"), ["<think>", "</think>"])


@pytest.fixture(scope="module")
def vllm_parser(tokenizer):
    return DeepSeekR1ReasoningParser(tokenizer)


@pytest.mark.parametrize("text", OUTPUTS)
def test_think_splits_as_vllms_deepseek_r1_parser(vllm_parser, text):
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    assert PARSERS["deepseek_r1"].splitter({}, ()).split(text) == vllm_parser.extract_reasoning(text, request)


@pytest.mark.parametrize("thinking", [True, False])
@pytest.mark.parametrize("text", OUTPUTS)
def test_qwen3_splits_as_vllms_qwen3_parser_with_thinking_on_and_off(tokenizer, text, thinking):
    """`enable_thinking: false` (the template's variable): vLLM's qwen3 parser reads all as the answer."""
    variables = {"enable_thinking": thinking}
    theirs = ReasoningParserManager.get_reasoning_parser("qwen3")(tokenizer, chat_template_kwargs=variables)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    request.chat_template_kwargs = variables
    assert PARSERS["qwen3"].splitter(variables, ()).split(text, ()) == theirs.extract_reasoning(text, request)


def test_a_partial_tag_is_not_sent_before_it_is_known():
    think = PARSERS["qwen3"].splitter({}, ())
    assert think.feed("<thi", (), False) == ("", "")
    assert think.feed("nk>abc</thi", (), False) == ("abc", "")
    assert think.feed("nk>de", (), False) == ("", "de")
    unfinished = PARSERS["qwen3"].splitter({}, ())
    assert unfinished.feed("abc</th", (), False) == ("abc", "")
    assert unfinished.feed("", (), True) == ("</th", "")  # the output ended: what was held is reasoning


SCRIPT = ("<think>", "Two and", " two.</th", "ink>Fo", "ur.")


def _chat(fe, **body):
    return chat(fe, "2+2?", **body)


def test_reasoning_comes_apart_from_the_content_whole_and_streamed():
    decode = FakePool("decode_pool", script=SCRIPT)
    fe = make_frontend(decode=decode, reasoning_parser="deepseek_r1")
    message = _chat(fe, max_tokens=8).json()["choices"][0]["message"]
    assert message == {"role": "assistant", "reasoning": "Two and two.", "content": "Four."}
    events = json_events(_chat(fe, max_tokens=8, stream=True))
    deltas = [e["choices"][0]["delta"] for e in events[1:]]
    assert "".join(d.get("reasoning", "") for d in deltas) == "Two and two."
    assert "".join(d.get("content", "") for d in deltas) == "Four."
    assert all("<" not in d.get("reasoning", "") + d.get("content", "") for d in deltas)
    constrained = _chat(fe, max_tokens=8, response_format={"type": "json_object"}).json()["choices"][0]["message"]
    assert "reasoning" not in constrained  # a constrained output is all answer


def test_include_reasoning_false_drops_the_reasoning_and_what_would_carry_it():
    decode = FakePool("decode_pool", script=SCRIPT)
    fe = make_frontend(decode=decode, reasoning_parser="deepseek_r1")
    hidden = {"include_reasoning": False, "logprobs": True, "return_token_ids": True}
    choice = _chat(fe, max_tokens=8, **hidden).json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "reasoning": None, "content": "Four."}
    assert choice["logprobs"] is None and "token_ids" not in choice
    assert fe.decode.generates[0].sampling.logprobs is None  # the engine is not asked for what is dropped
    events = json_events(_chat(fe, max_tokens=8, stream=True, **hidden))
    deltas = [e["choices"][0] for e in events[1:]]
    assert "".join(d["delta"].get("content", "") for d in deltas) == "Four."
    assert not any(d["delta"].get("reasoning") or d["logprobs"] or d.get("token_ids") for d in deltas)


def test_qwen3_with_thinking_turned_off_answers_with_all_of_its_output():
    """chat_template_kwargs (or reasoning_effort "none", which vLLM turns into enable_thinking false)
    reach the format, per request."""
    fe = make_frontend(decode=FakePool("decode_pool", script=SCRIPT), reasoning_parser="qwen3")
    for off in ({"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"}):
        message = _chat(fe, max_tokens=8, **off).json()["choices"][0]["message"]
        assert message == {"role": "assistant", "reasoning": None, "content": "".join(SCRIPT)}
        events = json_events(_chat(fe, max_tokens=8, stream=True, **off))
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == "".join(SCRIPT)
    assert _chat(fe, max_tokens=8).json()["choices"][0]["message"]["reasoning"] == "Two and two."
