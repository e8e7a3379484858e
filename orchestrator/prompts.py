"""Prompts to token ids, the way vLLM's own OpenAI server makes them.

The frontend tokenizes (the scheduler hashes token blocks), so engines only
ever see token ids. Completions: the text is encoded with the tokenizer's
special tokens (BOS where the model uses one) unless the request says not.
Chat: the model's chat template is rendered with the generation prompt (or
the last message left open), then encoded without adding special tokens
again (the template carries them) unless the request says to.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol


class Tokenizer(Protocol):
    def __len__(self) -> int: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> Any: ...


def load_tokenizer(source: str) -> Tokenizer:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)


@dataclass(frozen=True)
class ChatTemplateOptions:
    """How a chat becomes a prompt (vLLM's request fields of the same names)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False  # the last (assistant) message is left open for the model to go on
    add_special_tokens: bool = False  # on top of those the template writes
    variables: tuple[tuple[str, Any], ...] = ()  # chat_template_kwargs, e.g. enable_thinking


class ChatPrompt(NamedTuple):
    text: str  # the rendered template
    token_ids: tuple[int, ...]


class PromptRenderer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)

    @property
    def template(self) -> str | None:
        """The model's chat template (the default one of a tokenizer that names several)."""
        template = getattr(self.tokenizer, "chat_template", None)
        if isinstance(template, dict):
            return template.get("default")
        return template if isinstance(template, str) else None

    def completion_prompt(self, prompt: str | Sequence[int], add_special_tokens: bool = True) -> tuple[int, ...]:
        if isinstance(prompt, str):
            return tuple(self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens))
        return tuple(prompt)

    def chat_prompt(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        options: ChatTemplateOptions | None = None,
    ) -> ChatPrompt:
        """`tools` go to the template as vLLM passes them (templates without tool support ignore them).
        Raises ValueError when the template refuses the conversation."""
        o = options or ChatTemplateOptions()
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                tokenize=False,
                add_generation_prompt=o.add_generation_prompt,
                continue_final_message=o.continue_final_message,
                **dict(o.variables),
            )
        except Exception as e:  # the template's own raise_exception, or a variable it cannot use
            raise ValueError(f"the chat template failed: {e}") from e
        return ChatPrompt(text, tuple(self.tokenizer.encode(text, add_special_tokens=o.add_special_tokens)))

    def text(self, token_ids: Sequence[int]) -> str:
        """A prompt's text as echoed back (special tokens kept, as vLLM's echo does)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)
