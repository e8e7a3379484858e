"""One LoRA adapter as a request carries it to an engine: its name and where its weights are.

The engines load an adapter on first use from `source` (vLLM's `LoRARequest`, SGLang's `lora_path`), so a
replica that never saw it (restarted, scaled up) serves it all the same. vLLM keys adapters by an integer
(`lora_int_id`) that must name the same weights on every engine and every frontend: `engine_id` is derived
from the name and source alone, so no coordination hands it out, and a name unloaded and loaded again from
another source is new to every engine (vLLM would otherwise keep serving the weights it cached).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(frozen=True)
class LoraAdapter:
    name: str  # what clients send as `model`; vLLM's `lora_name`, which its KV events carry
    source: str  # a local directory (absolute) or a Hugging Face id, as the engines read it

    @property
    def engine_id(self) -> int:
        """A positive 31-bit integer from name and source: vLLM's `lora_int_id` (a C int in its kernels'
        metadata). Two adapters that collide are refused when the second is loaded (`AdapterCatalog`)."""
        key = f"{self.name}\0{self.source}".encode()
        digest = hashlib.blake2b(key, digest_size=4, person=b"lora-id").digest()
        return int.from_bytes(digest, "big") % (2**31 - 1) + 1

    @property
    def is_local(self) -> bool:
        return self.source.startswith("/")

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "source": self.source}
