"""The ingress: the OpenAI API over the pools, with the scheduler in-process."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from deployments.pool_client import ServePoolClient
from orchestrator.api.app import AppHooks, Health, build_openai_app
from orchestrator.api.service import CompletionService, ModelCard
from orchestrator.config import AppConfig
from orchestrator.metrics import FrontendMetrics
from orchestrator.prompts import PromptRenderer, load_tokenizer
from orchestrator.request_path import RequestPath
from orchestrator.routing.round_robin import RoundRobinScheduler

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
        path = RequestPath(
            decode_pool=self.pools["decode_pool"],
            prefill_pool=self.pools.get("prefill_pool"),
            scheduler=RoundRobinScheduler(),
            metrics=self.metrics,
            prefill_timeout_s=app.frontend.prefill_timeout_s,
        )
        card = ModelCard(name=app.model.name, max_model_len=app.model.max_model_len, created=int(time.time()))
        self.service = CompletionService(card, PromptRenderer(tokenizer), path, self.metrics)
        # Handles build their routers on first use; until then a pool shows no replicas.
        self._connecting = [asyncio.create_task(pool.connect()) for pool in self.pools.values()]

    def __serve_build_asgi_app__(self):
        return build_openai_app(self.service, AppHooks(health=self._health, pools=self._pools_report))

    def _pool_views(self):
        return {name: pool.replicas() for name, pool in self.pools.items()}

    async def _health(self) -> Health:
        counts = {name: len(views) for name, views in self._pool_views().items()}
        return Health(ready=all(counts.values()), detail={"mode": self.config.mode.value, "replicas": counts})

    def _pools_report(self) -> dict[str, Any]:
        return {
            "mode": self.config.mode.value,
            "pools": {
                name: [
                    {
                        "replica_id": v.replica_id,
                        "info": v.info.to_dict() if v.info else None,
                        "stats": v.stats.to_dict() if v.stats else None,
                    }
                    for v in views
                ]
                for name, views in self._pool_views().items()
            },
        }
