"""Scheduler cost on one core: routing decision time and KV event ingestion rate.

Decision time: 4k-token prompts routed against N decode replicas (and 2 prefill
replicas) while the index holds ~1M blocks spread over the replicas, a
fraction of each replica's blocks sharing prefixes with the prompts.
Ingestion: KV event batches encoded by vLLM's own event classes (32 events a
batch, 32-token blocks), decoded and applied to the index, then the matching
removals. Writes benchmarks/results/scheduler_cost.json.

    .venv/bin/python benchmarks/scheduler_cost.py
"""

from __future__ import annotations

import json
import os
import platform
import random
import sys
import time

import numpy as np

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, report  # noqa: E402
from orchestrator.config import RoutingConfig  # noqa: E402
from orchestrator.engines.base import EngineInfo, EngineRole, EngineStats  # noqa: E402
from orchestrator.kv.hashing import block_hashes  # noqa: E402
from orchestrator.kv.index import KVIndex  # noqa: E402
from orchestrator.messages import EngineRequest, SamplingSpec  # noqa: E402
from orchestrator.pools import ReplicaView  # noqa: E402
from orchestrator.routing.kv_scheduler import KvAwareScheduler  # noqa: E402

BLOCK = 32
PROMPT_TOKENS = 4096
VOCAB = 32000


def _tokens(rng: np.random.Generator, n: int) -> list[int]:
    return rng.integers(0, VOCAB, n).tolist()


def fill_index(
    index: KVIndex, replicas: list[str], total_blocks: int, prefixes: list[list[int]], rng: np.random.Generator
) -> None:
    """Each replica holds some of the shared prefixes (up to a random depth) and
    unique sequences up to its share of `total_blocks`."""
    per_replica = total_blocks // len(replicas)
    for r_i, replica in enumerate(replicas):
        held = 0
        for p_i, prefix in enumerate(prefixes):
            if (p_i + r_i) % 4 == 0:
                depth = int(rng.integers(1, len(prefix) // BLOCK + 1))
                index.store_hashes(replica, block_hashes(prefix[: depth * BLOCK], BLOCK))
                held += depth
        while held < per_replica:
            n = min(128, per_replica - held)
            index.store_hashes(replica, block_hashes(_tokens(rng, n * BLOCK), BLOCK))
            held += n


def bench_decisions(n_replicas: int, total_blocks: int, n_requests: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    prefixes = [_tokens(rng, PROMPT_TOKENS) for _ in range(32)]
    index = KVIndex()
    decode = [f"d{i}" for i in range(n_replicas)]
    prefill = [f"p{i}" for i in range(2)]
    t0 = time.perf_counter()
    fill_index(index, decode + prefill, total_blocks, prefixes, rng)
    fill_s = time.perf_counter() - t0
    info = EngineInfo(EngineRole.DECODE, "vllm", "x", "e", "m", BLOCK, 131072, "h", kv_capacity_blocks=100_000)
    views_d = [ReplicaView(r, info, EngineStats(kv_cache_usage=float(rng.random()))) for r in decode]
    views_p = [ReplicaView(r, info, EngineStats()) for r in prefill]
    sched = KvAwareScheduler(RoutingConfig(event_lag_ttl_s=0), BLOCK, index, rng=random.Random(seed))
    prompts = []
    for i in range(n_requests):
        prefix = prefixes[i % len(prefixes)]
        keep = int(rng.integers(0, PROMPT_TOKENS // BLOCK)) * BLOCK
        prompts.append(tuple(prefix[:keep] + _tokens(rng, PROMPT_TOKENS - keep)))
    requests = [EngineRequest(f"q{i}", p, SamplingSpec(max_tokens=64)) for i, p in enumerate(prompts)]
    times, hash_times = [], []
    for req in requests:
        t = time.perf_counter()
        sched.route_request(req, views_p, views_d)
        times.append(time.perf_counter() - t)
        sched.on_request_finished(req.request_id)
    for req in requests[:200]:
        t = time.perf_counter()
        block_hashes(req.prompt_token_ids, BLOCK)
        hash_times.append(time.perf_counter() - t)
    us = np.array(times) * 1e6
    return {
        "replicas": n_replicas,
        "indexed_blocks": index.num_blocks(),
        "prompt_tokens": PROMPT_TOKENS,
        "decisions": n_requests,
        "index_fill_s": round(fill_s, 2),
        "decision_us": {
            "p50": float(np.percentile(us, 50)),
            "p99": float(np.percentile(us, 99)),
            "mean": float(us.mean()),
        },
        "hashing_us_p50": float(np.percentile(np.array(hash_times) * 1e6, 50)),
    }


def bench_ingestion(n_blocks: int, blocks_per_event: int, events_per_batch: int, seed: int) -> dict:
    """End to end: vLLM-encoded ZMQ payloads -> our decoder -> the index, on one core."""
    import msgspec
    from vllm.distributed import kv_events as vllm_events

    from orchestrator.engines.vllm_kv_events import decode_batch
    from orchestrator.kv.ingest import KVEventIngest

    rng = np.random.default_rng(seed)
    encoder = msgspec.msgpack.Encoder()
    stored, removed = [], []
    parent = None
    n_events = n_blocks // blocks_per_event
    for e in range(n_events):
        hashes = list(range(e * blocks_per_event, (e + 1) * blocks_per_event))
        stored.append(
            vllm_events.BlockStored(
                block_hashes=hashes,
                parent_block_hash=parent if e % 8 else None,
                token_ids=_tokens(rng, blocks_per_event * BLOCK),
                block_size=BLOCK,
                lora_id=None,
                medium="GPU",
                lora_name=None,
            )
        )
        removed.append(vllm_events.BlockRemoved(block_hashes=hashes, medium="GPU"))
        parent = hashes[-1]

    def payloads(events):
        return [
            encoder.encode(vllm_events.KVEventBatch(ts=0.0, events=events[i : i + events_per_batch]))
            for i in range(0, len(events), events_per_batch)
        ]

    stored_msgs, removed_msgs = payloads(stored), payloads(removed)
    ingest = KVEventIngest(KVIndex())
    seq = 0
    t = time.perf_counter()
    for msg in stored_msgs:
        ingest.on_batch("r0", decode_batch(seq.to_bytes(8, "big"), msg))
        seq += 1
    store_s = time.perf_counter() - t
    t = time.perf_counter()
    for msg in removed_msgs:
        ingest.on_batch("r0", decode_batch(seq.to_bytes(8, "big"), msg))
        seq += 1
    remove_s = time.perf_counter() - t
    assert ingest.index.num_blocks() == 0
    return {
        "blocks": n_events * blocks_per_event,
        "blocks_per_event": blocks_per_event,
        "events_per_batch": events_per_batch,
        "stored_blocks_per_s": n_events * blocks_per_event / store_s,
        "removed_blocks_per_s": n_events * blocks_per_event / remove_s,
    }


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--blocks", type=int, default=1_000_000)
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(launch.RESULTS / "scheduler_cost.json"))
    args = p.parse_args()
    decisions = []
    for n in (8, 64, 256):
        result = bench_decisions(n, args.blocks, args.requests, args.seed)
        print(json.dumps(result), flush=True)
        decisions.append(result)
    # Prefill-phase events carry many blocks; decode-phase events one block each.
    ingestion = [bench_ingestion(min(args.blocks, 400_000), bpe, 32, args.seed) for bpe in (16, 1)]
    for row in ingestion:
        print(json.dumps(row), flush=True)
    out = {
        "benchmark": "scheduler_cost",
        "version": 1,
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cores_used": 1},
        "block_size": BLOCK,
        "decisions": decisions,
        "ingestion": ingestion,
        "targets": {"decision_p99_us_at_64": 500, "ingestion_blocks_per_s": 1_000_000},
    }
    report.write_json(args.out, out)


if __name__ == "__main__":
    main()
