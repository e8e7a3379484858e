"""An engine's LoRA adapters loaded once each, before the first request that names one.

Engine adapters call `ensure` before they submit a request with an adapter: the engine's own load call
(vLLM's `add_lora`, SGLang's `async_load_lora_adapter`) runs once a name and source, shared by concurrent
first requests; its failure is EngineRequestRejected (the adapter is the caller's), tried again by the next
request, and the engine keeps serving. A request never reaches an engine with an adapter it has not loaded:
vLLM's engine core dies of a load that fails inside a request."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from orchestrator.engines.base import EngineRequestRejected
from orchestrator.lora.adapter import LoraAdapter


class AdapterLoads:
    def __init__(
        self, load: Callable[[LoraAdapter], Awaitable[object]], reason: Callable[[BaseException], str]
    ) -> None:
        """`load`: the engine's load call, raising where it cannot; `reason`: its error in words."""
        self._load = load
        self._reason = reason
        self._loading: dict[str, tuple[str, asyncio.Task]] = {}  # name -> (source, its load)

    async def ensure(self, adapter: LoraAdapter) -> None:
        loading = self._loading.get(adapter.name)
        if loading is None or loading[0] != adapter.source:  # a name reloaded from elsewhere loads again
            loading = self._loading[adapter.name] = (adapter.source, asyncio.ensure_future(self._load(adapter)))
        try:
            await asyncio.shield(loading[1])
        except Exception as e:
            if self._loading.get(adapter.name) is loading:
                del self._loading[adapter.name]
            raise EngineRequestRejected(f"LoRA adapter '{adapter.name}' cannot be loaded: {self._reason(e)}") from e
