"""The ingress: the OpenAI API over the pools, with the scheduler in-process."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.adapter_store import GcsAdapterStore
from deployments.pool_client import ServePoolClient
from deployments.process_priority import set_niceness
from deployments.response_store import ServeResponseStore
from deployments.serve_status import serve_http_host
from orchestrator.api.app import AppHooks, Health, build_openai_app
from orchestrator.api.exposure import exposure_problem
from orchestrator.config import PRIMARY_GROUP, AppConfig, DataPlane
from orchestrator.frontend import PoolGroup, build_frontend
from orchestrator.lora.catalog import AdapterCatalog
from orchestrator.metrics import DirectPathFallbacks
from orchestrator.prompts import load_tokenizer
from orchestrator.tracing import tracer_from_config
from orchestrator.wire.client import Parking, ReplicaStreams

log = logging.getLogger("ray.serve")


@serve.deployment
@serve.ingress()
class Frontend:
    """The parts come from `orchestrator.frontend.build_frontend`; this shell adds Serve's
    pool transport (deployment handles, or direct connections to the replicas), the API key
    from the environment and the replica id in `/pools`."""

    async def __init__(
        self,
        config: dict[str, Any],
        decode_pool: DeploymentHandle,
        prefill_pool: DeploymentHandle | None = None,
        pool_groups: dict[str, list[DeploymentHandle | None]] | None = None,
        *,
        wire_secret: str,
        response_store: DeploymentHandle | None = None,
    ) -> None:
        """`pool_groups`: further groups' handles, group name -> [decode, prefill or None]; `wire_secret`: the
        application's data-plane secret (hex), proved to every replica; `response_store`: the store of Responses
        API responses the app's frontends share (None: this frontend keeps its own, or none with the store off)."""
        app = AppConfig.model_validate(config)
        self.config = app
        set_niceness(app.serving_niceness)
        handles = {PRIMARY_GROUP: (decode_pool, prefill_pool)}
        handles.update({name: (pair[0], pair[1]) for name, pair in (pool_groups or {}).items()})
        # One data-plane connection per replica, shared by every pool and request.
        direct = app.frontend.data_plane is DataPlane.DIRECT
        stalled = app.frontend.stalled_readers
        parking = Parking(stalled.park_after_s, stalled.park_after_tokens) if stalled.park else None
        self.streams = ReplicaStreams(bytes.fromhex(wire_secret), parking=parking) if direct else None
        fallbacks = DirectPathFallbacks()
        groups = {
            name: PoolGroup(
                ServePoolClient(decode, self.streams, fallbacks),
                ServePoolClient(prefill, self.streams, fallbacks) if prefill is not None else None,
            )
            for name, (decode, prefill) in handles.items()
        }
        tokenizer = await asyncio.to_thread(load_tokenizer, app.model.tokenizer_source)
        # Tracing on (tracing.otlp_endpoint): spans exported over OTLP/HTTP by a BatchSpanProcessor.
        self.tracer = tracer_from_config(app.tracing)
        # Adapters loaded at run time: shared by this deploy's frontends (its data-plane secret names the deploy).
        deploy_id = hashlib.sha256(bytes.fromhex(wire_secret)).hexdigest()[:16]
        store = GcsAdapterStore(serve.get_replica_context().app_name, deploy_id)
        self.parts = build_frontend(
            app,
            groups,
            tokenizer,
            tracer=self.tracer,
            adapter_store=store,
            response_store=ServeResponseStore(response_store) if response_store is not None else None,
        )
        self.parts.metrics.add_collector(fallbacks)
        # Secure by default: no key on a non-loopback address is a refusal to start, naming what to set.
        problem = exposure_problem(await serve_http_host(), app.frontend.auth, bool(app.traffic.tenants))
        if problem is not None:
            raise RuntimeError(problem)
        self.api_key = _key_from_env("api_key_env", app.frontend.auth.api_key_env)
        self.admin_key = _key_from_env("admin_key_env", app.frontend.auth.admin_key_env)
        self.tenant_keys = {
            t.name: _key_from_env(f"traffic.tenants[{t.name}].api_key_env", t.api_key_env) for t in app.traffic.tenants
        }
        # Handles build their routers on first use; until then a pool shows no replicas.
        self._background = [asyncio.create_task(pool.connect()) for pool in self.parts.pools().values()]
        self._background.append(asyncio.create_task(self.parts.kv_events.run()))
        if self.parts.catalog is not None:
            self._background.append(asyncio.create_task(_follow_adapters(self.parts.catalog)))

    def __serve_build_asgi_app__(self):
        hooks = AppHooks(
            health=self._health,
            pools=self._pools_report,
            max_request_bytes=self.config.frontend.limits.max_request_bytes,
            api_key=self.api_key,
            admin_key=self.admin_key,
            tenant_keys=self.tenant_keys,
        )
        return build_openai_app(self.parts.service, hooks, self.parts.responses)

    async def _health(self) -> Health:
        return self.parts.health()

    def _pools_report(self) -> dict[str, Any]:
        return self.parts.pools_report() | {"frontend_replica": serve.get_replica_context().replica_id.unique_id}

    async def __del__(self) -> None:
        for task in getattr(self, "_background", []):
            task.cancel()
        if getattr(self, "streams", None) is not None:
            self.streams.close()
        if getattr(self, "tracer", None) is not None:
            self.tracer.shutdown()  # exports the spans still queued


async def _follow_adapters(catalog: AdapterCatalog) -> None:
    """Other frontends' loads and unloads reach this one within `catalog.refresh_s`."""
    while True:
        try:
            await catalog.refresh()
        except Exception:  # the GCS briefly unreachable: the last known set stands
            log.warning("reading the LoRA adapter store failed", exc_info=True)
        await asyncio.sleep(catalog.refresh_s)


def _field_path(field: str) -> str:
    return field if field.startswith("traffic.") else f"frontend.auth.{field}"


def _key_from_env(field: str, env: str | None) -> str | None:
    """The key in environment variable `env` (None when not configured); an error when it is named but unset."""
    if env is None:
        return None
    key = os.environ.get(env)
    if not key:
        raise RuntimeError(f"{_field_path(field)} names {env}, which is not set where this frontend runs")
    return key
