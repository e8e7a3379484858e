"""Where the adapters loaded at run time live, so that every frontend of one deploy serves the same set.

Contract: `add` refuses a name already there (atomically: two frontends loading one name, one wins), and a
frontend sees another's change within its catalog's refresh period, or at once on a request that names it.
Under Serve it is Ray's GCS key-value store (deployments/adapter_store.py): it outlives frontend and
replica restarts, and a new deploy of the app starts from its config's adapters alone."""

from __future__ import annotations

from typing import Protocol

from orchestrator.lora.adapter import LoraAdapter


class AdapterStore(Protocol):
    async def add(self, adapter: LoraAdapter) -> bool:
        """False: an adapter of that name is there already (nothing changed)."""
        ...

    async def remove(self, name: str) -> bool:
        """False: there is none of that name."""
        ...

    async def all(self) -> tuple[LoraAdapter, ...]: ...


class MemoryAdapterStore:
    """One process's store: a single frontend, the simulator, tests."""

    def __init__(self) -> None:
        self._adapters: dict[str, LoraAdapter] = {}

    async def add(self, adapter: LoraAdapter) -> bool:
        if adapter.name in self._adapters:
            return False
        self._adapters[adapter.name] = adapter
        return True

    async def remove(self, name: str) -> bool:
        return self._adapters.pop(name, None) is not None

    async def all(self) -> tuple[LoraAdapter, ...]:
        return tuple(self._adapters.values())
