"""Tool-call formats the frontend does not read itself, read by vLLM's own parser of that
`--tool-call-parser` name (orchestrator/engines/vllm_tool_parsers.py): "auto" through the API,
whole and streamed, on outputs in each model's documented format; and the names checked
when the frontend is built."""

from __future__ import annotations

import json

import pytest

from tests.factories import FakePool, chat, json_events, make_frontend, tiny_tokenizer

# The special tokens of the formats below, added to the tiny model's tokenizer as each model's own has them.
FORMAT_TOKENS = [
    "[TOOL_CALLS]",
    "[ARGS]",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_end|>",
    "<|tool_call_argument_begin|>",
    "<tool_call>",
    "</tool_call>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}},
        },
    }
]

# name -> (output in pieces as the engine streams it, content, calls as (name, arguments)).
CASES = {
    # Qwen3-Coder's XML calls (its chat template, qwen3coder_tool_parser): a parameter's type comes from the
    # tool's schema, so "3" becomes the integer 3 only when the request's tools reach the parser.
    "qwen3_coder": (
        (
            "Let me see.",
            "\n<tool_call>\n<function=get_weather>\n",
            "<parameter=city>\nOslo\n</parameter>\n",
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        ),
        "Let me see.",
        [("get_weather", {"city": "Oslo", "days": 3})],
    ),
    # Kimi K2 (Moonshot's tool-call guidance: a section of calls named functions.NAME:INDEX).
    "kimi_k2": (
        (
            "Checking. ",
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0",
            '<|tool_call_argument_begin|>{"city": "Oslo"}<|tool_call_end|><|tool_calls_section_end|>',
        ),
        "Checking. ",
        [("get_weather", {"city": "Oslo"})],
    ),
    # Mistral's v11+ tokenizer format (mistral-common: [TOOL_CALLS]name[ARGS]{...}).
    "mistral": (
        ("Sure", '[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}', '[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}'),
        "Sure",
        [("get_weather", {"city": "Oslo"}), ("get_weather", {"city": "Rome"})],
    ),
    # DeepSeek-V3's chat template: a function-typed call with its arguments in a json block.
    "deepseek_v3": (
        (
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n",
            '```json\n{"city": "Oslo"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        ),
        "",
        [("get_weather", {"city": "Oslo"})],
    ),
    # Salesforce xLAM's model card: a bare JSON list of calls; the format has no opening token.
    "xlam": (
        ('[{"name": "get_weather", ', '"arguments": {"city": "Oslo"}}]'),
        "",
        [("get_weather", {"city": "Oslo"})],
    ),
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tiny"), FORMAT_TOKENS)


def _frontend(tokenizer, name, script=("plain",)):
    return make_frontend(
        decode=FakePool("decode_pool", script=script), tool_call_parser=name, engine_kind="vllm", tokenizer=tokenizer
    )


def _calls(tool_calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in tool_calls]


@pytest.mark.parametrize("name", sorted(CASES))
def test_auto_reads_each_engine_format_whole(tokenizer, name):
    script, content, calls = CASES[name]
    fe = _frontend(tokenizer, name, script)
    choice = chat(fe, "weather?", max_tokens=8, tools=TOOLS).json()["choices"][0]
    assert (choice["message"]["content"] or "") == content
    assert _calls(choice["message"]["tool_calls"]) == calls
    assert choice["finish_reason"] == "tool_calls"
    assert fe.decode.generates[0].sampling.structured is None  # auto: free text


@pytest.mark.parametrize("name", sorted(CASES))
def test_auto_streams_content_until_the_format_opens_a_call(tokenizer, name):
    """Content before the call streams as it comes; the calls come whole with the finish, and the
    stream says what the whole answer says. A format with no opening token holds all to the finish."""
    script, content, calls = CASES[name]
    events = json_events(chat(_frontend(tokenizer, name, script), "weather?", max_tokens=8, tools=TOOLS, stream=True))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("content") or "" for d in deltas).strip() == content.strip()
    assert _calls([c for d in deltas for c in d.get("tool_calls", [])]) == calls
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
    early = "".join(d.get("content") or "" for d in deltas[:-1])
    assert early.strip() == (content.strip() if name != "xlam" else "")  # sent before the finish


def test_a_format_keeps_the_special_tokens_its_vllm_parser_keeps_and_mistral_ids_are_its_own(tokenizer):
    """kimi_k2's parser turns skip_special_tokens off, xlam's does not (vLLM's adjust_request);
    a Mistral call id is 9 characters, as Mistral's chat template requires on the next turn."""
    kimi = _frontend(tokenizer, "kimi_k2", CASES["kimi_k2"][0])
    chat(kimi, "weather?", max_tokens=8, tools=TOOLS)
    assert kimi.decode.generates[0].sampling.skip_special_tokens is False
    xlam = _frontend(tokenizer, "xlam", CASES["xlam"][0])
    chat(xlam, "weather?", max_tokens=8, tools=TOOLS)
    assert xlam.decode.generates[0].sampling.skip_special_tokens is True
    mistral = _frontend(tokenizer, "mistral", CASES["mistral"][0])
    ids = [
        c["id"]
        for c in chat(mistral, "weather?", max_tokens=8, tools=TOOLS).json()["choices"][0]["message"]["tool_calls"]
    ]
    assert [len(i) for i in ids] == [9, 9] and ids[0] != ids[1]


def test_an_output_without_a_call_stays_content(tokenizer):
    fe = _frontend(tokenizer, "qwen3_coder", ("No tool ", "needed <b>here</b>."))
    choice = chat(fe, "hi", max_tokens=8, tools=TOOLS).json()["choices"][0]
    assert choice["message"]["content"] == "No tool needed <b>here</b>." and "tool_calls" not in choice["message"]
    assert choice["finish_reason"] == "stop"
    events = json_events(chat(fe, "hi", max_tokens=8, tools=TOOLS, stream=True))
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"]) == (
        "No tool needed <b>here</b>."
    )


def test_a_format_this_model_or_text_cannot_carry_fails_the_build(tokenizer):
    with pytest.raises(ValueError, match="'jamba' cannot read this model's output"):  # its tokens are not in this vocab
        _frontend(tokenizer, "jamba")
    with pytest.raises(ValueError, match="'openai' does not read calls from text"):
        _frontend(tokenizer, "openai")
