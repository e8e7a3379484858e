"""A pool replica: one inference engine in one prefill, decode or aggregated role."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import ray
from ray import serve

from deployments.process_priority import set_niceness
from orchestrator.config import AppConfig, DataPlane, PlannerMode
from orchestrator.engines import create_engine
from orchestrator.engines.base import EngineRole, EngineStats
from orchestrator.engines.ports import listen_port
from orchestrator.messages import EngineChunk, EngineRequest, PrefillResult
from orchestrator.planner.levels import priority_levels
from orchestrator.planner.observer import ReplicaLoadWindow
from orchestrator.wire.server import StreamServer

log = logging.getLogger("ray.serve")

# A replica being scaled down stops getting requests and has this long
# (Serve's graceful_shutdown_timeout_s) to finish its streams.
DRAIN_TIMEOUT_S = 300.0


@serve.deployment
class EngineReplica:
    """Serves `generate`/`prefill` both as Serve handle methods and, with
    `frontend.data_plane: direct`, over its own data-plane port (published in
    its EngineInfo as `stream_port`), through the same methods."""

    async def __init__(self, config: dict[str, Any], role: str, *, wire_secret: str) -> None:
        """`wire_secret`: the application's data-plane secret (hex), which peers must prove."""
        app = AppConfig.model_validate(config)
        # Before the engine's processes are spawned: they inherit it.
        self.niceness = set_niceness(app.serving_niceness)
        self.role = EngineRole(role)
        pool = app.prefill_pool if self.role is EngineRole.PREFILL else app.decode_pool
        assert pool is not None
        host = app.network.advertise_host or ray.util.get_node_ip_address()
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.engine = create_engine(app, pool, self.role, host)
        # What the SLA planner observes of this replica; None (nothing recorded) with the planner off.
        self.window = (
            ReplicaLoadWindow(
                app.planner.interval_s,
                peak_window_s=app.planner.peak_window_s,
                levels=[level.priority for level in priority_levels(app.traffic.classes)],
            )
            if app.planner.mode is not PlannerMode.OFF
            else None
        )
        self.info = await self.engine.start()
        self.streams: StreamServer | None = None
        if app.frontend.data_plane is DataPlane.DIRECT:
            self.streams = StreamServer(self, bytes.fromhex(wire_secret))
            port = await self.streams.start(host, listen_port(host))
            self.info = dataclasses.replace(self.info, stream_port=port)
        log.info("%s replica %s ready at nice %d: %s", self.role.value, self.replica_id, self.niceness, self.info)

    # -- requests -------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        if self.window is None:
            async for chunk in self.engine.generate(request):
                yield chunk
            return
        window, start = self.window, time.monotonic()
        # Queued in this replica until its first token, or until the stream
        # ends any other way (error, client gone: the finally).
        asked, priority = request.sampling.max_tokens, request.priority
        key = window.arrived(len(request.prompt_token_ids), asked, priority)
        first, last, outputs, cached = None, start, 0, 0
        try:
            async for chunk in self.engine.generate(request):
                n = len(chunk.token_ids)
                if n:
                    now = time.monotonic()
                    if first is None:
                        first = now - start
                        window.prompt_done(key)
                        # Prompts prefilled elsewhere count their cache hits there.
                        cached = chunk.num_cached_tokens if request.kv_transfer is None else 0
                    else:
                        window.token_gap((now - last) / n, priority)
                    last, outputs = now, outputs + n
                yield chunk
            window.finished(outputs, cached, first, asked, priority)
        finally:
            window.closed(key)

    async def prefill(self, request: EngineRequest) -> PrefillResult:
        if self.window is None:
            return dataclasses.replace(await self.engine.prefill(request), replica_id=self.replica_id)
        window, start = self.window, time.monotonic()
        key = window.arrived(len(request.prompt_token_ids), priority=request.priority)  # queued until it returns
        try:
            result = await self.engine.prefill(request)
        finally:
            window.closed(key)
        window.finished(0, result.num_cached_tokens, time.monotonic() - start, priority=request.priority)
        return dataclasses.replace(result, replica_id=self.replica_id)

    # -- reports --------------------------------------------------------------

    def engine_info(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, **self.info.to_dict()}

    def _stats(self) -> EngineStats:
        """The engine's stats, with the data-plane connections and streams this replica closed."""
        stats = self.engine.stats()
        if self.streams is None:
            return stats
        return dataclasses.replace(
            stats,
            data_plane_refused_total=sum(self.streams.refused.values()),
            data_plane_stalled_streams_total=self.streams.stalled_streams,
        )

    def stats(self) -> dict[str, Any]:
        return {"replica_id": self.replica_id, **self._stats().to_dict()}

    def record_replica_metadata(self) -> dict[str, Any]:
        """Published once to every router of this pool (Serve replica metadata)."""
        return self.info.to_dict()

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Custom autoscaling metrics: what the SLA planner observes of this
        replica (`ReplicaLoadWindow.snapshot`: windowed rates and latencies,
        the prompt tokens queued now, prompt tokens per peak bucket)."""
        return {} if self.window is None else self.window.snapshot(waiting=self.engine.stats().num_waiting)

    def record_routing_stats(self) -> dict[str, Any]:
        """Polled by Serve every `request_routing_stats_period_s` and pushed to routers."""
        return self._stats().to_dict()

    async def check_health(self) -> None:
        await self.engine.check_health()

    async def __del__(self) -> None:
        """Serve has stopped routing here and drained its own calls; the direct
        streams finish too (new ones are refused, the frontend routes them
        elsewhere) before the engine stops."""
        streams = getattr(self, "streams", None)
        if streams is not None:
            # Within Serve's budget, which its own drain has already used from.
            left = await streams.drain(0.9 * DRAIN_TIMEOUT_S)
            if left:
                log.warning("%d streams still running at the end of the drain", left)
            streams.close()
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()
