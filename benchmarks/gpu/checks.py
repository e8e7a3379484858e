"""What the GPU acceptance scripts share: a named check with its evidence, a frontend counter summed
over its label sets, and the decode pool's KV-transfer totals from `/pools`."""

from __future__ import annotations

import json
from typing import Any


def check(results: list[dict], name: str, ok: bool, **evidence: Any) -> None:
    results.append({"check": name, "ok": bool(ok), **evidence})
    print(f"{'ok  ' if ok else 'FAIL'} {name} {json.dumps(evidence)[:300]}", flush=True)


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples in Prometheus text whose labels include `labels`."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def transfer_totals(replica_stats: list[dict]) -> dict[str, float]:
    """KV transfers into these replicas by their own engine stats: count, prompt tokens received, failures."""
    return {
        key: sum(s.get(key, 0) for s in replica_stats)
        for key in ("kv_transfers_total", "prompt_tokens_transferred_total", "kv_transfer_failures_total")
    }
