"""The cluster simulator: the project's real scheduler (KV index fed by KV
events, cost function, conditional disaggregation) in front of N simulated
replicas, on a virtual clock. Discrete events, one loop:

    arrival      route_request(views) -> remote prefill on P, or prefill on D
    step start   core.step() on a replica with work; its duration from the perf model
    step end     its tokens reach their requests, its KV events reach the index
                 (after `kv_event_delay_s`), the replica steps again if it has work
    prefill done the prompt's KV leaves P for D over the link; D's request waits
                 for it; P frees its blocks when the transfer is over

Pools can be resized while it runs (`resize`), as an autoscaler would: a new
replica serves only after `startup_s` (model load), a removed one stops
getting requests and leaves once its requests are done (drain: no request
is aborted), and its blocks leave the index. GPU time counts every replica
from the moment it is asked for until it is gone. `every(interval_s, fn)`
calls a controller at the end of each interval. With `server_overhead`, a
request pays the server's cost (its HTTP, parsing, streaming) between the
client's send and the scheduler.

Nothing here sleeps or does I/O: an hour of trace runs in seconds of CPU.
Deterministic for a given seed (the scheduler's sampling draws from it).
"""

from __future__ import annotations

import enum
import heapq
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from orchestrator.config import PRIMARY_GROUP, LoraConfig, RoutingConfig, SloClassConfig
from orchestrator.engines.base import EngineInfo, EngineRole, EngineStats
from orchestrator.kv.events import KVEventBatch
from orchestrator.lora.adapter import LoraAdapter
from orchestrator.messages import EngineRequest, SamplingSpec
from orchestrator.planner.observation import observe_pools
from orchestrator.planner.observer import ReplicaLoadWindow, ReplicaReport
from orchestrator.planner.planner import Observation
from orchestrator.pools import ReplicaView
from orchestrator.routing import build_routing
from orchestrator.routing.base import RouteDecision
from orchestrator.sim.core import Emitted, SimCore, SimRequest, StepResult
from orchestrator.sim.link import LinkSpec
from orchestrator.sim.lora_slots import lora_spec
from orchestrator.sim.perf_model import PerfModel


class Arrival(Protocol):
    prompt_token_ids: Sequence[int]
    max_tokens: int
    arrival_s: float | None
    # Optional: `lora`, the name of the LoRA adapter the request names (None or absent: the base model);
    # `priority`, its SLO class's engine priority (absent: 0).


@dataclass(frozen=True)
class ClusterSpec:
    prefill_replicas: int  # 0: aggregated serving
    decode_replicas: int
    num_blocks: int  # KV capacity of each replica
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    routing: RoutingConfig = RoutingConfig()
    kv_event_delay_s: float = 0.002  # engine -> ZMQ -> frontend index
    # A server in front: a request reaches the scheduler `perf.request_overhead(busy)` after the
    # client sends it (busy: another request is in flight), and its client clock starts at the send.
    server_overhead: bool = False
    # Each replica keeps the load window a Serve replica keeps for the SLA planner (None: none), and reports
    # it as a Serve replica does (`observation`): the planner sees the simulator through the same code.
    report_span_s: float | None = None
    report_priorities: tuple[int, ...] = ()  # the windows report these priorities' load apart (SLO classes)
    classes: tuple[SloClassConfig, ...] = ()  # the SLO classes the scheduler routes by (their queue budgets)
    peak_window_s: float = 2.0
    # LoRA adapters: each replica's slots and host cache (the engines'), which the scheduler weighs too.
    lora: LoraConfig | None = None
    lora_load_s: float = 0.05


@dataclass
class RequestOutcome:
    """One request as a client would have timed it, in virtual seconds."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    max_tokens: int
    token_times: list[float] = field(default_factory=list)
    cached_tokens: int = 0
    route: RouteDecision | None = None
    priority: int = 0

    @property
    def finished(self) -> bool:
        return len(self.token_times) >= self.max_tokens

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] - self.arrival_s if self.token_times else None

    @property
    def itl_s(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def e2e_s(self) -> float | None:
        return self.token_times[-1] - self.arrival_s if self.finished else None


class ReplicaState(enum.Enum):
    STARTING = "starting"  # asked for, loading its model: costs GPU time, serves nothing
    READY = "ready"
    DRAINING = "draining"  # removed: finishes what it has, gets nothing new


@dataclass
class _Timing:
    """One request at one replica, as a Serve replica times it for its load window."""

    key: int
    start: float
    local_prefill: bool
    max_tokens: int  # asked for (0: a prefill)
    priority: int = 0
    first: float | None = None
    last: float = 0.0
    outputs: int = 0
    cached: int = 0


class _Replica:
    def __init__(
        self,
        replica_id: str,
        role: EngineRole,
        core: SimCore,
        block_size: int,
        state: ReplicaState = ReplicaState.READY,
        window: ReplicaLoadWindow | None = None,
    ) -> None:
        self.replica_id = replica_id
        self.window = window
        self.role = role
        self.core = core
        self.state = state
        self.inflight = 0  # requests routed here and not yet done with it (a draining replica waits for 0)
        self.stepping = False
        self.event_seq = 0
        self.info = EngineInfo(
            role=role,
            engine_kind="sim",
            engine_version="cluster",
            engine_id=replica_id,
            model="sim",
            block_size=block_size,
            max_model_len=1 << 20,
            host="sim",
            kv_capacity_blocks=core.blocks.num_blocks,
        )

    def view(self) -> ReplicaView:
        core = self.core
        stats = EngineStats(
            num_running=core.num_running, num_waiting=core.num_waiting, kv_cache_usage=core.blocks.usage
        )
        return ReplicaView(self.replica_id, self.info, stats)


class ClusterSim:
    def __init__(
        self, spec: ClusterSpec, perf: PerfModel, link: LinkSpec, seed: int = 0, vocab_size: int = 32000
    ) -> None:
        self.spec = spec
        self.perf = perf
        self.link = link
        self.now = 0.0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        routing = build_routing(
            spec.routing,
            spec.block_size,
            clock=lambda: self.now,
            rng=random.Random(seed),
            lora=spec.lora,
            classes=spec.classes,
        )
        self.index, self.ingest = routing.index, routing.ingest
        self.scheduler = routing.schedulers[PRIMARY_GROUP]

        self.vocab_size = vocab_size
        self.disaggregated = spec.prefill_replicas > 0
        self._names = itertools.count()
        self.replicas: dict[str, _Replica] = {}
        self.prefill: list[_Replica] = []  # live replicas of each pool (any state), oldest first
        self.decode: list[_Replica] = []
        for _ in range(spec.prefill_replicas):
            self._add("prefill", ReplicaState.READY)
        for _ in range(spec.decode_replicas):
            self._add("decode", ReplicaState.READY)
        self.gpu_seconds = 0.0
        self._gpu_clock = 0.0
        self.outcomes: dict[str, RequestOutcome] = {}
        self._prefill_of: dict[str, tuple[str, EngineRequest, RouteDecision]] = {}  # prefill id -> original
        self._on_finished: Callable[[], None] = lambda: None
        self._in_server = 0  # sent and not finished
        self._timings: dict[str, _Timing] = {}  # request or prefill id -> its timing at its replica

    # -- the loop ------------------------------------------------------------------

    def run(self, arrivals: Sequence[Arrival], until_s: float | None = None) -> list[RequestOutcome]:
        """Open loop: each request arrives at its `arrival_s`."""
        for i, a in enumerate(arrivals):
            self._at(a.arrival_s or 0.0, lambda i=i, a=a: self._send(f"r{i}", a))
        return self._loop(until_s)

    def run_closed(self, requests: Sequence[Arrival], concurrency: int) -> list[RequestOutcome]:
        """Closed loop: `concurrency` clients, each sending its next request
        when its previous one finishes (arrival times are ignored)."""
        pending = iter(enumerate(requests))

        def send_next() -> None:
            item = next(pending, None)
            if item is not None:
                self._send(f"r{item[0]}", item[1])

        self._on_finished = send_next
        for _ in range(concurrency):
            self._at(0.0, send_next)
        return self._loop(None)

    def _loop(self, until_s: float | None) -> list[RequestOutcome]:
        while self._events:
            t, _, action = heapq.heappop(self._events)
            if until_s is not None and t > until_s:
                break
            self.now = t
            action()
        self._charge_gpus()
        return list(self.outcomes.values())

    def _at(self, t: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t, next(self._order), action))

    # -- requests ------------------------------------------------------------------

    def _send(self, request_id: str, a: Arrival) -> None:
        busy = self._in_server > 0
        self._in_server += 1
        if not self.spec.server_overhead:
            self._arrive(request_id, a, self.now)
            return
        sent_at = self.now
        self._at(self.now + self.perf.request_overhead(server_busy=busy), lambda: self._arrive(request_id, a, sent_at))

    def _arrive(self, request_id: str, a: Arrival, sent_at: float) -> None:
        adapter = getattr(a, "lora", None)
        lora = LoraAdapter(adapter, f"/sim/{adapter}") if adapter is not None else None
        priority = getattr(a, "priority", 0)
        request = EngineRequest(
            request_id, tuple(a.prompt_token_ids), SamplingSpec(max_tokens=a.max_tokens), lora=lora, priority=priority
        )
        ready = ReplicaState.READY
        prefill_views = [r.view() for r in self.prefill if r.state is ready] if self.disaggregated else None
        route = self.scheduler.route_request(
            request, prefill_views, [r.view() for r in self.decode if r.state is ready]
        )
        self.outcomes[request_id] = RequestOutcome(
            request_id, sent_at, len(request.prompt_token_ids), a.max_tokens, route=route, priority=priority
        )
        self.replicas[route.decode_replica].inflight += 1
        if route.remote_prefill:
            self.replicas[route.prefill_replica].inflight += 1
            prefill_id = f"{request_id}-prefill"
            self._prefill_of[prefill_id] = (request_id, request, route)
            self._arrived_at(route.prefill_replica, prefill_id, len(request.prompt_token_ids), False, 0, priority)
            self._submit(
                route.prefill_replica,
                SimRequest(
                    prefill_id,
                    list(request.prompt_token_ids),
                    1,
                    hold_for_transfer=True,
                    lora_name=adapter,
                    priority=priority,
                ),
            )
        else:
            self._arrived_at(
                route.decode_replica, request_id, len(request.prompt_token_ids), True, a.max_tokens, priority
            )
            self._submit(
                route.decode_replica,
                SimRequest(
                    request_id, list(request.prompt_token_ids), a.max_tokens, lora_name=adapter, priority=priority
                ),
            )

    # -- what each replica reports to the planner (as deployments/engine_replica.py records it) ------------------

    def _arrived_at(
        self,
        replica_id: str,
        request_id: str,
        prompt_tokens: int,
        local_prefill: bool,
        max_tokens: int,
        priority: int = 0,
    ) -> None:
        window = self.replicas[replica_id].window
        if window is not None:
            key = window.arrived(prompt_tokens, max_tokens, priority)
            self._timings[request_id] = _Timing(key, self.now, local_prefill, max_tokens, priority)

    def _prefilled_at(self, replica: _Replica, prefill_id: str, cached_tokens: int) -> None:
        timing = self._timings.pop(prefill_id, None)
        if timing is not None:
            replica.window.closed(timing.key)
            replica.window.finished(0, cached_tokens, self.now - timing.start, priority=timing.priority)

    def _token_at(self, replica: _Replica, emitted: Emitted, finished: bool) -> None:
        timing = self._timings.get(emitted.request_id)
        if timing is None:
            return
        window = replica.window
        if timing.first is None:
            timing.first = self.now - timing.start
            window.prompt_done(timing.key)
            timing.cached = emitted.cached_tokens if timing.local_prefill else 0  # else counted at the prefill
        else:
            window.token_gap(self.now - timing.last, timing.priority)
        timing.last = self.now
        timing.outputs += 1
        if finished:
            window.finished(timing.outputs, timing.cached, timing.first, timing.max_tokens, timing.priority)
            window.closed(timing.key)
            del self._timings[emitted.request_id]

    def reports(self, name: str) -> list[ReplicaReport]:
        """The latest report of each serving replica of the pool, as Serve's controller receives them."""
        return [
            r.window.report(waiting=r.core.num_waiting)
            for r in self.pool(name)
            if r.state is ReplicaState.READY and r.window is not None
        ]

    def observation(self, interval_s: float) -> Observation:
        """The interval that just ended, as the Serve policy builds it (orchestrator/planner/observation.py)."""
        prefill = self.reports("prefill") if self.disaggregated else None
        return observe_pools(
            interval_s,
            prefill,
            self.reports("decode"),
            self.count("prefill", ReplicaState.READY),
            self.count("decode", ReplicaState.READY),
            self.count("prefill", ReplicaState.STARTING, ReplicaState.READY) if self.disaggregated else None,
            self.count("decode", ReplicaState.STARTING, ReplicaState.READY),
        )

    def _submit(self, replica_id: str, request: SimRequest) -> None:
        replica = self.replicas[replica_id]
        replica.core.add(request)
        self._kick(replica)

    def _prefill_done(self, prefill_id: str, prefill_replica: _Replica, cached_tokens: int) -> None:
        """The prompt's KV goes to the decode replica; the prefill replica
        holds its blocks until the transfer is over."""
        request_id, request, route = self._prefill_of.pop(prefill_id)
        self.scheduler.on_prefill_done(request_id)
        prefill_replica.inflight -= 1
        self._prefilled_at(prefill_replica, prefill_id, cached_tokens)
        self._arrived_at(
            route.decode_replica,
            request_id,
            len(request.prompt_token_ids),
            False,
            request.sampling.max_tokens,
            request.priority,
        )
        transfer_s = self.link.transfer_time(len(request.prompt_token_ids) * self.perf.kv_bytes_per_token)
        self.outcomes[request_id].cached_tokens = cached_tokens
        self._submit(
            route.decode_replica,
            SimRequest(
                request_id,
                list(request.prompt_token_ids),
                request.sampling.max_tokens,
                transfer_done_at=self.now + transfer_s,
                lora_name=request.lora.name if request.lora is not None else None,
                priority=request.priority,
            ),
        )

        def release() -> None:
            prefill_replica.core.release(prefill_id)
            self._kick(prefill_replica)

        self._at(self.now + transfer_s, release)

    def _token(self, replica: _Replica, emitted: Emitted) -> None:
        request_id = emitted.request_id
        if request_id in self._prefill_of:
            self._prefill_done(request_id, replica, emitted.cached_tokens)
            return
        outcome = self.outcomes[request_id]
        outcome.token_times.append(self.now)
        if replica.window is not None:
            self._token_at(replica, emitted, len(outcome.token_times) >= outcome.max_tokens)
        if emitted.first:
            self.scheduler.on_prefill_done(request_id)
            if not outcome.route.remote_prefill:
                outcome.cached_tokens = emitted.cached_tokens
        if outcome.finished:
            self.scheduler.on_request_finished(request_id)
            replica.inflight -= 1
            self._in_server -= 1
            self._on_finished()

    # -- replicas ------------------------------------------------------------------

    def _kick(self, replica: _Replica) -> None:
        if not replica.stepping and replica.core.has_work():
            replica.stepping = True
            self._at(self.now, lambda: self._step(replica))
        elif replica.state is ReplicaState.DRAINING and not replica.inflight and not replica.core.held:
            self._remove(replica)

    # -- pool sizes -----------------------------------------------------------------

    def every(self, interval_s: float, controller: Callable[[ClusterSim], None], until_s: float) -> None:
        """Call `controller(self)` at each interval's end, up to `until_s`."""

        def tick() -> None:
            controller(self)
            if self.now + interval_s <= until_s:
                self._at(self.now + interval_s, tick)

        self._at(interval_s, tick)

    def pool(self, name: str) -> list[_Replica]:
        return self.prefill if name == "prefill" else self.decode

    def count(self, name: str, *states: ReplicaState) -> int:
        return sum(1 for r in self.pool(name) if r.state in (states or tuple(ReplicaState)))

    def resize(self, name: str, replicas: int, startup_s: float) -> None:
        """Ask for `replicas` in the pool (starting ones count): newest starting
        ones are cancelled first, then the least loaded ready ones drain."""
        self._charge_gpus()
        wanted = replicas - self.count(name, ReplicaState.STARTING, ReplicaState.READY)
        for _ in range(wanted):
            replica = self._add(name, ReplicaState.STARTING)
            self._at(self.now + startup_s, lambda r=replica: self._ready(r))
        for _ in range(-wanted):
            starting = [r for r in self.pool(name) if r.state is ReplicaState.STARTING]
            if starting:
                self._remove(starting[-1])
                continue
            ready = [r for r in self.pool(name) if r.state is ReplicaState.READY]
            if len(ready) <= 1:
                break  # a pool keeps one replica serving
            victim = min(ready, key=lambda r: r.core.num_running + r.core.num_waiting)
            victim.state = ReplicaState.DRAINING
            self.index.remove_replica(victim.replica_id)  # no new request goes there by its cache
            self._kick(victim)

    def _add(self, name: str, state: ReplicaState) -> _Replica:
        spec = self.spec
        role = (
            EngineRole.PREFILL
            if name == "prefill"
            else (EngineRole.DECODE if self.disaggregated else EngineRole.AGGREGATED)
        )
        core = SimCore(
            self.perf,
            spec.num_blocks,
            spec.block_size,
            spec.max_num_seqs,
            spec.max_num_batched_tokens,
            vocab_size=self.vocab_size,
            lora=lora_spec(spec.lora, spec.lora_load_s),
        )
        window = None
        if spec.report_span_s is not None:
            window = ReplicaLoadWindow(
                spec.report_span_s,
                clock=lambda: self.now,
                peak_window_s=spec.peak_window_s,
                levels=spec.report_priorities,
            )
        replica = _Replica(f"{name[0]}{next(self._names)}", role, core, spec.block_size, state, window)
        self.replicas[replica.replica_id] = replica
        self.pool(name).append(replica)
        if state is ReplicaState.READY:
            self.index.add_replica(replica.replica_id)
        return replica

    def _ready(self, replica: _Replica) -> None:
        if replica.state is ReplicaState.STARTING:
            replica.state = ReplicaState.READY
            self.index.add_replica(replica.replica_id)

    def _remove(self, replica: _Replica) -> None:
        self._charge_gpus()
        pool = self.pool("prefill" if replica.role is EngineRole.PREFILL else "decode")
        pool.remove(replica)
        self.replicas.pop(replica.replica_id, None)
        if replica.replica_id in self.index.replicas:
            self.index.remove_replica(replica.replica_id)
        self.ingest.forget(replica.replica_id)

    def _charge_gpus(self) -> None:
        """GPU time up to now of every replica alive (starting, ready, draining)."""
        self.gpu_seconds += (self.now - self._gpu_clock) * len(self.replicas)
        self._gpu_clock = self.now

    def _step(self, replica: _Replica) -> None:
        """Step the replica; while nothing else in the cluster happens before a
        step ends, end it right here and go on (same order as going through
        the event queue, without the trip: a lightly loaded replica takes a
        step per token, and this is most of the simulator's time)."""
        core = replica.core
        while True:
            core.now = self.now
            result = core.step()
            self._publish(replica, result)
            if result.duration_s == 0.0:  # nothing runnable: KV in transit, or no free blocks
                replica.stepping = False
                landing = core.next_transfer_at()
                if landing is not None and landing > self.now:
                    replica.stepping = True
                    self._at(landing, lambda: self._step(replica))
                return
            if self._events and self._events[0][0] <= core.now:
                self._at(core.now, lambda result=result: self._resume_after(replica, result))
                return
            self.now = core.now
            if not self._deliver_step(replica, result):
                return

    def _resume_after(self, replica: _Replica, result: StepResult) -> None:
        """The queued end of a step: deliver its tokens, then step again if there is work."""
        if self._deliver_step(replica, result):
            self._step(replica)

    def _deliver_step(self, replica: _Replica, result: StepResult) -> bool:
        """The step's tokens reach their requests; True if the replica steps on."""
        for emitted in result.emitted:
            self._token(replica, emitted)
        if replica.core.has_work():
            return True
        replica.stepping = False
        self._kick(replica)
        return False

    def _publish(self, replica: _Replica, result: StepResult) -> None:
        if not result.events:
            return
        batch = KVEventBatch(replica.event_seq, self.now, tuple(result.events))
        replica.event_seq += 1

        def deliver() -> None:
            if replica.state is ReplicaState.READY:  # a draining replica is out of the index
                self.ingest.on_batch(replica.replica_id, batch)

        self._at(self.now + self.spec.kv_event_delay_s, deliver)
