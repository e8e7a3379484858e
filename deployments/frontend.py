"""The ingress: the OpenAI API over the pools, with the scheduler in-process."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from orchestrator.kv.subscriber import KVEventSubscriber
from deployments.pool_client import ServePoolClient
from orchestrator.api.admission import AdmissionGate
from orchestrator.api.app import AppHooks, Health, build_openai_app
from orchestrator.api.service import CompletionService, ModelCard
from orchestrator.config import PRIMARY_GROUP, AppConfig, DataPlane
from orchestrator.engines import publishes_kv_events
from orchestrator.kv.index import KVIndex
from orchestrator.kv.ingest import KVEventIngest
from orchestrator.metrics import FrontendMetrics
from orchestrator.prompts import PromptRenderer, load_tokenizer
from orchestrator.request_path import RequestPath
from orchestrator.routing import make_scheduler
from orchestrator.routing.report import SchedulerCollector
from orchestrator.routing.shape import CombinedLoad, ShapeRouter
from orchestrator.wire.client import ReplicaStreams

log = logging.getLogger("ray.serve")


@serve.deployment
@serve.ingress()
class Frontend:
    async def __init__(
        self,
        config: dict[str, Any],
        decode_pool: DeploymentHandle,
        prefill_pool: DeploymentHandle | None = None,
        pool_groups: dict[str, list[DeploymentHandle | None]] | None = None,
    ) -> None:
        """`pool_groups`: further groups' handles, group name -> [decode, prefill or None]."""
        app = AppConfig.model_validate(config)
        self.config = app
        handles = {PRIMARY_GROUP: (decode_pool, prefill_pool)}
        handles.update({name: (pair[0], pair[1]) for name, pair in (pool_groups or {}).items()})
        # Every pool of every group by deployment name, and per group its (decode, prefill) clients.
        self.pools: dict[str, ServePoolClient] = {}
        self.groups: dict[str, tuple[ServePoolClient, ServePoolClient | None]] = {}
        # One data-plane connection per replica, shared by every pool and request.
        self.streams = ReplicaStreams() if app.frontend.data_plane is DataPlane.DIRECT else None
        for group, (decode, prefill) in handles.items():
            decode_client = ServePoolClient(decode, self.streams)
            prefill_client = ServePoolClient(prefill, self.streams) if prefill is not None else None
            self.groups[group] = (decode_client, prefill_client)
            for client in (decode_client, prefill_client):
                if client is not None:
                    self.pools[client.name] = client
        tokenizer = await asyncio.to_thread(load_tokenizer, app.model.tokenizer_source)
        self.metrics = FrontendMetrics(pools=self._pool_views)
        # Each frontend replica keeps its own index, fed by the same event streams;
        # one index for every group (replica ids are unique), one scheduler per group.
        self.index = KVIndex()
        self.schedulers = {group: make_scheduler(app.routing, app.kv_cache.block_size, self.index)
                           for group in self.groups}
        self.scheduler = self.schedulers[PRIMARY_GROUP]
        loads = [s.load for s in self.schedulers.values() if getattr(s, "load", None) is not None]
        self.metrics.add_collector(SchedulerCollector(self.index, CombinedLoad(loads) if loads else None,
                                                      self._pool_views))
        self.kv_events = KVEventSubscriber(
            list(self.pools.values()), KVEventIngest(self.index), self.metrics, subscribe=publishes_kv_events(app)
        )
        paths = {
            group: RequestPath(
                decode_pool=decode,
                prefill_pool=prefill,
                scheduler=self.schedulers[group],
                metrics=self.metrics,
                prefill_timeout_s=app.frontend.prefill_timeout_s,
                max_migrations=app.frontend.max_migrations,
                detokenize=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            )
            for group, (decode, prefill) in self.groups.items()
        }
        path = paths[PRIMARY_GROUP]
        self.shape_router = None
        if app.routing.shape is not None:
            self.shape_router = ShapeRouter(app.routing.shape, app.kv_cache.block_size, self.index,
                                            list(self.groups))
        card = ModelCard(name=app.model.name, max_model_len=app.model.max_model_len, created=int(time.time()))
        self.service = CompletionService(card, PromptRenderer(tokenizer), path, self.metrics, limits=app.frontend.limits,
                                         gate=AdmissionGate(app.frontend.max_in_flight),
                                         retry_after_s=app.frontend.retry_after_s,
                                         group_paths=paths, shape_router=self.shape_router)
        self.api_key = None
        if app.frontend.auth.api_key_env is not None:
            self.api_key = os.environ.get(app.frontend.auth.api_key_env)
            if not self.api_key:
                raise RuntimeError(f"frontend.auth.api_key_env names {app.frontend.auth.api_key_env}, which is not set")
        # Handles build their routers on first use; until then a pool shows no replicas.
        self._background = [asyncio.create_task(pool.connect()) for pool in self.pools.values()]
        self._background.append(asyncio.create_task(self.kv_events.run()))

    def __serve_build_asgi_app__(self):
        hooks = AppHooks(health=self._health, pools=self._pools_report,
                         max_request_bytes=self.config.frontend.limits.max_request_bytes, api_key=self.api_key)
        return build_openai_app(self.service, hooks)

    def _pool_views(self):
        return {name: pool.replicas() for name, pool in self.pools.items()}

    def _groups_report(self) -> dict[str, Any]:
        return {group: {"mode": "aggregated" if prefill is None else "disaggregated",
                        "pools": [c.name for c in (decode, prefill) if c is not None]}
                for group, (decode, prefill) in self.groups.items()}

    async def _health(self) -> Health:
        counts = {name: len(views) for name, views in self._pool_views().items()}
        detail = {"mode": self.config.mode.value, "replicas": counts}
        if len(self.groups) > 1:
            detail["groups"] = self._groups_report()
        return Health(ready=all(counts.values()), detail=detail)

    def _pools_report(self) -> dict[str, Any]:
        shape = self.config.routing.shape
        return {
            "mode": self.config.mode.value,
            "routing": self.config.routing.policy.value,
            "groups": self._groups_report(),
            "shape_routing": shape.model_dump(mode="json") if shape is not None else None,
            "frontend_replica": serve.get_replica_context().replica_id.unique_id,
            "kv_index": {"blocks": self.index.num_blocks(), "following": self.kv_events.following()},
            "pools": {
                name: [
                    {
                        "replica_id": v.replica_id,
                        "info": v.info.to_dict() if v.info else None,
                        "stats": v.stats.to_dict() if v.stats else None,
                        "indexed_blocks": self.index.replica_blocks(v.replica_id),
                    }
                    for v in views
                ]
                for name, views in self._pool_views().items()
            },
        }

    async def __del__(self) -> None:
        for task in getattr(self, "_background", []):
            task.cancel()
        if getattr(self, "streams", None) is not None:
            self.streams.close()
