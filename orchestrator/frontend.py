"""The frontend's parts, assembled in one place: the KV index and what feeds it,
one scheduler per pool group, the shape router, each group's request path,
the OpenAI service, and the reports `/health` and `/pools` serve.

    routing  = build_routing(config.routing, block size, group names)     (orchestrator/routing)
             = index <- ingest <- KV events;  a scheduler per group;  shape router
    frontend = build_frontend(config, groups of PoolClients, tokenizer)
             = routing + metrics + a RequestPath per group + CompletionService
               + the KV event subscriber following every pool's replicas
               + the Responses API's service over CompletionService, with its store

The Ray Serve deployment (deployments/frontend.py) and the standalone sim
server (tools/sim_server.py) call `build_frontend` with their own pool
transports; the cluster simulator (orchestrator/sim/cluster.py) calls
`build_routing` on a virtual clock. No part is built anywhere else.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.api.admission import AdmissionGate
from orchestrator.api.app import Health
from orchestrator.api.response_store import BoundedResponseStore, ResponseStore
from orchestrator.api.responses_service import ResponsesService
from orchestrator.api.service import CompletionService, ModelCard
from orchestrator.config import PRIMARY_GROUP, AppConfig, ResponsesConfig
from orchestrator.engines import publishes_kv_events, reasoning_parser, tool_call_parser
from orchestrator.kv.subscriber import KVEventSubscriber
from orchestrator.lora.adapter import LoraAdapter
from orchestrator.lora.catalog import AdapterCatalog, EngineCheck
from orchestrator.lora.probe import engine_probe
from orchestrator.lora.store import AdapterStore, MemoryAdapterStore
from orchestrator.metrics import FrontendMetrics
from orchestrator.pools import PoolClient, ReplicaView
from orchestrator.prompts import PromptRenderer, Tokenizer
from orchestrator.request_path import RequestPath
from orchestrator.routing import RoutingParts, build_routing
from orchestrator.routing.base import Scheduler
from orchestrator.routing.report import SchedulerCollector
from orchestrator.routing.shape import CombinedLoad
from orchestrator.tracing import NOOP_TRACER, Tracer
from orchestrator.traffic.policy import TrafficPolicy


@dataclass(frozen=True)
class PoolGroup:
    """One group's pools as the frontend reaches them; `prefill` None: the group serves aggregated."""

    decode: PoolClient
    prefill: PoolClient | None = None

    def clients(self) -> list[PoolClient]:
        return [c for c in (self.decode, self.prefill) if c is not None]


@dataclass(frozen=True)
class FrontendParts:
    config: AppConfig
    groups: Mapping[str, PoolGroup]
    routing: RoutingParts
    metrics: FrontendMetrics
    paths: Mapping[str, RequestPath]
    service: CompletionService
    kv_events: KVEventSubscriber
    catalog: AdapterCatalog | None = None  # the model's LoRA adapters (model.lora); the shell keeps it fresh
    responses: ResponsesService | None = None  # the Responses API over `service`, with its store

    def pools(self) -> dict[str, PoolClient]:
        """Every pool of every group, by name."""
        return {client.name: client for group in self.groups.values() for client in group.clients()}

    def pool_views(self) -> dict[str, list[ReplicaView]]:
        return {name: pool.replicas() for name, pool in self.pools().items()}

    def groups_report(self) -> dict[str, Any]:
        return {
            name: {
                "mode": "aggregated" if group.prefill is None else "disaggregated",
                "pools": [c.name for c in group.clients()],
            }
            for name, group in self.groups.items()
        }

    def health(self) -> Health:
        """Ready once every pool has a replica."""
        counts = {name: len(views) for name, views in self.pool_views().items()}
        detail: dict[str, Any] = {"mode": self.config.mode.value, "replicas": counts}
        if len(self.groups) > 1:
            detail["groups"] = self.groups_report()
        return Health(ready=all(counts.values()), detail=detail)

    def pools_report(self) -> dict[str, Any]:
        """What `/pools` shows: the routing set-up, the KV index, every replica with its stats."""
        shape = self.config.routing.shape
        index = self.routing.index
        return {
            "mode": self.config.mode.value,
            "routing": self.config.routing.policy.value,
            "groups": self.groups_report(),
            "shape_routing": shape.model_dump(mode="json") if shape is not None else None,
            "kv_index": {"blocks": index.num_blocks(), "following": self.kv_events.following()},
            "pools": {
                name: [
                    {
                        "replica_id": v.replica_id,
                        "info": v.info.to_dict() if v.info else None,
                        "stats": v.stats.to_dict() if v.stats else None,
                        "indexed_blocks": index.replica_blocks(v.replica_id),
                    }
                    for v in views
                ]
                for name, views in self.pool_views().items()
            },
        }


def build_frontend(
    config: AppConfig,
    groups: Mapping[str, PoolGroup],
    tokenizer: Tokenizer,
    created: int | None = None,
    wall_clock: Callable[[], float] = time.time,
    new_id: Callable[[], str] | None = None,
    tracer: Tracer = NOOP_TRACER,
    adapter_store: AdapterStore | None = None,
    adapter_check: EngineCheck | None = None,
    response_store: ResponseStore | None = None,
) -> FrontendParts:
    """The frontend over `groups` (the primary group first); `tokenizer` renders prompts and output text.
    With model.lora: `adapter_store` holds the adapters loaded at run time, shared by the app's frontends
    (by default this process's alone), and `adapter_check` has an engine load each before it is served (by
    default a replica of the primary group's decode pool, `engine_probe`). `response_store`: the Responses
    API's stored responses, shared by the app's frontends (by default this process's alone).
    `created` (the model card's), `wall_clock` (responses' `created`) and `new_id` (response ids) are
    injected for tests; by default the current time and random ids. `tracer`: the requests' spans
    (`orchestrator.tracing.tracer_from_config(config.tracing)`); by default tracing is off."""
    if PRIMARY_GROUP not in groups:
        raise ValueError(f"the frontend needs the {PRIMARY_GROUP!r} pool group; got {sorted(groups)}")
    routing = build_routing(
        config.routing,
        config.kv_cache.block_size,
        list(groups),
        lora=config.model.lora,
        classes=config.traffic.classes,
    )
    pools: dict[str, PoolClient] = {c.name: c for g in groups.values() for c in g.clients()}

    def pool_views() -> dict[str, list[ReplicaView]]:
        return {name: pool.replicas() for name, pool in pools.items()}

    metrics = FrontendMetrics(pools=pool_views)
    loads = [s.load for s in routing.schedulers.values() if getattr(s, "load", None) is not None]
    metrics.add_collector(SchedulerCollector(routing.index, CombinedLoad(loads) if loads else None, pool_views))
    paths = {
        name: _request_path(config, group, routing.schedulers[name], metrics, tokenizer)
        for name, group in groups.items()
    }
    model = config.model
    card = ModelCard(
        name=model.name, max_model_len=model.max_model_len, created=int(time.time()) if created is None else created
    )
    check = adapter_check or engine_probe(groups[PRIMARY_GROUP].decode)
    catalog = _catalog(config, adapter_store, check)
    frontend = config.frontend
    service = CompletionService(
        card,
        PromptRenderer(tokenizer),
        paths[PRIMARY_GROUP],
        metrics,
        limits=frontend.limits,
        gate=AdmissionGate(frontend.max_in_flight),
        retry_after_s=frontend.retry_after_s,
        group_paths=paths,
        shape_router=routing.shape_router,
        tool_parser=tool_call_parser(config, tokenizer),
        reasoning_parser=reasoning_parser(config, tokenizer),
        wall_clock=wall_clock,
        tracer=tracer,
        catalog=catalog,
        policy=TrafficPolicy(config.traffic, frontend.max_in_flight),
        **({"new_id": new_id} if new_id is not None else {}),
    )
    kv_events = KVEventSubscriber(list(pools.values()), routing.ingest, metrics, subscribe=publishes_kv_events(config))
    responses = ResponsesService(
        service,
        _response_store(frontend.responses, response_store),
        wall_clock=wall_clock,
        **({"new_id": new_id} if new_id is not None else {}),
    )
    return FrontendParts(config, dict(groups), routing, metrics, paths, service, kv_events, catalog, responses)


def _response_store(config: ResponsesConfig, shared: ResponseStore | None) -> ResponseStore | None:
    """The app's shared store where the shell has one, else one in this process; None with the store off."""
    if not config.store:
        return None
    return shared or BoundedResponseStore(config.max_stored, config.max_stored_bytes)


def _catalog(config: AppConfig, store: AdapterStore | None, check: EngineCheck | None) -> AdapterCatalog | None:
    lora = config.model.lora
    if lora is None:
        return None
    configured = [LoraAdapter(a.name, a.resolved_source) for a in lora.adapters]
    return AdapterCatalog(config.model.name, configured, store or MemoryAdapterStore(), lora.max_lora_rank, check)


def _request_path(
    config: AppConfig, group: PoolGroup, scheduler: Scheduler, metrics: FrontendMetrics, tokenizer: Tokenizer
) -> RequestPath:
    return RequestPath(
        decode_pool=group.decode,
        prefill_pool=group.prefill,
        scheduler=scheduler,
        metrics=metrics,
        prefill_timeout_s=config.frontend.prefill_timeout_s,
        max_migrations=config.frontend.max_migrations,
        migration_wait_s=config.frontend.migration_wait_s,
        detokenize=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
    )
