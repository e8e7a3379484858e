"""The ingress: the OpenAI API over the pools, with the scheduler in-process."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.kv_event_subscriber import KVEventSubscriber
from deployments.pool_client import ServePoolClient
from orchestrator.api.admission import AdmissionGate
from orchestrator.api.app import AppHooks, Health, build_openai_app
from orchestrator.api.service import CompletionService, ModelCard
from orchestrator.config import AppConfig
from orchestrator.engines import publishes_kv_events
from orchestrator.kv.index import KVIndex
from orchestrator.kv.ingest import KVEventIngest
from orchestrator.metrics import FrontendMetrics
from orchestrator.prompts import PromptRenderer, load_tokenizer
from orchestrator.request_path import RequestPath
from orchestrator.routing import make_scheduler
from orchestrator.routing.report import SchedulerCollector

log = logging.getLogger("ray.serve")


@serve.deployment
@serve.ingress()
class Frontend:
    async def __init__(
        self,
        config: dict[str, Any],
        decode_pool: DeploymentHandle,
        prefill_pool: DeploymentHandle | None = None,
    ) -> None:
        app = AppConfig.model_validate(config)
        self.config = app
        self.pools = {"decode_pool": ServePoolClient(decode_pool)}
        if prefill_pool is not None:
            self.pools["prefill_pool"] = ServePoolClient(prefill_pool)
        tokenizer = await asyncio.to_thread(load_tokenizer, app.model.tokenizer_source)
        self.metrics = FrontendMetrics(pools=self._pool_views)
        # Each frontend replica keeps its own index, fed by the same event streams.
        self.index = KVIndex()
        self.scheduler = make_scheduler(app.routing, app.kv_cache.block_size, self.index)
        self.metrics.add_collector(SchedulerCollector(self.index, getattr(self.scheduler, "load", None), self._pool_views))
        self.kv_events = KVEventSubscriber(
            list(self.pools.values()), KVEventIngest(self.index), self.metrics, subscribe=publishes_kv_events(app)
        )
        path = RequestPath(
            decode_pool=self.pools["decode_pool"],
            prefill_pool=self.pools.get("prefill_pool"),
            scheduler=self.scheduler,
            metrics=self.metrics,
            prefill_timeout_s=app.frontend.prefill_timeout_s,
            max_migrations=app.frontend.max_migrations,
            detokenize=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
        )
        card = ModelCard(name=app.model.name, max_model_len=app.model.max_model_len, created=int(time.time()))
        self.service = CompletionService(card, PromptRenderer(tokenizer), path, self.metrics, limits=app.frontend.limits,
                                         gate=AdmissionGate(app.frontend.max_in_flight),
                                         retry_after_s=app.frontend.retry_after_s)
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

    async def _health(self) -> Health:
        counts = {name: len(views) for name, views in self._pool_views().items()}
        return Health(ready=all(counts.values()), detail={"mode": self.config.mode.value, "replicas": counts})

    def _pools_report(self) -> dict[str, Any]:
        return {
            "mode": self.config.mode.value,
            "routing": self.config.routing.policy.value,
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
