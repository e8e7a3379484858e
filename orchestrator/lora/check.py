"""What the frontend can tell of an adapter before any engine loads it: a local directory in PEFT's
format (adapter_config.json with a LoRA `r` within the engines' `max_lora_rank`, and weights beside it).
A hub id is the engine's to check (it downloads it)."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.lora.adapter import LoraAdapter

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def adapter_problem(adapter: LoraAdapter, max_lora_rank: int) -> str | None:
    """Why the engines could not load `adapter`, in words a client can act on; None: nothing found."""
    if not adapter.is_local:
        return None
    root = Path(adapter.source)
    if not root.is_dir():
        return f"lora_path {adapter.source!r} is not a directory"
    try:
        config = json.loads((root / CONFIG_FILE).read_text())
    except FileNotFoundError:
        return f"lora_path {adapter.source!r} has no {CONFIG_FILE}"
    except (OSError, ValueError) as e:
        return f"{CONFIG_FILE} in {adapter.source!r} is not readable JSON: {e}"
    if not isinstance(config, dict):
        return f"{CONFIG_FILE} in {adapter.source!r} is not a JSON object"
    if config.get("peft_type", "LORA") != "LORA":
        return f"adapter {adapter.name!r} is a {config['peft_type']} adapter, not LoRA"
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        return f"{CONFIG_FILE} in {adapter.source!r} has no LoRA rank `r`"
    if rank > max_lora_rank:
        return f"adapter {adapter.name!r} has rank {rank}, above model.lora.max_lora_rank ({max_lora_rank})"
    if not any((root / name).is_file() for name in WEIGHT_FILES):
        return f"lora_path {adapter.source!r} has no {' or '.join(WEIGHT_FILES)}"
    return None
