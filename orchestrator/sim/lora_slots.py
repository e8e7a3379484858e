"""The simulated engine's LoRA adapters, as vLLM's engine keeps them:

    a batch runs at most `max_loras` distinct adapters: a waiting request whose adapter would be one more
        is skipped this step (it keeps its place; those behind it may go)
    the host cache keeps the last `max_cpu_loras` adapters run (least recently used evicted); an adapter
        not in it is read from its source before the step that first runs it, which takes `load_s` longer

`loads` counts those reads: what the routing benchmarks report as adapter loads."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from orchestrator.config import LoraConfig


@dataclass(frozen=True)
class LoraSpec:
    max_loras: int
    max_cpu_loras: int
    load_s: float


def lora_spec(lora: LoraConfig | None, load_s: float) -> LoraSpec | None:
    """The engine's adapter limits from model.lora (None: no adapters)."""
    if lora is None:
        return None
    return LoraSpec(lora.max_loras, lora.max_cpu_loras or lora.max_loras, load_s)


class EngineLoras:
    def __init__(self, spec: LoraSpec) -> None:
        self.spec = spec
        self._cache: OrderedDict[str, None] = OrderedDict()
        self.loads = 0

    def admits(self, running: set[str], adapter: str | None) -> bool:
        """Whether a batch already running `running` adapters may take a request with `adapter`."""
        return adapter is None or adapter in running or len(running) < self.spec.max_loras

    def activate(self, adapter: str) -> float:
        """The adapter runs this step: seconds spent reading it first (0 when the host cache holds it)."""
        cache = self._cache
        if adapter in cache:
            cache.move_to_end(adapter)
            return 0.0
        cache[adapter] = None
        if len(cache) > self.spec.max_cpu_loras:
            cache.popitem(last=False)
        self.loads += 1
        return self.spec.load_s
