"""Prompts to token ids, the way vLLM's own OpenAI server makes them.

The frontend tokenizes (the scheduler hashes token blocks), so engines only
ever see token ids. Completions: the text is encoded with the tokenizer's
special tokens (BOS where the model uses one). Chat: the model's chat
template is rendered with the generation prompt, then encoded without adding
special tokens again (the template carries them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class Tokenizer(Protocol):
    def __len__(self) -> int: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str: ...

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> Any: ...


def load_tokenizer(source: str) -> Tokenizer:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)


class PromptRenderer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = len(tokenizer)

    def completion_prompt(self, prompt: str | Sequence[int]) -> tuple[int, ...]:
        if isinstance(prompt, str):
            return tuple(self.tokenizer.encode(prompt, add_special_tokens=True))
        return tuple(prompt)

    def chat_prompt(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> tuple[int, ...]:
        """`tools` go to the template as vLLM passes them (templates without tool support ignore them)."""
        text = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
        return tuple(self.tokenizer.encode(text, add_special_tokens=False))

    def text(self, token_ids: Sequence[int]) -> str:
        """A prompt's text as echoed back (special tokens kept, as vLLM's echo does)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)
