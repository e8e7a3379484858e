"""Tool calls read from free text ("auto"): our hermes reader against vLLM's own
Hermes2ProToolParser on the same outputs, and "auto" through the API, whole and streamed."""

from __future__ import annotations

import json
import random

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.tool_parsers.hermes_tool_parser import Hermes2ProToolParser
from vllm.tool_parsers.llama_tool_parser import Llama3JsonToolParser
from vllm.tool_parsers.pythonic_tool_parser import PythonicToolParser

from orchestrator.api.call_opener import CallOpenerScan
from orchestrator.api.tool_parsers import PARSERS, _looks_pythonic
from tests.factories import FakePool, chat, json_events, make_frontend, tiny_tokenizer

# The format of Qwen 2.5 / Hermes 2 Pro chat templates (Qwen's function-calling
# docs, "Hermes-style tool use"): text, then one tag per call.
OUTPUTS = [
    "The weather is fine.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ro',  # cut by length: no call
    '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}',  # unclosed last tag, whole JSON
]


# Llama 3.1's JSON tool format (Meta's llama-models docs, "JSON based tool calling";
# vLLM's examples/tool_chat_template_llama3.1_json.jinja asks for it): one object,
# or several separated by "; ", sometimes after <|python_tag|>; "parameters" or "arguments".
LLAMA_OUTPUTS = [
    "The weather is fine.",
    '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
    '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo", "when": {"day": 1}}}',
    '{"name": "get_weather", "parameters": {"city": "Oslo"}}; {"name": "get_time", "arguments": {}}',
    'Sure: {"name": "get_time", "parameters": {}} done',  # text around a call is dropped
    '{"name": "get_weather", "parameters": {"city": "Ro',  # cut by length: content
    '{"city": "Oslo"}',  # no name: content
    "use {braces} freely",  # not JSON: content
]


# The pythonic format (Llama 3.2's model card, "Tool calling, zero-shot function calling": a Python list of calls
# with keyword arguments; vLLM's examples/tool_chat_template_llama3.2_pythonic.jinja asks for it).
PYTHONIC_OUTPUTS = [
    "The weather is fine.",
    "[get_weather(city='Oslo')]",
    '[get_weather(city="Oslo", days=3), get_time()]',
    "[get_time(), get_weather(city='Oslo', opts={'unit': 'c'}, flags=[true, null], at=(1, 2), n=-1.5)]",
    "[get_weather(city=f'Oslo', tags={'a'})]",
    "[get_weather(city='Oslo'), tools.get_time()]",  # a dotted name keeps its dots
    "[get_weather(city='Ro",  # cut by length: content
    "Sure: [get_time()]",  # not at the start: content
    "[1, 2]",  # not calls: content
    "[get_weather('Oslo')]",  # positional argument: content
    "[get_weather(city=some_variable)]",  # not a literal: content
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tiny"), ["<|python_tag|>"])  # vLLM's llama parser needs it


VLLM_PARSERS = {"hermes": Hermes2ProToolParser, "llama3_json": Llama3JsonToolParser, "pythonic": PythonicToolParser}


@pytest.mark.parametrize(
    "name, text",
    [("hermes", t) for t in OUTPUTS]
    + [("llama3_json", t) for t in LLAMA_OUTPUTS]
    + [("pythonic", t) for t in PYTHONIC_OUTPUTS],
)
def test_each_parser_reads_what_vllms_parser_of_its_name_reads(tokenizer, name, text):
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    theirs = VLLM_PARSERS[name](tokenizer).extract_tool_calls(text, request)
    content, calls = PARSERS[name].parse(text)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (c.function.name, json.loads(c.function.arguments)) for c in theirs.tool_calls
    ]
    assert (content or None) == (theirs.content or None) if calls else content == text


def test_llama3_json_streams_content_unless_the_output_opens_with_a_call():
    llama = PARSERS["llama3_json"]

    def scanned(*pieces: str) -> tuple[int, int | None]:
        scan = CallOpenerScan(llama.openers, llama.anchored)
        return [scan.feed(p) for p in pieces][-1], scan.call_at

    assert scanned('{"name"') == (0, 0) and scanned("<|pyth", "on_tag|>{") == (0, 0)
    assert scanned("<|pyth") == (0, None) and scanned("Hi") == (2, None) and scanned("Hi {", '"name"') == (10, None)
    call = ('{"name": "get_weather", ', '"parameters": {"city": "Oslo"}}')
    fe = make_frontend(decode=FakePool("decode_pool", script=call), tool_call_parser="llama3_json")
    events = json_events(_chat(fe, max_tokens=8, tools=TOOLS, stream=True))
    deltas = [e["choices"][0]["delta"] for e in events[1:]]
    assert not any(d.get("content") for d in deltas)
    assert [d["tool_calls"][0]["function"]["arguments"] for d in deltas if "tool_calls" in d] == ['{"city": "Oslo"}']
    assert fe.decode.generates[0].sampling.skip_special_tokens is True
    prose = ("Call ", '{"name": "get_time", "parameters": {}}')  # not at the start: vLLM streams it as content
    fe = make_frontend(decode=FakePool("decode_pool", script=prose), tool_call_parser="llama3_json")
    events = json_events(_chat(fe, max_tokens=8, tools=TOOLS, stream=True))
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == "".join(prose)
    assert not any("tool_calls" in e["choices"][0]["delta"] for e in events)


def test_the_pythonic_shape_check_accepts_what_vllms_pattern_accepts_in_one_pass():
    """vLLM's pattern backtracks exponentially; ours decides the same in one pass (generated short texts, where
    the pattern is still quick), and a long almost-matching output is decided at once."""
    rng = random.Random(0)

    def text() -> str:  # 1-3 calls, names, arguments, separators and endings of every kind; a third cut somewhere
        arguments = ["", "a=1", "a=1, b=2", "a=1,", "a=(1)", "1", "a = 1", "a=1 "]
        calls = [
            rng.choice(["f", "g", "_h", "f1", "é"]) + f"({rng.choice(arguments)})" for _ in range(rng.randint(1, 3))
        ]
        out = "[" + "".join(c + rng.choice([", ", ",", " ", "", " ,"]) for c in calls[:-1]) + calls[-1]
        out += rng.choice(["]", " ]", "\n]", "", "] x", ")]"])
        cut = rng.randrange(len(out))
        return out[:cut] + out[cut + 1 :] if rng.random() < 0.3 else out

    texts = [text() for _ in range(3000)]
    theirs = [PythonicToolParser.TOOL_CALL_REGEX.match(t) is not None for t in texts]
    assert [_looks_pythonic(t) for t in texts] == theirs and 500 < sum(theirs) < 2500
    assert not _looks_pythonic("[f(" + "a=1, " * 10_000 + "x")


def test_pythonic_streams_content_unless_the_output_opens_with_a_list():
    calls = ("[get_weather(", "city='Oslo'), get_time()]")
    fe = make_frontend(decode=FakePool("decode_pool", script=calls), tool_call_parser="pythonic")
    events = json_events(_chat(fe, max_tokens=8, tools=TOOLS, stream=True))
    deltas = [e["choices"][0]["delta"] for e in events[1:]]
    assert not any(d.get("content") for d in deltas)
    (sent,) = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in sent] == [
        ("get_weather", '{"city": "Oslo"}'),
        ("get_time", "{}"),
    ]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    prose = ("Call ", "[get_time()]")
    fe = make_frontend(decode=FakePool("decode_pool", script=prose), tool_call_parser="pythonic")
    events = json_events(_chat(fe, max_tokens=8, tools=TOOLS, stream=True))
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == "".join(prose)


def test_a_partial_tag_is_held_back_until_it_is_known():
    hermes = PARSERS["hermes"]

    def sendable(*pieces: str) -> int:
        scan = CallOpenerScan(hermes.openers, hermes.anchored)
        return [scan.feed(p) for p in pieces][-1]

    assert sendable("ok <tool_") == 3 and sendable("ok <b") == 5 and sendable("a <") == 2
    assert sendable("ok <to", "ol_") == 3 and sendable("ok <", "tool_call>") == 3


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
CALL = ("Sure. ", "<tool", '_call>\n{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}\n</tool_call>')


def _chat(fe, **body):
    return chat(fe, "weather?", **body)


def test_auto_reads_calls_from_the_text_whole_and_streamed_with_special_tokens_kept():
    fe = make_frontend(decode=FakePool("decode_pool", script=CALL), tool_call_parser="hermes")
    choice = _chat(fe, max_tokens=8, tools=TOOLS).json()["choices"][0]
    assert choice["message"]["content"] == "Sure. " and choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    assert fe.decode.generates[0].sampling.skip_special_tokens is False
    assert fe.decode.generates[0].sampling.structured is None  # auto: free text
    events = json_events(_chat(fe, max_tokens=8, tools=TOOLS, stream=True))
    deltas = [e["choices"][0]["delta"] for e in events[1:]]
    assert "".join(d.get("content", "") for d in deltas) == "Sure. "  # the tag never leaks as content
    assert [d["tool_calls"][0]["function"]["name"] for d in deltas if "tool_calls" in d] == ["get_weather"]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_auto_without_a_call_is_plain_content():
    fe = make_frontend(decode=FakePool("decode_pool", script=("no ", "<b>call</b>")), tool_call_parser="hermes")
    choice = _chat(fe, max_tokens=8, tools=TOOLS).json()["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "no <b>call</b>"} and choice["finish_reason"] == "stop"
    events = json_events(_chat(fe, max_tokens=8, tools=TOOLS, stream=True))
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == "no <b>call</b>"
