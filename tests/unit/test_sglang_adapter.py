"""The SGLang engine kind without SGLang: every translation of the adapter
against payload shapes recorded from SGLang's source (tests/fixtures/sglang/,
README there), the KV event decoder, config validation, and the request
path's concurrent KV handoff with fake pools on the far side of the engine
boundary. The engine itself runs only on GPU machines (benchmarks/gpu/)."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import msgspec
import pytest

from orchestrator.config import (
    KVCacheConfig,
    ModelConfig,
    NetworkConfig,
    PoolConfig,
    SglangEngineConfig,
)
from orchestrator.engines import check_engine_config, kv_event_decoder, process_env
from orchestrator.engines.base import (
    EngineError,
    EngineInfo,
    EngineRequestRejected,
    EngineRole,
    KVHandoff,
    rendezvous_transfer,
)
from orchestrator.engines.sglang_engine import (
    RECORDED_SERVER_ARGS_FIELDS,
    ChunkDecoder,
    EnginePorts,
    StatsSink,
    StreamMode,
    check_server_args,
    engine_info,
    generate_kwargs,
    parse_finish,
    parse_output,
    sampling_params,
    server_args_kwargs,
    stream_mode,
)
from orchestrator.engines.sglang_kv_events import MalformedEvents, decode_batch
from orchestrator.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from orchestrator.kv.index import KVIndex
from orchestrator.kv.hashing import block_hashes
from orchestrator.metrics import FrontendMetrics
from orchestrator.pools import ReplicaView
from orchestrator.request_path import RequestPath, RequestTrace
from orchestrator.requests import (
    EngineChunk,
    EngineRequest,
    FinishReason,
    KVTransfer,
    PrefillResult,
    SamplingSpec,
)
from orchestrator.routing.base import RouteDecision, RouteKind, RouteReason

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"
OUTPUTS = json.loads((FIXTURES / "outputs.json").read_text())
EVENTS = json.loads((FIXTURES / "kv_events.json").read_text())

MODEL = ModelConfig(name="llama", source="meta-llama/Llama-3.1-8B-Instruct", max_model_len=16384, dtype="bfloat16",
                    seed=3)
KV = KVCacheConfig(block_size=16)
PROMPT = tuple(range(1, 10))


def _request(**sampling) -> EngineRequest:
    return EngineRequest("req-1", PROMPT, SamplingSpec(max_tokens=16, **sampling))


def _info(role: EngineRole, host: str = "10.0.0.5", bootstrap_port: int | None = 8998) -> EngineInfo:
    return engine_info(role, "0.0.0", f"engine-{role.value}", MODEL, KV, host,
                       EnginePorts(server=30000, bootstrap=bootstrap_port if role is EngineRole.PREFILL else None),
                       {"max_total_num_tokens": 160_000})


def _rendezvous(room: int = 42) -> KVTransfer:
    return rendezvous_transfer(_info(EngineRole.PREFILL), len(PROMPT), room)


# -- ServerArgs ------------------------------------------------------------------


def test_server_args_for_each_role():
    engine = SglangEngineConfig(kind="sglang", mem_fraction_static=0.85, chunked_prefill_size=8192,
                                ib_device="mlx5_0", server_args={"attention_backend": "fa3"})
    ports = EnginePorts(server=31000, bootstrap=8999, kv_events=5557, kv_events_replay=5558)
    prefill = server_args_kwargs(MODEL, KV, engine, EngineRole.PREFILL, "10.0.0.5", NetworkConfig(), ports,
                                 publish_kv_events=True)
    assert prefill == {
        "model_path": "meta-llama/Llama-3.1-8B-Instruct", "tokenizer_path": "meta-llama/Llama-3.1-8B-Instruct",
        "served_model_name": "llama", "dtype": "bfloat16", "context_length": 16384, "random_seed": 3,
        "page_size": 16, "disable_radix_cache": False, "tp_size": 1, "host": "10.0.0.5", "port": 31000,
        "disaggregation_mode": "prefill", "disaggregation_transfer_backend": "nixl",
        "disaggregation_ib_device": "mlx5_0", "disaggregation_bootstrap_port": 8999,
        "kv_events_config": json.dumps({"publisher": "zmq", "endpoint": "tcp://*:5557",
                                        "replay_endpoint": "tcp://*:5558", "topic": "kv"}),
        "mem_fraction_static": 0.85, "chunked_prefill_size": 8192, "attention_backend": "fa3",
    }
    decode = server_args_kwargs(MODEL, KV, engine, EngineRole.DECODE, "10.0.0.6", NetworkConfig(),
                                EnginePorts(server=31001))
    assert decode["disaggregation_mode"] == "decode" and "disaggregation_bootstrap_port" not in decode
    assert "kv_events_config" not in decode
    agg = server_args_kwargs(MODEL, KVCacheConfig(enable_prefix_caching=False), SglangEngineConfig(kind="sglang"),
                             EngineRole.AGGREGATED, "10.0.0.7", NetworkConfig(), EnginePorts(server=31002))
    assert agg["disaggregation_mode"] == "null" and agg["disable_radix_cache"] is True
    assert "disaggregation_transfer_backend" not in agg and "mem_fraction_static" not in agg
    assert set(prefill) | set(agg) <= RECORDED_SERVER_ARGS_FIELDS


def test_a_prefill_engine_needs_a_bootstrap_port():
    with pytest.raises(ValueError, match="bootstrap"):
        server_args_kwargs(MODEL, KV, SglangEngineConfig(kind="sglang"), EngineRole.PREFILL, "h", NetworkConfig(),
                           EnginePorts(server=1))


# -- requests ----------------------------------------------------------------------


def test_sampling_params_use_sglang_names():
    spec = SamplingSpec(max_tokens=32, temperature=0.5, top_p=0.9, top_k=40, min_p=0.1, seed=7, stop=("\n\n",),
                        stop_token_ids=(128009,), ignore_eos=True, min_tokens=2, presence_penalty=0.1,
                        frequency_penalty=0.2, repetition_penalty=1.1)
    assert sampling_params(spec) == {
        "max_new_tokens": 32, "min_new_tokens": 2, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.1,
        "ignore_eos": True, "presence_penalty": 0.1, "frequency_penalty": 0.2, "repetition_penalty": 1.1,
        "stop": ["\n\n"], "stop_token_ids": [128009], "sampling_seed": 7,
    }
    plain = sampling_params(SamplingSpec(max_tokens=4))
    assert plain["top_k"] == -1 and not {"stop", "stop_token_ids", "sampling_seed"} & set(plain)


def test_generate_kwargs_carry_the_rendezvous_as_sglangs_load_balancer_does():
    request = _request().for_decode("d0", _rendezvous(room=6148914691236517205))
    kwargs = generate_kwargs(request, "req-1-abc", stream=True)
    lb = OUTPUTS["mini_lb_request_fields"]
    assert {k: kwargs[k] for k in lb} == lb
    assert kwargs["input_ids"] == list(PROMPT) and kwargs["rid"] == "req-1-abc" and kwargs["stream"] is True
    assert not {"bootstrap_host", "bootstrap_room"} & set(generate_kwargs(_request(), "r", stream=False))


def test_a_transfer_that_is_no_rendezvous_is_rejected():
    vllm_style = KVTransfer("e", 1, 9, {"remote_block_ids": [[1]]})
    with pytest.raises(EngineRequestRejected, match="rendezvous"):
        generate_kwargs(_request().for_decode(None, vllm_style), "r", stream=True)


# -- outputs -------------------------------------------------------------------------


def _chunks(stream: list[dict], mode: StreamMode, request: EngineRequest) -> list[EngineChunk]:
    decoder = ChunkDecoder(request, mode)
    return [c for c in (decoder.feed(parse_output(o)) for o in stream) if c is not None]


@pytest.mark.parametrize("name, mode", [("cumulative_stream", StreamMode.CUMULATIVE),
                                         ("incremental_stream", StreamMode.INCREMENTAL),
                                         ("legacy_stream_output", StreamMode.INCREMENTAL_IDS)])
def test_each_stream_mode_becomes_deltas(name, mode):
    stream = OUTPUTS[name]
    chunks = _chunks(stream, mode, _request(stop_token_ids=()))
    final = stream[-1]
    all_ids = (final["output_ids"] if mode is StreamMode.CUMULATIVE
               else [t for o in stream for t in o["output_ids"]])
    all_text = final["text"] if mode is not StreamMode.INCREMENTAL else "".join(o["text"] for o in stream)
    assert [t for c in chunks for t in c.token_ids] == all_ids
    assert "".join(c.text for c in chunks) == all_text
    assert [c.finished for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[0].num_prompt_tokens == 9 and all(c.num_prompt_tokens == 0 for c in chunks[1:])
    assert chunks[0].num_cached_tokens == stream[0]["meta_info"]["cached_tokens"]


def test_stream_mode_follows_the_server_args():
    assert stream_mode({}) is StreamMode.CUMULATIVE
    assert stream_mode({"stream_output": True}) is StreamMode.INCREMENTAL_IDS
    assert stream_mode({"incremental_streaming_output": True}) is StreamMode.INCREMENTAL


def test_finish_reasons_and_stop_reasons():
    reasons = OUTPUTS["finish_reasons"]
    assert parse_finish(None) is None
    assert parse_finish(reasons["length"]).reason is FinishReason.LENGTH
    assert parse_finish(reasons["stop_string"]).matched == "\n\n"

    def last_chunk(finish, **sampling):
        out = {"text": "x", "output_ids": [5], "meta_info": {"prompt_tokens": 9, "finish_reason": finish}}
        return ChunkDecoder(_request(**sampling)).feed(parse_output(out))

    eos = last_chunk(reasons["stop_token"])
    assert (eos.finish_reason, eos.stop_reason) == (FinishReason.STOP, None)  # EOS: no stop reason, as vLLM
    stop_token = last_chunk(reasons["stop_token"], stop_token_ids=(128009,))
    assert stop_token.stop_reason == 128009
    assert last_chunk(reasons["stop_string"], stop=("\n\n",)).stop_reason == "\n\n"


def test_aborts_raise_by_whose_fault_they_are():
    reasons = OUTPUTS["finish_reasons"]

    def feed(finish):
        out = {"text": "", "output_ids": [], "meta_info": {"prompt_tokens": 9, "finish_reason": finish}}
        return ChunkDecoder(_request()).feed(parse_output(out))

    with pytest.raises(EngineRequestRejected, match="exceeds"):
        feed(reasons["abort_bad_request"])
    with pytest.raises(EngineError, match="kvcache"):
        feed(reasons["abort_transfer_failed"])
    with pytest.raises(EngineError, match="Aborted"):
        feed(reasons["abort_default"])


def test_a_decode_with_a_rendezvous_reports_its_prompt_as_transferred():
    request = _request().for_decode("d0", _rendezvous())
    first = _chunks(OUTPUTS["cumulative_stream"], StreamMode.CUMULATIVE, request)[0]
    assert first.num_cached_tokens == 9


def test_an_output_adding_nothing_yields_no_chunk():
    decoder = ChunkDecoder(_request())
    out = {"text": "", "output_ids": [], "meta_info": {"prompt_tokens": 9, "finish_reason": None}}
    assert decoder.feed(parse_output(out)) is None


# -- stats and info -------------------------------------------------------------------


def test_stats_fold_finished_requests_by_role():
    final = parse_output(OUTPUTS["cumulative_stream"][-1])
    decode = StatsSink(EngineRole.DECODE)
    decode.started()
    decode.finished(_request().for_decode("d0", _rendezvous()), final)
    decode.transfer_failed()
    s = decode.snapshot()
    assert (s.num_running, s.prompt_tokens_transferred_total, s.prompt_tokens_computed_total) == (1, 9, 0)
    assert (s.generation_tokens_total, s.kv_transfers_total, s.kv_transfer_failures_total) == (6, 1, 1)

    prefill = StatsSink(EngineRole.PREFILL)
    prefill.finished(_request().for_prefill("p0"), parse_output(OUTPUTS["prefill_result"]))
    s = prefill.snapshot()
    assert (s.prompt_tokens_computed_total, s.prompt_tokens_local_cache_total, s.generation_tokens_total) == (5, 4, 0)
    assert s.requests_finished_total == 1 and s.kv_transfers_total == 0


def test_engine_info_publishes_the_rendezvous_and_the_decode_limits():
    ports = EnginePorts(server=1, bootstrap=8999, kv_events=5557, kv_events_replay=5558)
    info = engine_info(EngineRole.PREFILL, "0.5", "e", MODEL, KV, "10.0.0.5", ports, {"max_total_num_tokens": 1600})
    assert (info.kv_handoff, info.bootstrap_port, info.prefills_locally) == (KVHandoff.CONCURRENT, 8999, True)
    assert info.kv_events_endpoint == "tcp://10.0.0.5:5557" and info.kv_events_replay_endpoint == "tcp://10.0.0.5:5558"
    assert info.kv_capacity_blocks == 100 and info.engine_kind == "sglang"
    assert EngineInfo.from_dict(info.to_dict()) == info
    decode = _info(EngineRole.DECODE)
    assert decode.prefills_locally is False and decode.bootstrap_port is None and decode.kv_events_endpoint is None


def test_rendezvous_transfer_names_the_prefill_replica():
    kv = _rendezvous(room=7)
    assert kv.engine_params == {"bootstrap_host": "10.0.0.5", "bootstrap_port": 8998, "bootstrap_room": 7}
    assert (kv.source_engine_id, kv.num_tokens, kv.num_blocks) == ("engine-prefill", 9, 1)
    vllm_info = replace(_info(EngineRole.PREFILL), kv_handoff=KVHandoff.AFTER_PREFILL)
    with pytest.raises(ValueError):
        rendezvous_transfer(vllm_info, 9, 7)


# -- KV events -------------------------------------------------------------------------


def _fixture_batch(name: str):
    entry = EVENTS[name]
    return decode_batch(bytes.fromhex(entry["seq_frame_hex"]), (FIXTURES / entry["payload"]).read_bytes())


def test_sglang_event_batches_decode_into_index_events():
    assert kv_event_decoder("sglang") is decode_batch
    batch = _fixture_batch("stored_pages")
    assert (batch.seq, batch.ts) == (0, 1700000000.5)
    assert batch.events == (
        BlockStored((-7001,), None, (100, 101, 102, 103), 4),
        BlockStored((7002,), -7001, (104, 105, 106, 107), 4),
        BlockStored((7003,), 7002, (108, 109, 110, 111), 4),
    )
    assert _fixture_batch("removed_and_cleared").events == (BlockRemoved((7003,)), AllBlocksCleared())


def test_the_index_follows_sglang_pages_like_vllm_blocks():
    index = KVIndex()
    index.apply("p0", _fixture_batch("stored_pages").events)
    assert index.overlaps(block_hashes(list(range(100, 112)), 4)) == {"p0": 3}


def test_other_storage_tiers_are_skipped():
    assert _fixture_batch("with_medium").events == (
        BlockStored((7101,), None, (100, 101, 102, 103), 4),
        BlockRemoved((7101,)),
    )


def test_vllms_decoder_cannot_read_sglang_payloads():
    """The formats differ (array-like events vs maps): hence a decoder of its own."""
    from orchestrator.engines.vllm_kv_events import decode_batch as vllm_decode

    entry = EVENTS["stored_pages"]
    assert vllm_decode(bytes(8), (FIXTURES / entry["payload"]).read_bytes()).events == ()


def test_garbage_and_unknown_kinds():
    with pytest.raises(MalformedEvents):
        decode_batch(bytes(8), b"\xc1not msgpack")
    with pytest.raises(MalformedEvents):
        decode_batch(bytes(8), msgspec.msgpack.encode({"a": 1}))
    payload = msgspec.msgpack.encode([2.0, [["BlockPinned", [1]], ["BlockRemoved", [3]]]])
    assert decode_batch(bytes(8), payload).events == (BlockRemoved((3,)),)


# -- registration and config validation -------------------------------------------------


def _pool(**engine) -> PoolConfig:
    return PoolConfig(engine={"kind": "sglang", **engine})


def test_unknown_server_args_fail_against_the_recorded_fields():
    check_engine_config(_pool(server_args={"attention_backend": "fa3", "max_total_tokens": 1000}))
    with pytest.raises(ValueError, match=r"\['atention_backend'\]"):
        check_engine_config(_pool(server_args={"atention_backend": "fa3"}))
    with pytest.raises(ValueError, match="no field"):
        check_server_args(SglangEngineConfig(kind="sglang", server_args={"x": 1}), frozenset({"y"}))


def test_server_args_may_not_override_what_the_adapter_sets():
    with pytest.raises(ValueError, match="page_size"):
        _pool(server_args={"page_size": 64})


def test_process_env_maps_the_handshake_timeout():
    from orchestrator.config import AppConfig

    app = AppConfig(model=MODEL, decode_pool=_pool(), network=NetworkConfig(kv_handshake_timeout_s=60))
    assert process_env(app, app.decode_pool) == {"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "60",
                                                 "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "60"}
    assert process_env(replace_network(app), app.decode_pool) == {}


def replace_network(app):
    return app.model_copy(update={"network": NetworkConfig()})


# -- the request path's concurrent handoff, over fake pools --------------------------------


@dataclass
class RendezvousPools:
    """Prefill and decode pools that behave as SGLang's do: the decode stream
    yields nothing until the prefill of the same room has run; a decode
    without a rendezvous is refused (400); a prefill can fail or stall."""

    prefill_ids: tuple[str, ...] = ("p0", "p1")
    decode_ids: tuple[str, ...] = ("d0",)
    failing_prefills: set[str] = field(default_factory=set)
    stalled_prefills: set[str] = field(default_factory=set)
    decode_fails_after: int | None = None
    rooms: dict[int, asyncio.Event] = field(default_factory=dict)
    prefills: list[EngineRequest] = field(default_factory=list)
    decodes: list[EngineRequest] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)

    def _room(self, request: EngineRequest) -> asyncio.Event:
        return self.rooms.setdefault(request.kv_transfer.engine_params["bootstrap_room"], asyncio.Event())

    def prefill_pool(self):
        pools = self

        class Prefill:
            name = "prefill_pool"

            def replicas(self):
                return [ReplicaView(r, _info(EngineRole.PREFILL, host=f"host-{r}")) for r in pools.prefill_ids]

            async def prefill(self, request: EngineRequest) -> PrefillResult:
                pools.prefills.append(request)
                assert request.kv_transfer is not None, "an SGLang prefill needs the rendezvous"
                if request.target_replica in pools.stalled_prefills:
                    await asyncio.sleep(3600)
                await asyncio.sleep(0.01)  # decode is already waiting in the room
                if request.target_replica in pools.failing_prefills:
                    raise RuntimeError("prefill replica died")
                pools._room(request).set()
                return PrefillResult(request.kv_transfer, len(request.prompt_token_ids), 0, request.target_replica)

            def generate(self, request):
                raise AssertionError("prefill replicas do not decode")

        return Prefill()

    def decode_pool(self):
        pools = self

        class Decode:
            name = "decode_pool"

            def replicas(self):
                return [ReplicaView(r, _info(EngineRole.DECODE)) for r in pools.decode_ids]

            async def prefill(self, request):
                raise AssertionError

            async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
                pools.decodes.append(request)
                try:
                    if request.kv_transfer is None:
                        raise EngineRequestRejected("Disaggregated request received without bootstrap room id")
                    await pools._room(request).wait()
                    already = len(request.prompt_token_ids) - len(PROMPT)
                    for i in range(request.sampling.max_tokens):
                        if pools.decode_fails_after is not None and already + i == pools.decode_fails_after \
                                and len(pools.decodes) == 1:
                            raise RuntimeError("decode replica died")
                        yield EngineChunk((1000 + already + i,), f"t{already + i} ",
                                          FinishReason.LENGTH if i == request.sampling.max_tokens - 1 else None,
                                          num_prompt_tokens=len(request.prompt_token_ids) if i == 0 else 0,
                                          num_cached_tokens=len(request.prompt_token_ids) if i == 0 else 0)
                finally:
                    pools.closed.append(request.request_id)

        return Decode()


class FixedScheduler:
    def __init__(self, route: RouteDecision) -> None:
        self.route = route

    def route_request(self, request, prefill_replicas, decode_replicas):
        if prefill_replicas is None:  # a migration's continuation
            return RouteDecision(RouteKind.LOCAL_PREFILL, decode_replicas[0].replica_id)
        return self.route

    def on_prefill_done(self, request_id):
        pass

    def on_request_finished(self, request_id):
        pass


REMOTE = RouteDecision(RouteKind.REMOTE_PREFILL, "d0", "p0", RouteReason.DISAGGREGATED)
LOCAL = RouteDecision(RouteKind.LOCAL_PREFILL, "d0", None, RouteReason.SHORT_UNCACHED)


def _path(pools: RendezvousPools, route: RouteDecision = REMOTE, **kwargs) -> tuple[RequestPath, FrontendMetrics]:
    metrics = FrontendMetrics(pools=lambda: {})
    path = RequestPath(pools.decode_pool(), pools.prefill_pool(), FixedScheduler(route), metrics,
                       prefill_timeout_s=kwargs.pop("prefill_timeout_s", 5.0), rng=random.Random(0), **kwargs)
    return path, metrics


def _run(path: RequestPath, max_tokens: int = 4) -> tuple[list[EngineChunk], RequestTrace]:
    trace = RequestTrace()
    request = EngineRequest("req-1", PROMPT, SamplingSpec(max_tokens=max_tokens))

    async def go():
        return [c async for c in path.stream(request, trace)]

    return asyncio.run(go()), trace


def _metric(metrics: FrontendMetrics, name: str, labels: dict | None = None) -> float:
    return metrics.registry.get_sample_value(name, labels or {}) or 0.0


def test_prefill_and_decode_start_together_with_one_rendezvous():
    pools = RendezvousPools()
    path, metrics = _path(pools)
    chunks, trace = _run(path)
    assert [c.token_ids[0] for c in chunks] == [1000, 1001, 1002, 1003]
    (prefill,), (decode,) = pools.prefills, pools.decodes
    assert prefill.kv_transfer == decode.kv_transfer  # the same room on both halves
    room = random.Random(0).getrandbits(63)
    assert decode.kv_transfer.engine_params == {"bootstrap_host": "host-p0", "bootstrap_port": 8998,
                                                "bootstrap_room": room}
    assert prefill.target_replica == "p0" and prefill.sampling.max_tokens == 1 and decode.target_replica == "d0"
    assert trace.prefill is not None and trace.fallback is None
    assert _metric(metrics, "orchestrator_kv_handoffs_total") == 1


def test_a_failed_prefill_aborts_the_waiting_decode_and_retries_on_another_prefill_replica():
    pools = RendezvousPools(failing_prefills={"p0"})
    path, metrics = _path(pools)
    chunks, trace = _run(path)
    assert len(chunks) == 4
    assert [p.target_replica for p in pools.prefills] == ["p0", "p1"]
    first, second = pools.decodes
    assert first.request_id in pools.closed  # the first decode attempt was aborted
    assert first.kv_transfer.engine_params["bootstrap_room"] != second.kv_transfer.engine_params["bootstrap_room"]
    assert second.kv_transfer.engine_params["bootstrap_host"] == "host-p1"
    assert _metric(metrics, "orchestrator_prefill_fallbacks_total", {"reason": "error"}) == 1


def test_a_stalled_prefill_times_out_and_another_replica_prefills():
    pools = RendezvousPools(stalled_prefills={"p0"})
    path, metrics = _path(pools, prefill_timeout_s=0.05)
    chunks, _ = _run(path)
    assert len(chunks) == 4 and [p.target_replica for p in pools.prefills] == ["p0", "p1"]
    assert _metric(metrics, "orchestrator_prefill_fallbacks_total", {"reason": "timeout"}) == 1


def test_without_any_working_prefill_replica_the_request_fails():
    pools = RendezvousPools(failing_prefills={"p0", "p1"})
    path, _ = _path(pools)
    with pytest.raises(EngineError, match="cannot prefill locally"):
        _run(path)


def test_a_local_route_to_a_decode_engine_that_cannot_prefill_gets_a_concurrent_prefill():
    pools = RendezvousPools()
    path, _ = _path(pools, route=LOCAL)
    chunks, _ = _run(path)
    assert len(chunks) == 4 and len(pools.prefills) == 1
    assert pools.decodes[0].kv_transfer == pools.prefills[0].kv_transfer


def test_a_migrated_continuation_is_prefilled_remotely_too():
    pools = RendezvousPools(decode_ids=("d0", "d1"), decode_fails_after=2)
    path, metrics = _path(pools)
    chunks, trace = _run(path)
    assert [c.token_ids[0] for c in chunks] == [1000, 1001, 1002, 1003]
    assert trace.migrations == 1
    continuation = pools.decodes[1]
    assert continuation.prompt_token_ids == PROMPT + (1000, 1001) and continuation.kv_transfer is not None
    assert pools.prefills[1].prompt_token_ids == continuation.prompt_token_ids


def test_a_client_closing_the_stream_cancels_both_halves():
    pools = RendezvousPools()
    path, _ = _path(pools)
    trace = RequestTrace()

    async def go():
        stream = path.stream(EngineRequest("req-1", PROMPT, SamplingSpec(max_tokens=50)), trace)
        first = await anext(stream)
        await stream.aclose()
        return first

    assert asyncio.run(go()).token_ids == (1000,)
    assert pools.decodes[0].request_id in pools.closed


# -- the adapter over a stand-in for sglang.Engine (its documented call shapes) -------------


class FakeTokenizerManager:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.aborted.append(rid)


class FakeSglang:
    """`async_generate(**kwargs)`: with stream=True an async iterator of
    output dicts, else one dict (sglang/srt/entrypoints/engine.py)."""

    def __init__(self, outputs: list[dict], error: Exception | None = None) -> None:
        self.outputs = outputs
        self.error = error
        self.calls: list[dict] = []
        self.tokenizer_manager = FakeTokenizerManager()

    async def async_generate(self, **kwargs):
        self.calls.append(kwargs)
        if self.error is not None:
            raise self.error
        if not kwargs["stream"]:
            return self.outputs[-1]

        async def stream():
            for out in self.outputs:
                yield out

        return stream()


def _engine(role: EngineRole, fake: FakeSglang):
    from orchestrator.engines.sglang_engine import SglangEngine

    engine = SglangEngine(MODEL, KV, SglangEngineConfig(kind="sglang"), role, "127.0.0.1", NetworkConfig())
    engine._engine = fake  # what start() would have built
    return engine


def _collect(engine, request, limit=None):
    async def go():
        out = []
        stream = engine.generate(request)
        async for chunk in stream:
            out.append(chunk)
            if limit is not None and len(out) == limit:
                await stream.aclose()
                break
        return out

    return asyncio.run(go())


def test_generate_streams_deltas_and_counts_the_transfer():
    fake = FakeSglang(OUTPUTS["cumulative_stream"])
    engine = _engine(EngineRole.DECODE, fake)
    request = _request().for_decode("d0", _rendezvous(room=9))
    chunks = _collect(engine, request)
    assert "".join(c.text for c in chunks) == " Paris is the capital."
    (call,) = fake.calls
    assert call["stream"] is True and call["bootstrap_room"] == 9 and call["rid"].startswith("req-1-")
    assert fake.tokenizer_manager.aborted == []  # finished: nothing to abort
    stats = engine.stats()
    assert (stats.kv_transfers_total, stats.prompt_tokens_transferred_total, stats.num_running) == (1, 9, 0)


def test_closing_a_stream_early_aborts_it_in_sglang():
    fake = FakeSglang(OUTPUTS["cumulative_stream"])
    engine = _engine(EngineRole.DECODE, fake)
    _collect(engine, _request().for_decode("d0", _rendezvous()), limit=1)
    assert fake.tokenizer_manager.aborted == [fake.calls[0]["rid"]]


def test_an_aborted_transfer_is_an_engine_error_and_a_failed_transfer():
    failed = OUTPUTS["finish_reasons"]["abort_transfer_failed"]
    aborted = {"text": "", "output_ids": [],
               "meta_info": {"prompt_tokens": 9, "completion_tokens": 0, "cached_tokens": 0, "finish_reason": failed}}
    engine = _engine(EngineRole.DECODE, FakeSglang([aborted]))
    with pytest.raises(EngineError):
        _collect(engine, _request().for_decode("d0", _rendezvous()))
    assert engine.stats().kv_transfer_failures_total == 1


def test_sglang_validation_errors_reject_the_request():
    engine = _engine(EngineRole.DECODE, FakeSglang([], error=ValueError("The input (20000 tokens) is longer than")))
    with pytest.raises(EngineRequestRejected, match="longer"):
        _collect(engine, _request().for_decode("d0", _rendezvous()))


def test_prefill_returns_the_rendezvous_once_sglang_reports_it_done():
    fake = FakeSglang([OUTPUTS["prefill_result"]])
    engine = _engine(EngineRole.PREFILL, fake)
    request = replace(_request().for_prefill("p0"), kv_transfer=_rendezvous(room=5))
    result = asyncio.run(engine.prefill(request))
    assert result.kv_transfer == request.kv_transfer
    assert (result.num_prompt_tokens, result.num_cached_tokens) == (9, 4)
    assert fake.calls[0]["stream"] is False and fake.calls[0]["sampling_params"]["max_new_tokens"] == 1
    with pytest.raises(EngineError, match="rendezvous"):
        asyncio.run(engine.prefill(_request().for_prefill("p0")))
