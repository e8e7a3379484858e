"""Per-request work on the routing path is done once: a disaggregated request reads each pool's replicas once,
and its views are the ones its calls carry; its prompt is hashed and looked up in the KV index once, also when
the shape router has classified it first; the scheduler hears of its computed prompt once."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from orchestrator.config import PRIMARY_GROUP, RoutingConfig, ShapeRoutingConfig
from orchestrator.kv.index import KVIndex
from orchestrator.messages import EngineRequest, SamplingSpec
from orchestrator.metrics import FrontendMetrics
from orchestrator.pools import ReplicaView
from orchestrator.request_path import RequestPath, RequestTrace
from orchestrator.routing.kv_scheduler import KvAwareScheduler
from orchestrator.routing.shape import ShapeRouter
from tests.factories import FakePool

BS = 4


@dataclass
class _CountingPool(FakePool):
    reads: int = 0
    views: list[ReplicaView | None] = field(default_factory=list)

    def replicas(self) -> list[ReplicaView]:
        self.reads += 1
        return super().replicas()

    async def prefill(self, request, view=None):
        self.views.append(view)
        return await super().prefill(request, view)

    def generate(self, request, view=None):
        self.views.append(view)
        return super().generate(request, view)


class _CountingIndex(KVIndex):
    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    def overlaps(self, hashes):
        self.lookups += 1
        return super().overlaps(hashes)


class _CountingScheduler(KvAwareScheduler):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.prefilled: list[str] = []

    def on_prefill_done(self, request_id: str) -> None:
        self.prefilled.append(request_id)
        super().on_prefill_done(request_id)


def test_a_disaggregated_request_reads_its_pools_its_blocks_and_reports_its_prefill_once():
    index = _CountingIndex()
    routing = RoutingConfig(local_prefill_max_tokens=0)
    scheduler = _CountingScheduler(routing, BS, index)
    decode, prefill = _CountingPool("decode_pool", ("d0", "d1")), _CountingPool("prefill_pool", ("p0", "p1"))
    path = RequestPath(decode, prefill, scheduler, FrontendMetrics(), prefill_timeout_s=5)
    shape = ShapeRouter(ShapeRoutingConfig(prefix_group=PRIMARY_GROUP, min_prompt_tokens=1), BS, index)
    request = EngineRequest("r1", tuple(range(100, 140)), SamplingSpec(max_tokens=3))

    async def scenario() -> RequestTrace:
        decision = shape.route(request)  # the frontend's shape routing, then the group's path
        trace = RequestTrace()
        async for _ in path.stream(request, trace, blocks=decision.blocks):
            pass
        return trace

    trace = asyncio.run(scenario())
    assert trace.route is not None and trace.route.remote_prefill
    assert (decode.reads, prefill.reads) == (1, 1)
    assert index.lookups == 1  # the shape router's lookup served the scheduler too
    assert scheduler.prefilled == ["r1"]  # the remote prefill's return, not again at the first token
    assert [v.replica_id for v in prefill.views] == [trace.route.prefill_replica]
    assert [v.replica_id for v in decode.views] == [trace.route.decode_replica]
