"""The app's run-time LoRA adapters in Ray's GCS key-value store (`AdapterStore`, orchestrator/lora/store.py):
one key per adapter, under a prefix of the application and its deploy, so

    add      a put that never overwrites: of two frontends loading one name, one wins
    remove   a delete
    all      the prefix's keys, then each value

The GCS outlives frontend and replica restarts; a new deploy (a new `deploy_id`) starts from the config's
adapters alone. Each call is one blocking GCS round trip, made off the event loop."""

from __future__ import annotations

import asyncio
import json

from ray.experimental import internal_kv

from orchestrator.lora.adapter import LoraAdapter

NAMESPACE = "orchestrator"


class GcsAdapterStore:
    def __init__(self, app_name: str, deploy_id: str) -> None:
        self._prefix = f"lora-adapters/{app_name}/{deploy_id}/"

    async def add(self, adapter: LoraAdapter) -> bool:
        value = json.dumps(adapter.to_dict()).encode()
        existed = await asyncio.to_thread(
            internal_kv._internal_kv_put, self._prefix + adapter.name, value, False, namespace=NAMESPACE
        )
        return not existed

    async def remove(self, name: str) -> bool:
        deleted = await asyncio.to_thread(internal_kv._internal_kv_del, self._prefix + name, namespace=NAMESPACE)
        return deleted > 0

    async def all(self) -> tuple[LoraAdapter, ...]:
        return await asyncio.to_thread(self._all)

    def _all(self) -> tuple[LoraAdapter, ...]:
        adapters = []
        for key in internal_kv._internal_kv_list(self._prefix, namespace=NAMESPACE):
            value = internal_kv._internal_kv_get(key, namespace=NAMESPACE)
            if value is not None:  # removed between the listing and the read
                adapters.append(LoraAdapter(**json.loads(value)))
        return tuple(adapters)
