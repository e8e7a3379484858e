"""Reasoning formats the frontend does not read itself, read by vLLM's own parser of that
`--reasoning-parser` name (orchestrator/engines/vllm_reasoning_parsers.py): through the API,
whole and streamed, each answer what vLLM's own Parser makes of the same output, prompt and
template variables; and the names checked when the frontend is built."""

from __future__ import annotations

import pytest
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.parser.parser_manager import ParserManager

from tests.factories import FakePool, chat, json_events, make_frontend, tiny_tokenizer

FORMAT_TOKENS = ["<think>", "</think>", "<seed:think>", "</seed:think>"]

# name -> (template variables, output in pieces as the engine streams it, reasoning, content): the
# formats' thinking tags as their chat templates write them, each tag one token as a model writes it.
CASES = {
    "glm45": ({}, ("<think>Two and", " two.", "</think>", "Fo", "ur."), "Two and two.", "Four."),
    "kimi_k2": ({}, ("<think>", "Two and two.", "</think>", "Four."), "Two and two.", "Four."),
    "minimax_m2": ({}, ("Two and two.", "</think>", "Four."), "Two and two.", "Four."),  # the template opened it
    "seed_oss": ({}, ("<seed:think>Two and two.", "</seed:think>Four."), "Two and two.", "Four."),
    # DeepSeek-V3.1 thinks only when the request turns thinking on; otherwise all is the answer.
    "deepseek_v3": ({"thinking": True}, ("Two and two.", "</think>", "Four."), "Two and two.", "Four."),
    "deepseek_v3-off": ({}, ("Two and two.", "</think>", "Four."), None, "Two and two.</think>Four."),
    # GLM-4.5 with enable_thinking false: the answer alone.
    "glm45-off": ({"enable_thinking": False}, ("Four.",), None, "Four."),
}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return tiny_tokenizer(tmp_path_factory.mktemp("tiny"), FORMAT_TOKENS)


def _frontend(tokenizer, name, script=("plain",)):
    pool = FakePool(
        "decode_pool",
        script=script,
        script_token_ids=tuple(tuple(tokenizer.encode(p, add_special_tokens=False)) for p in script),
    )
    return make_frontend(decode=pool, reasoning_parser=name, engine_kind="vllm", tokenizer=tokenizer)


def _vllms(tokenizer, name, variables, script, prompt, streamed):
    """What vLLM's own Parser makes of the same output: (reasoning, content)."""
    parser = ParserManager.get_parser(reasoning_parser_name=name)(tokenizer, None, chat_template_kwargs=variables)
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}])
    request.chat_template_kwargs = variables
    ids = [tuple(tokenizer.encode(p, add_special_tokens=False)) for p in script]
    if not streamed:
        parser.set_prompt_token_ids(prompt)
        reasoning, content, _ = parser.parse("".join(script), request, model_output_token_ids=sum(ids, ()))
        return reasoning, content
    parts = ["", ""]
    for k, (piece, piece_ids) in enumerate(zip(script, ids)):
        delta = parser.parse_delta(piece, list(piece_ids), request, list(prompt), finished=k == len(script) - 1)
        if delta is not None:
            parts = [parts[0] + (delta.reasoning or ""), parts[1] + (delta.content or "")]
    return parts[0] or None, parts[1] or None


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_answer_is_split_as_vllms_own_parser_splits_it_whole_and_streamed(tokenizer, case):
    variables, script, reasoning, content = CASES[case]
    name = case.removesuffix("-off")
    fe = _frontend(tokenizer, name, script)
    body = {"max_tokens": 8, "chat_template_kwargs": variables}
    message = chat(fe, "2+2?", **body).json()["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == (reasoning, content)
    prompt = fe.decode.generates[0].prompt_token_ids
    assert (reasoning, content) == _vllms(tokenizer, name, variables, script, prompt, streamed=False)

    events = json_events(chat(fe, "2+2?", stream=True, **body))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    streamed = ("".join(d.get("reasoning") or "" for d in deltas), "".join(d.get("content") or "" for d in deltas))
    assert (streamed[0] or None, streamed[1] or None) == _vllms(tokenizer, name, variables, script, prompt, True)
    if reasoning:  # the thinking streams as it comes, in its own deltas before the answer's
        first_reasoning = next(k for k, d in enumerate(deltas) if d.get("reasoning"))
        assert not any(d.get("content") for d in deltas[: first_reasoning + 1])
        assert any(d.get("content") for d in deltas[first_reasoning + 1 :]) == bool(content)


def test_hidden_reasoning_leaves_the_answer(tokenizer):
    variables, script, _, content = CASES["glm45"]
    fe = _frontend(tokenizer, "glm45", script)
    message = chat(fe, "2+2?", max_tokens=8, include_reasoning=False).json()["choices"][0]["message"]
    assert (message["reasoning"], message["content"]) == (None, content)
    events = json_events(chat(fe, "2+2?", max_tokens=8, include_reasoning=False, stream=True))
    deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
    assert "".join(d.get("content") or "" for d in deltas) == content
    assert not any(d.get("reasoning") for d in deltas)


def test_a_format_this_model_or_text_cannot_carry_fails_the_build(tokenizer):
    with pytest.raises(ValueError, match="'k2_horizon' cannot read this model's output"):  # tokens not in the vocab
        _frontend(tokenizer, "k2_horizon")
    with pytest.raises(ValueError, match="'openai_gptoss' does not read reasoning from text"):
        _frontend(tokenizer, "openai_gptoss")
