"""Prometheus metrics of one frontend replica, in its own registry.

Request-level series (TTFT, ITL, E2E, outcomes, tokens, routing decisions,
prefill fallbacks) are observed by the frontend. Engine-level series (load,
prompt tokens by source, KV transfers) are read at scrape time from the
pools' latest replica reports.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from orchestrator.pools import DirectPathFallback, ReplicaView

PREFIX = "orchestrator"
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 60)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.2, 0.5, 1, 2, 5)
HOP_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120, 300)

# (stats field, metric suffix, help)
_ENGINE_COUNTERS = (
    ("prompt_tokens_computed_total", "engine_prompt_tokens_computed", "Prompt tokens the engine computed."),
    (
        "prompt_tokens_local_cache_total",
        "engine_prompt_tokens_cached",
        "Prompt tokens served from the local prefix cache.",
    ),
    (
        "prompt_tokens_transferred_total",
        "engine_prompt_tokens_transferred",
        "Prompt tokens whose KV arrived by transfer.",
    ),
    ("generation_tokens_total", "engine_generation_tokens", "Tokens the engine generated."),
    (
        "decode_seconds_total",
        "engine_decode_seconds",
        "Engine-side decode time of finished requests (first to last output token).",
    ),
    ("decode_tokens_total", "engine_decode_tokens", "Output tokens after each finished request's first."),
    ("kv_transfers_total", "kv_transfers", "Completed KV transfers into this replica."),
    ("kv_transfer_failures_total", "kv_transfer_failures", "Failed KV transfers or handshakes."),
    ("kv_transfer_bytes_total", "kv_transfer_bytes", "Bytes of KV read from prefill replicas."),
    ("kv_transfer_seconds_total", "kv_transfer_seconds", "Time spent in KV transfers."),
    (
        "data_plane_refused_total",
        "data_plane_refused_connections",
        "Data-plane connections the replica closed: wrong or missing proof, over its limits, protocol errors.",
    ),
    (
        "data_plane_stalled_streams_total",
        "data_plane_stalled_streams",
        "Data-plane streams the replica cut because their reader took no data for too long.",
    ),
)
_ENGINE_GAUGES = (
    ("num_running", "engine_running_requests", "Requests in the engine's running batch."),
    ("num_waiting", "engine_waiting_requests", "Requests queued in the engine."),
    ("kv_cache_usage", "engine_kv_cache_usage", "Fraction of the KV cache in use."),
)


class _PoolCollector:
    def __init__(self, pools: Callable[[], dict[str, list[ReplicaView]]]) -> None:
        self._pools = pools

    def collect(self) -> Iterable[Metric]:
        pools = self._pools()
        replicas = GaugeMetricFamily(f"{PREFIX}_pool_replicas", "Live replicas per pool.", labels=["pool"])
        for pool, views in pools.items():
            replicas.add_metric([pool], len(views))
        yield replicas
        for field, name, help_text in _ENGINE_COUNTERS:
            family = CounterMetricFamily(f"{PREFIX}_{name}", help_text, labels=["pool", "replica"])
            for pool, views in pools.items():
                for v in views:
                    if v.stats is not None:
                        family.add_metric([pool, v.replica_id], getattr(v.stats, field))
            yield family
        for field, name, help_text in _ENGINE_GAUGES:
            family = GaugeMetricFamily(f"{PREFIX}_{name}", help_text, labels=["pool", "replica"])
            for pool, views in pools.items():
                for v in views:
                    if v.stats is not None:
                        family.add_metric([pool, v.replica_id], getattr(v.stats, field))
            yield family


class FrontendMetrics:
    def __init__(self, pools: Callable[[], dict[str, list[ReplicaView]]] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds", "Time to first token.", registry=r, buckets=TTFT_BUCKETS
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds", "Time between streamed tokens.", registry=r, buckets=ITL_BUCKETS
        )
        self.e2e = Histogram(
            f"{PREFIX}_e2e_request_latency_seconds",
            "Request latency, arrival to last token.",
            registry=r,
            buckets=E2E_BUCKETS,
        )
        self.requests = Counter(
            f"{PREFIX}_requests", "Requests by endpoint and outcome.", ["endpoint", "outcome"], registry=r
        )
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens received.", registry=r)
        self.cached_prompt_tokens = Counter(
            f"{PREFIX}_cached_prompt_tokens",
            "Prompt tokens the decode engine did not compute (cache or transfer).",
            registry=r,
        )
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens", "Tokens generated.", registry=r)
        # SLO classes and tenants (traffic.classes / traffic.tenants): labelled by class and tenant.
        self.class_decisions = Counter(
            f"{PREFIX}_class_admissions",
            "Admission decisions by SLO class, tenant and decision (admitted, queued, dequeued, or the reason of "
            "a 429: tenant_in_flight, tenant_tokens, class_full, queue_deadline).",
            ["slo_class", "tenant", "decision"],
            registry=r,
        )
        self.class_queue_seconds = Histogram(
            f"{PREFIX}_class_queue_seconds",
            "Time a queued request waited for admission, by SLO class.",
            ["slo_class"],
            registry=r,
            buckets=E2E_BUCKETS,
        )
        self.class_streams = Gauge(
            f"{PREFIX}_class_streams", "Engine streams admitted, by SLO class.", ["slo_class"], registry=r
        )
        self.class_ttft = Histogram(
            f"{PREFIX}_class_time_to_first_token_seconds",
            "Time to first token by SLO class.",
            ["slo_class"],
            registry=r,
            buckets=TTFT_BUCKETS,
        )
        self.class_itl = Histogram(
            f"{PREFIX}_class_inter_token_latency_seconds",
            "Time between streamed tokens by SLO class.",
            ["slo_class"],
            registry=r,
            buckets=ITL_BUCKETS,
        )
        self.class_slo = Counter(
            f"{PREFIX}_class_slo_requests",
            "Finished requests of SLO classes with targets, by whether they met them (attained: TTFT within the "
            "class's ttft_p99_ms and the request's median gap between tokens within its itl_p50_ms).",
            ["slo_class", "tenant", "attained"],
            registry=r,
        )
        self.class_tokens = Counter(
            f"{PREFIX}_class_generation_tokens",
            "Tokens generated by SLO class and tenant.",
            ["slo_class", "tenant"],
            registry=r,
        )
        self.route_decisions = Counter(
            f"{PREFIX}_route_decisions", "Routing decisions by kind and reason.", ["kind", "reason"], registry=r
        )
        self.balance_guard_routes = Counter(
            f"{PREFIX}_balance_guard_routes",
            "Requests the balance guard (routing.balance_abs_threshold) sent to an idlest decode replica.",
            registry=r,
        )
        self.shape_decisions = Counter(
            f"{PREFIX}_shape_route_decisions",
            "Requests per pool group and measured shape class (routing.shape).",
            ["group", "shape"],
            registry=r,
        )
        self.shape_prefix_reuse = Histogram(
            f"{PREFIX}_shape_prefix_reuse_ratio",
            "Measured prefix reuse of routed requests: longest cached prefix over the prompt's blocks (routing.shape).",
            registry=r,
            buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 1.0),
        )
        self.decision_seconds = Histogram(
            f"{PREFIX}_scheduler_decision_seconds",
            "Time to choose a route.",
            registry=r,
            buckets=(1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2),
        )
        self.hop_seconds = Histogram(
            f"{PREFIX}_request_hop_seconds",
            "Where a request's time to first token goes, by hop: prepare (body "
            "parsed, validated, tokenized), route (scheduler), prefill (remote prefill call), first_chunk (decode "
            "call sent to its first chunk back: the replica hop, the engine's queue and first step).",
            ["hop"],
            registry=r,
            buckets=HOP_BUCKETS,
        )
        self.predicted_cached_tokens = Counter(
            f"{PREFIX}_predicted_cached_prompt_tokens",
            "Prompt tokens the scheduler expected the prefilling replica to find cached.",
            registry=r,
        )
        self.engine_cached_tokens = Counter(
            f"{PREFIX}_engine_cached_prompt_tokens",
            "Prompt tokens the prefilling replica reported as prefix-cache hits.",
            registry=r,
        )
        self.prefill_fallbacks = Counter(
            f"{PREFIX}_prefill_fallbacks",
            "Remote prefills abandoned for a local prefill, by reason.",
            ["reason"],
            registry=r,
        )
        self.migrations = Counter(
            f"{PREFIX}_decode_migrations", "Streams moved to another decode replica after theirs failed.", registry=r
        )
        self.parked_streams = Counter(
            f"{PREFIX}_parked_streams",
            "Streams whose client stopped reading: the engine request was aborted, and continued once the client "
            "read again.",
            registry=r,
        )
        self.decode_replicas_set_aside = Counter(
            f"{PREFIX}_decode_replicas_set_aside",
            "Decode replicas that failed a stream and got no new request for a while.",
            registry=r,
        )
        self.kv_handoffs = Counter(
            f"{PREFIX}_kv_handoffs", "Remote prefills whose KV was handed to a decode replica.", registry=r
        )
        self.kv_handoff_blocks = Counter(
            f"{PREFIX}_kv_handoff_blocks", "KV blocks handed to decode replicas.", registry=r
        )
        self.prefill_latency = Histogram(
            f"{PREFIX}_remote_prefill_seconds", "Latency of remote prefill calls.", registry=r, buckets=TTFT_BUCKETS
        )
        self.responses_unstored = Counter(
            f"{PREFIX}_responses_unstored",
            "Responses API answers asked to be stored and answered unstored, by reason (too_large: past the store's "
            "byte bound alone; unreachable: the store did not answer).",
            ["reason"],
            registry=r,
        )
        self.kv_event_batches = Counter(
            f"{PREFIX}_kv_event_batches", "KV event batches applied to the index.", registry=r
        )
        self.kv_event_blocks = Counter(
            f"{PREFIX}_kv_event_blocks", "Blocks stored or removed in the index by engine events.", ["op"], registry=r
        )
        self.kv_event_resyncs = Counter(
            f"{PREFIX}_kv_event_resyncs", "Replicas whose index entries were dropped, by cause.", ["reason"], registry=r
        )
        self.kv_events_malformed = Counter(
            f"{PREFIX}_kv_events_malformed", "KV event batches dropped as undecodable.", registry=r
        )
        self.kv_event_stream_failures = Counter(
            f"{PREFIX}_kv_event_stream_failures", "KV event subscriptions that failed and were restarted.", registry=r
        )
        self.kv_event_delay = Histogram(
            f"{PREFIX}_kv_event_delay_seconds",
            "From an engine publishing a KV event batch to the index applying it.",
            registry=r,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        if pools is not None:
            r.register(_PoolCollector(pools))

    def add_collector(self, collector) -> None:
        """Series computed at scrape time (anything with `collect()`)."""
        self.registry.register(collector)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class DirectPathFallbacks:
    """Calls sent through Serve's handles although the direct data plane is on, by pool and reason
    (`orchestrator_direct_path_fallbacks_total`): each is slower (every chunk through Ray), never lost."""

    def __init__(self) -> None:
        self._counts: Tally[tuple[str, DirectPathFallback]] = Tally()

    def count(self, pool: str, reason: DirectPathFallback) -> None:
        self._counts[(pool, reason)] += 1

    def total(self) -> int:
        return sum(self._counts.values())

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            f"{PREFIX}_direct_path_fallbacks",
            "Pool calls sent through Serve handles although the direct data plane is on.",
            labels=["pool", "reason"],
        )
        for (pool, reason), n in sorted(self._counts.items()):
            family.add_metric([pool, reason.value], n)
        yield family
