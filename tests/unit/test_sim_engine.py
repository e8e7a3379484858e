"""The simulated engine adapter through the `Engine` interface: real-time
steps, KV events over real ZMQ sockets in vLLM's wire format (decoded by the
same decoder and index the frontend uses), prefill -> decode handoff."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from orchestrator.config import KVCacheConfig, ModelConfig, SimEngineConfig
from orchestrator.engines.adapter import EngineSpec
from orchestrator.engines.base import EngineRequestRejected, EngineRole
from orchestrator.engines.sim_engine import SimEngine, kv_capacity_blocks, perf_model
from orchestrator.engines.vllm_kv_events import decode_batch
from orchestrator.kv.hashing import block_hashes, prefix_root
from orchestrator.kv.index import KVIndex
from orchestrator.kv.ingest import KVEventIngest
from orchestrator.messages import EngineRequest, FinishReason, SamplingSpec
from orchestrator.sim.core import greedy_output
from tests.virtual_time import loop_time, run_virtual

BLOCK = 16
VOCAB = 300


def word_tokenizer(directory: Path) -> Path:
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {f"w{i}": i for i in range(VOCAB)}
    Tokenizer(WordLevel(vocab, unk_token="w0")).save(str(directory / "tokenizer.json"))
    return directory


def make_engine(tmp_path: Path, role=EngineRole.AGGREGATED, publish=False, clock=time.monotonic, **cfg) -> SimEngine:
    model = ModelConfig(name="sim", source=str(word_tokenizer(tmp_path)), max_model_len=8192)
    engine = SimEngineConfig(kind="sim", **({"num_gpu_blocks": 64} | cfg))
    return SimEngine(
        EngineSpec(model, KVCacheConfig(block_size=BLOCK), engine, role, "127.0.0.1", publish_kv_events=publish),
        clock=clock,
    )


def request(rid: str, prompt: list[int], max_tokens: int = 4) -> EngineRequest:
    return EngineRequest(rid, tuple(prompt), SamplingSpec(max_tokens=max_tokens, temperature=0.0))


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(7 * i + seed) % (VOCAB - 10) + 10 for i in range(n)]


async def collect(engine: SimEngine, req: EngineRequest):
    return [chunk async for chunk in engine.generate(req)]


async def publishing_engine(tmp_path: Path):
    """A started engine publishing KV events, and a subscriber already receiving them."""
    engine = make_engine(tmp_path, publish=True)
    info = await engine.start()
    context = zmq.asyncio.Context()
    sub = context.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(info.kv_events_endpoint)
    await asyncio.sleep(0.2)  # the subscription reaches the publisher
    return engine, info, context, sub


def test_roofline_capacity_is_what_the_gpu_holds_beside_the_weights():
    cfg = SimEngineConfig(kind="sim", gpu="H100", model="llama-3.1-8b")
    blocks = kv_capacity_blocks(cfg, perf_model(cfg), 16)
    # 80 GiB * 0.9 - 16 GB of weights, at 128 KiB of KV per token: ~430k tokens.
    assert 25_000 < blocks < 30_000
    with pytest.raises(ValueError, match="does not fit"):
        big = SimEngineConfig(kind="sim", gpu="H100", model="llama-3.1-70b")
        kv_capacity_blocks(big, perf_model(big), 16)


def test_generation_streams_greedy_tokens_in_modelled_time(tmp_path):
    """On a virtual clock: the stream takes exactly the modelled time of its steps."""

    async def run():
        engine = make_engine(tmp_path, clock=loop_time)
        info = await engine.start()
        assert info.engine_kind == "sim" and info.kv_capacity_blocks == 64
        started = loop_time()
        chunks = await collect(engine, request("a", prompt(40), max_tokens=5))
        elapsed = loop_time() - started
        modelled = engine._core.now
        engine.shutdown()
        return chunks, elapsed, modelled, engine.stats()

    chunks, elapsed, modelled, stats = run_virtual(run())
    assert [c.token_ids[0] for c in chunks] == greedy_output(prompt(40), 5, VOCAB)
    assert chunks[0].num_prompt_tokens == 40 and chunks[-1].finish_reason is FinishReason.LENGTH
    assert "".join(c.text for c in chunks)
    # Five H100 steps of an 8B model (~7 ms each: weights read once a step), released as modelled.
    assert 0.02 < modelled < 0.1
    assert elapsed == pytest.approx(modelled, abs=1e-9)
    assert stats.generation_tokens_total == 5 and stats.prompt_tokens_computed_total == 40
    assert stats.kv_cache_usage == 0.0  # everything freed (cached blocks are free)


def test_a_repeated_prompt_is_a_prefix_cache_hit(tmp_path):
    async def run():
        engine = make_engine(tmp_path)
        await engine.start()
        await collect(engine, request("a", prompt(64), 2))
        second = await collect(engine, request("b", prompt(64), 2))
        engine.shutdown()
        return second

    assert asyncio.run(run())[0].num_cached_tokens == 48  # 3 full blocks; the last block is recomputed


def test_a_salted_prompt_reuses_only_its_own_salts_cache_and_its_events_say_which(tmp_path):
    async def run():
        engine, info, context, sub = await publishing_engine(tmp_path)
        cached = []
        for rid, salt in (("a", "s1"), ("b", "s1"), ("c", "s2"), ("d", None)):
            chunks = await collect(engine, replace(request(rid, prompt(64), 2), cache_salt=salt))
            cached.append(chunks[0].num_cached_tokens)
        ingest = KVEventIngest(KVIndex())
        while ingest.index.overlaps(block_hashes(prompt(64), BLOCK)) == {}:  # the unsalted prompt's batch is last
            _, seq, payload = await asyncio.wait_for(sub.recv_multipart(), 5)
            ingest.on_batch("r0", decode_batch(seq, payload), can_replay=False)
        engine.shutdown()
        context.destroy(linger=0)
        return cached, ingest.index

    cached, index = asyncio.run(run())
    assert cached == [0, 48, 0, 0]
    for salt in ("s1", "s2", None):
        assert index.overlaps(block_hashes(prompt(64), BLOCK, prefix_root(salt))) == {"r0": 4}
    assert index.overlaps(block_hashes(prompt(64), BLOCK, prefix_root("s3"))) == {}


def test_cancelling_a_stream_aborts_the_request_and_frees_its_blocks(tmp_path):
    async def run():
        engine = make_engine(tmp_path, clock=loop_time)
        await engine.start()
        stream = engine.generate(request("a", prompt(40), max_tokens=1000))
        await stream.__anext__()
        await stream.aclose()
        await asyncio.sleep(0.05)
        stats = engine.stats()
        engine.shutdown()
        return stats

    stats = run_virtual(run())
    assert stats.num_running == 0 and stats.kv_cache_usage == 0.0


def test_a_prompt_larger_than_the_cache_is_rejected(tmp_path):
    async def run():
        engine = make_engine(tmp_path, num_gpu_blocks=2)
        await engine.start()
        try:
            await collect(engine, request("a", prompt(100)))
        finally:
            engine.shutdown()

    with pytest.raises(EngineRequestRejected, match="needs 7 KV blocks"):
        asyncio.run(run())


def test_prefill_hands_off_to_decode_which_waits_for_the_modelled_transfer(tmp_path):
    async def run():
        prefill = make_engine(tmp_path, EngineRole.PREFILL, link="pcie", clock=loop_time)
        decode = make_engine(tmp_path, EngineRole.DECODE, link="pcie", clock=loop_time)
        await prefill.start()
        await decode.start()
        req = request("a", prompt(48), max_tokens=3)
        result = await prefill.prefill(req.for_prefill(None))
        held = prefill.stats().kv_cache_usage
        chunks = await collect(decode, req.for_decode(None, result.kv_transfer))
        await asyncio.sleep(0.05)
        freed = prefill.stats().kv_cache_usage
        stats = decode.stats()
        prefill.shutdown()
        decode.shutdown()
        return result, held, freed, chunks, stats

    result, held, freed, chunks, stats = run_virtual(run())
    assert result.kv_transfer.num_tokens == 48 and result.kv_transfer.num_blocks == 3
    assert held > 0 and freed == 0.0  # held for the transfer, then released
    assert [c.token_ids[0] for c in chunks] == greedy_output(prompt(48), 3, VOCAB)
    assert chunks[0].num_cached_tokens == 47  # everything but the last prompt token came over the link
    assert stats.prompt_tokens_transferred_total == 47 and stats.prompt_tokens_computed_total == 1
    assert stats.kv_transfers_total == 1 and stats.kv_transfer_bytes_total == 48 * 131072


def test_kv_events_reach_the_index_through_vllms_wire_format(tmp_path):
    async def run():
        engine, info, context, sub = await publishing_engine(tmp_path)
        await collect(engine, request("a", prompt(64), 2))
        ingest = KVEventIngest(KVIndex())
        topic, seq, payload = await asyncio.wait_for(sub.recv_multipart(), 5)
        ingest.on_batch("r0", decode_batch(seq, payload))
        # Replay from the start returns the same batch.
        dealer = context.socket(zmq.DEALER)
        dealer.connect(info.kv_events_replay_endpoint)
        await dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        replayed = await asyncio.wait_for(dealer.recv_multipart(), 5)
        end = await asyncio.wait_for(dealer.recv_multipart(), 5)
        engine.shutdown()
        context.destroy(linger=0)
        return topic, ingest, replayed, end

    topic, ingest, replayed, end = asyncio.run(run())
    assert topic.startswith(b"kv@sim-")
    hashes = block_hashes(prompt(64), BLOCK)
    assert ingest.index.overlaps(hashes) == {"r0": 4}
    assert replayed[2] == (0).to_bytes(8, "big") and int.from_bytes(end[2], "big", signed=True) == -1
