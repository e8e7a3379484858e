"""vLLM's own reasoning parsers (its `--reasoning-parser` registry) behind the frontend's
`ReasoningParser`, for the formats the frontend does not read itself (glm45, kimi_k2,
deepseek_v3, minimax_m2, mistral, seed_oss, granite, ...).

Each choice gets its own vLLM `Parser` (vllm/parser), made and driven as vLLM's chat
server drives it:

    made     = the composed parser class (ParserManager.get_parser, reasoning only),
               (tokenizer, chat_template_kwargs = the request's template variables)
    whole    = set_prompt_token_ids(prompt); parse(output text, token ids) -> (reasoning, content)
    streamed = parse_delta(each new piece of text and its token ids, prompt, finished),
               each piece's reasoning and content passed on as they come; so the prompt's own end of
               thinking (a template that closed it) and the format's token-level markers
               are read as vLLM reads them, with no re-reading of the whole output per token

vLLM is imported when a parser is made (in the frontend's process), not with this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from orchestrator.engines.vllm_tool_parsers import chat_request
from orchestrator.prompts import Tokenizer

if TYPE_CHECKING:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.abstract_parser import Parser


def names() -> list[str]:
    """Every `--reasoning-parser` name of this vLLM."""
    from vllm.reasoning import ReasoningParserManager

    return ReasoningParserManager.list_registered()


class VllmReasoningParser:
    """One vLLM reasoning format. ValueError when vLLM has no parser of that name, the tokenizer
    lacks the format's tokens, or the format is not read from text."""

    def __init__(self, name: str, tokenizer: Tokenizer) -> None:
        from vllm.parser.parser_manager import ParserManager
        from vllm.tokenizers.hf import get_cached_tokenizer

        if name not in names():
            raise ValueError(f"vLLM has no reasoning parser {name!r}; known: {', '.join(names())}")
        # Its vocabulary read once: parsers look their tokens up in it each time one is made.
        self._tokenizer = get_cached_tokenizer(tokenizer)
        try:
            self._parser_class: type[Parser] = ParserManager.get_parser(
                reasoning_parser_name=name, tokenizer=self._tokenizer
            )
        except TypeError as e:  # the tokenizer lacks the format's tokens
            raise ValueError(f"reasoning parser {name!r} cannot read this model's output: {e}") from None
        probe, request = self._new({}), chat_request()
        try:
            probe.parse("", request)
        except NotImplementedError:  # e.g. "openai_gptoss": vLLM reads gpt-oss from Harmony tokens, not text
            raise ValueError(f"vLLM's reasoning parser {name!r} does not read reasoning from text") from None
        self.name = name
        self.keeps_special_tokens: bool = not probe.adjust_request(request).skip_special_tokens

    def _new(self, template_variables: Mapping[str, Any]) -> Parser:
        return self._parser_class(self._tokenizer, None, chat_template_kwargs=dict(template_variables))

    def splitter(self, template_variables: Mapping[str, Any], prompt_token_ids: Sequence[int]) -> VllmReasoningSplitter:
        return VllmReasoningSplitter(
            self._new(template_variables), chat_request(template_variables=template_variables), prompt_token_ids
        )


class VllmReasoningSplitter:
    """One choice's output through its own vLLM parser (see the module's docstring)."""

    def __init__(self, parser: Parser, request: ChatCompletionRequest, prompt_token_ids: Sequence[int]) -> None:
        self._parser = parser
        self._request = request
        self._prompt = list(prompt_token_ids)

    def split(self, text: str, token_ids: Sequence[int]) -> tuple[str | None, str | None]:
        self._parser.set_prompt_token_ids(self._prompt)
        reasoning, content, _ = self._parser.parse(text, self._request, model_output_token_ids=token_ids)
        return reasoning, content

    def feed(self, text: str, token_ids: Sequence[int], final: bool) -> tuple[str, str]:
        delta = self._parser.parse_delta(text, list(token_ids), self._request, self._prompt, finished=final)
        if delta is None:
            return "", ""
        return delta.reasoning or "", delta.content or ""
