"""The models one app serves: its base model and LoRA adapters of it.

    configured   model.lora.adapters: fixed for the deploy, never unloaded
    loaded       POST /v1/load_lora_adapter: in the shared store (every frontend's), until unloaded

A request's `model` resolves to the base (None), an adapter, or AdapterNotFound. A name this frontend does
not know is looked up in the store before it is refused (another frontend may just have loaded it);
the store is otherwise read every `refresh_s`, so an unload reaches every frontend within that period.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from orchestrator.lora.adapter import LoraAdapter
from orchestrator.lora.check import adapter_problem
from orchestrator.lora.store import AdapterStore


class AdapterNotFound(LookupError):
    """No model or adapter of that name is served."""


class AdapterConflict(ValueError):
    """The name (or its engine id) is taken, or it names something that cannot be unloaded."""


class AdapterInvalid(ValueError):
    """The adapter cannot be loaded: the message says why."""


# Loads the adapter into an engine, raising AdapterInvalid with the engine's reason where it cannot.
EngineCheck = Callable[[LoraAdapter], Awaitable[None]]


class AdapterCatalog:
    def __init__(
        self,
        base_model: str,
        configured: Sequence[LoraAdapter],
        store: AdapterStore,
        max_lora_rank: int,
        engine_check: EngineCheck | None = None,
        refresh_s: float = 2.0,
    ) -> None:
        self.base_model = base_model
        self.configured = {a.name: a for a in configured}
        self.store = store
        self.max_lora_rank = max_lora_rank
        self.engine_check = engine_check
        self.refresh_s = refresh_s
        self._loaded: dict[str, LoraAdapter] = {}

    def adapters(self) -> list[LoraAdapter]:
        return [*self.configured.values(), *self._loaded.values()]

    def resolve(self, model: str) -> LoraAdapter | None:
        """None for the base model; the adapter of that name; else AdapterNotFound."""
        if model == self.base_model:
            return None
        adapter = self.configured.get(model) or self._loaded.get(model)
        if adapter is None:
            raise AdapterNotFound(model)
        return adapter

    async def lookup(self, model: str) -> LoraAdapter | None:
        """`resolve`, reading the store once first where the name is unknown here (each such request reads it:
        another frontend may have loaded the name since this one last read; admission bounds the reads)."""
        try:
            return self.resolve(model)
        except AdapterNotFound:
            pass
        await self.refresh()
        return self.resolve(model)

    async def refresh(self) -> None:
        self._loaded = {a.name: a for a in await self.store.all() if a.name not in self.configured}

    async def load(self, adapter: LoraAdapter) -> None:
        """Serve `adapter` from every frontend: checked here, then by an engine, then stored."""
        await self.refresh()
        if adapter.name == self.base_model:
            raise AdapterConflict(f"The lora adapter '{adapter.name}' conflicts with a served base model.")
        if adapter.name in self.configured or adapter.name in self._loaded:
            raise AdapterConflict(f"The lora adapter '{adapter.name}' has already been loaded.")
        clash = next((a for a in self.adapters() if a.engine_id == adapter.engine_id), None)
        if clash is not None:
            raise AdapterConflict(f"The lora adapter '{adapter.name}' collides with '{clash.name}'; rename it.")
        problem = await asyncio.to_thread(adapter_problem, adapter, self.max_lora_rank)  # reads its files
        if problem is not None:
            raise AdapterInvalid(problem)
        if self.engine_check is not None:
            await self.engine_check(adapter)
        if not await self.store.add(adapter):
            raise AdapterConflict(f"The lora adapter '{adapter.name}' has already been loaded.")
        self._loaded[adapter.name] = adapter

    async def unload(self, name: str) -> None:
        """New requests naming it get a 404 on every frontend; those already running finish with it."""
        if name in self.configured:
            raise AdapterConflict(f"The lora adapter '{name}' is in model.lora.adapters; remove it from the config.")
        if not await self.store.remove(name):
            raise AdapterNotFound(name)
        self._loaded.pop(name, None)
