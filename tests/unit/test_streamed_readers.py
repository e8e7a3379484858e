"""The streamed readers (reasoning `feed`, the tool-call opener scan) read each chunk once and carry their state;
split anywhere, a stream must give what the output gives in one piece. Each format's documented outputs, streamed
through the API split at every point: tool calls against the same output streamed in one piece (an anchored format
streams text that does not open with a call as content, as vLLM does, so a stream need not equal the whole answer
there), reasoning against the whole answer."""

from __future__ import annotations

import json

import pytest

from tests.factories import FakePool, chat, json_events, make_frontend
from tests.unit.test_reasoning_parsers import OUTPUTS as THINKING_OUTPUTS
from tests.unit.test_tool_parsers import LLAMA_OUTPUTS, PYTHONIC_OUTPUTS, TOOLS
from tests.unit.test_tool_parsers import OUTPUTS as HERMES_OUTPUTS


def _splits(text: str) -> list[tuple[str, ...]]:
    """The output in one piece, in two at every point, and one character a piece."""
    return [(text,), *((text[:i], text[i:]) for i in range(1, len(text))), tuple(text)]


def _streamed(fe, **body) -> dict:
    """A streamed chat answer added up: its reasoning, content, tool calls (name, arguments) and finish."""
    events = json_events(chat(fe, "x", stream=True, max_tokens=400, **body))
    choices = [e["choices"][0] for e in events if e.get("choices")]
    deltas = [c["delta"] for c in choices]
    calls = [call for d in deltas for call in d.get("tool_calls", ())]
    return {
        "reasoning": "".join(d.get("reasoning") or "" for d in deltas) or None,
        "content": "".join(d.get("content") or "" for d in deltas) or None,
        "calls": [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls],
        "finish": [c["finish_reason"] for c in choices if c["finish_reason"]],
    }


@pytest.mark.parametrize(
    "name, text",
    [("hermes", t) for t in HERMES_OUTPUTS]
    + [("llama3_json", t) for t in LLAMA_OUTPUTS]
    + [("pythonic", t) for t in PYTHONIC_OUTPUTS],
)
def test_tool_calls_streamed_split_anywhere_read_as_the_output_in_one_piece(name, text):
    fe = make_frontend(decode=FakePool("decode_pool", script=(text,)), tool_call_parser=name, max_model_len=1024)
    whole = _streamed(fe, tools=TOOLS)
    for pieces in _splits(text)[1:]:
        fe.decode.script = pieces
        assert _streamed(fe, tools=TOOLS) == whole, pieces


@pytest.mark.parametrize("text", THINKING_OUTPUTS)
def test_reasoning_streamed_split_anywhere_equals_the_whole_answer(text):
    fe = make_frontend(
        decode=FakePool("decode_pool", script=(text,)), reasoning_parser="deepseek_r1", max_model_len=1024
    )
    message = chat(fe, "x", max_tokens=400).json()["choices"][0]["message"]
    for pieces in _splits(text):
        fe.decode.script = pieces
        streamed = _streamed(fe)
        assert (streamed["reasoning"], streamed["content"]) == (message["reasoning"], message["content"]), pieces
