"""LoRA adapters of the tiny model (orchestrator/tiny_model.py) in PEFT's format, made locally: tests and
the main job need no download. Seeded random weights on the attention projections, large enough that
greedy outputs visibly differ from the base model's and from each other's; the same seed writes the same
files."""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.lora.check import CONFIG_FILE

TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
WEIGHTS_FILE = "adapter_model.safetensors"


def _projection_shapes(model: dict) -> dict[str, tuple[int, int]]:
    """(in, out) features of each target module, from the base model's config.json."""
    hidden = model["hidden_size"]
    head_dim = model.get("head_dim") or hidden // model["num_attention_heads"]
    kv = model["num_key_value_heads"] * head_dim
    return {"q_proj": (hidden, hidden), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (hidden, hidden)}


def make_tiny_lora(model_dir: str | Path, out_dir: str | Path, seed: int, rank: int = 8, scale: float = 0.5) -> Path:
    """Write one adapter of the model in `model_dir` to `out_dir` and return its path."""
    import numpy as np
    from safetensors.numpy import save_file

    model = json.loads((Path(model_dir).expanduser() / "config.json").read_text())
    out = Path(out_dir).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(model["num_hidden_layers"]):
        for module, (fan_in, fan_out) in _projection_shapes(model).items():
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((rank, fan_in)) * scale).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((fan_out, rank)) * scale).astype(np.float32)
    save_file(tensors, str(out / WEIGHTS_FILE))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(Path(model_dir).expanduser()),
        "r": rank,
        "lora_alpha": rank,
        "lora_dropout": 0.0,
        "target_modules": list(TARGET_MODULES),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
    }
    (out / CONFIG_FILE).write_text(json.dumps(config, indent=2))
    return out
