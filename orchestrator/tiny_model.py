"""A tiny random Llama with a locally trained tokenizer: a real model for CPU
engines that needs no download.

The weights are random, so the text it writes is gibberish; what matters for
tests is that the engine runs a real transformer and that greedy decoding is
deterministic. Everything here is seeded: the same call writes the same files.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

# Marker written last; a directory without it is an interrupted build.
COMPLETE_MARKER = "tiny-model.json"

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]

_WORDS = (
    "the of and to in is was for on that with as by at from his her it an were are "
    "which this be or has had not but have they one all their also been its new first "
    "two time more can other after who may some would into over such only most made "
    "city state world year people music water river school family game team system "
    "model token cache block prefill decode engine request replica pool route serve "
    "kernel memory latency throughput batch prompt answer question light stone green "
    "house market garden winter summer north south east west small large early late"
).split()


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the generated model. head_dim = hidden_size / num_attention_heads
    must be 64 or more: vLLM's CPU attention rejects 16."""

    vocab_size: int = 1024
    hidden_size: int = 256
    intermediate_size: int = 512
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 8192
    # Larger than Llama's 0.02 so that greedy logits have clear margins and the
    # argmax does not flip under float32 reordering between batch shapes.
    initializer_range: float = 0.5
    seed: int = 0


def is_complete(model_dir: str | Path) -> bool:
    return (Path(model_dir).expanduser() / COMPLETE_MARKER).is_file()


def _corpus(seed: int, n_sentences: int = 4000) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 16))) + "." for _ in range(n_sentences)]


def _train_tokenizer(spec: TinyModelSpec):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(spec.seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
        chat_template=CHAT_TEMPLATE,
        model_max_length=spec.max_position_embeddings,
    )


def make_tiny_model(model_dir: str | Path, spec: TinyModelSpec = TinyModelSpec()) -> Path:
    """Write a Hugging Face model directory (config, safetensors weights,
    tokenizer with a chat template) to ``model_dir`` and return its path.
    A directory that is already complete is left as it is."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(model_dir).expanduser().resolve()
    if is_complete(out):
        return out
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = _train_tokenizer(spec)
    tokenizer.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    (out / COMPLETE_MARKER).write_text(json.dumps({"spec": spec.__dict__}, indent=2))
    return out
