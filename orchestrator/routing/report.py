"""Scrape-time metrics of the scheduler's view: index size and the load it
has accounted to each replica."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import GaugeMetricFamily, Metric

from orchestrator.kv.index import KVIndex
from orchestrator.metrics import PREFIX
from orchestrator.pools import ReplicaView
from orchestrator.routing.load import InflightLoad


class SchedulerCollector:
    def __init__(
        self, index: KVIndex, load: InflightLoad | None, pools: Callable[[], dict[str, list[ReplicaView]]]
    ) -> None:
        self._index = index
        self._load = load
        self._pools = pools

    def collect(self) -> Iterable[Metric]:
        yield GaugeMetricFamily(
            f"{PREFIX}_kv_index_blocks", "Distinct blocks in this frontend's KV index.", value=self._index.num_blocks()
        )
        held = GaugeMetricFamily(
            f"{PREFIX}_kv_index_replica_blocks", "Blocks the index places on each replica.", labels=["pool", "replica"]
        )
        prefill = GaugeMetricFamily(
            f"{PREFIX}_scheduler_queued_prefill_blocks",
            "Prompt blocks this frontend sent a replica and has not seen prefilled.",
            labels=["pool", "replica"],
        )
        decode = GaugeMetricFamily(
            f"{PREFIX}_scheduler_decode_blocks",
            "Blocks of requests this frontend is decoding on a replica.",
            labels=["pool", "replica"],
        )
        for pool, views in self._pools().items():
            for v in views:
                held.add_metric([pool, v.replica_id], self._index.replica_blocks(v.replica_id))
                if self._load is not None:
                    prefill.add_metric([pool, v.replica_id], self._load.prefill_blocks(v.replica_id))
                    decode.add_metric([pool, v.replica_id], self._load.decode_blocks(v.replica_id))
        yield held
        if self._load is not None:
            yield prefill
            yield decode
