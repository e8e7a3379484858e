"""The SGLang engine kind without a GPU: the adapter's translations checked
against the pinned SGLang's own code (installed without its dependencies by
scripts/setup.sh, run in a child process: tests/fixtures/sglang/sglang_code.py),
so that an SGLang release that departs from the adapter fails here, not on a
GPU; output dicts SGLang builds only inside a running engine, recorded from
its source (tests/fixtures/sglang/, README there); the request path's
concurrent KV handoff with fake pools on the far side of the engine boundary.
The engine itself runs only on GPU machines (benchmarks/gpu/)."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import msgspec
import pytest

from orchestrator.config import (
    KVCacheConfig,
    LoraConfig,
    ModelConfig,
    NetworkConfig,
    PoolConfig,
    SglangEngineConfig,
)
from orchestrator.engines import EngineSpec, check_engine_config, kv_event_decoder, process_env
from orchestrator.engines.base import (
    BOOTSTRAP_ROOM_BITS,
    EngineError,
    EngineInfo,
    EngineRequestRejected,
    EngineRole,
    KVHandoff,
    rendezvous_transfer,
)
from orchestrator.engines.ports import FIRST_LISTEN_PORT, ephemeral_ports
from orchestrator.engines.sglang_kv_events import MalformedEvents, decode_batch
from orchestrator.engines.sglang_logprobs import logprob_kwargs
from orchestrator.engines.sglang_outputs import (
    ChunkDecoder,
    StatsSink,
    StreamMode,
    engine_info,
    parse_finish,
    parse_output,
    stream_mode,
)
from orchestrator.engines.sglang_requests import (
    generate_kwargs,
    sampling_params,
)
from orchestrator.engines.sglang_server_args import (
    OWNED_SERVER_ARGS,
    RECORDED_SERVER_ARGS_FIELDS,
    EnginePorts,
    check_server_args,
    draw_ports,
    server_args_fields,
    server_args_kwargs,
)
from orchestrator.kv.events import AllBlocksCleared, BlockRemoved, BlockStored
from orchestrator.kv.hashing import block_hashes, prefix_root
from orchestrator.kv.index import KVIndex
from orchestrator.kv.ingest import Action, KVEventIngest, ResyncReason
from orchestrator.lora.adapter import LoraAdapter
from orchestrator.messages import (
    EngineChunk,
    EngineRequest,
    FinishReason,
    KVTransfer,
    PrefillResult,
    SamplingSpec,
    StructuredKind,
    StructuredOutput,
)
from orchestrator.metrics import FrontendMetrics
from orchestrator.pools import ReplicaView
from orchestrator.request_path import RequestPath, RequestTrace
from orchestrator.routing.base import RouteDecision, RouteKind, RouteReason

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "sglang"
OUTPUTS = json.loads((FIXTURES / "outputs.json").read_text())

MODEL = ModelConfig(
    name="llama", source="meta-llama/Llama-3.1-8B-Instruct", max_model_len=16384, dtype="bfloat16", seed=3
)
KV = KVCacheConfig(block_size=16)
PROMPT = tuple(range(1, 10))

# What the checks below hand to SGLang's own code.
ENGINE = SglangEngineConfig(
    kind="sglang",
    mem_fraction_static=0.85,
    chunked_prefill_size=8192,
    ib_device="mlx5_0",
    server_args={
        "attention_backend": "fa3",
        "incremental_streaming_output": True,
        "enable_deterministic_inference": True,
    },
)
PORTS = EnginePorts(server=31000, bootstrap=28999, kv_events=25557, kv_events_replay=25558)
SERVER_ARGS = {
    "prefill": server_args_kwargs(
        EngineSpec(MODEL, KV, ENGINE, EngineRole.PREFILL, "10.0.0.5", NetworkConfig(), publish_kv_events=True), PORTS
    ),
    "decode": server_args_kwargs(
        EngineSpec(MODEL, KV, ENGINE, EngineRole.DECODE, "10.0.0.6", NetworkConfig()), EnginePorts(server=31001)
    ),
    "aggregated": server_args_kwargs(
        EngineSpec(
            MODEL,
            KVCacheConfig(enable_prefix_caching=False),
            SglangEngineConfig(kind="sglang"),
            EngineRole.AGGREGATED,
            "10.0.0.7",
            NetworkConfig(),
        ),
        EnginePorts(server=31002),
    ),
    # model.lora: SGLang's adapter limits, adapters loaded at run time.
    "lora": server_args_kwargs(
        EngineSpec(
            MODEL.model_copy(update={"lora": LoraConfig(max_loras=2, max_lora_rank=16, max_cpu_loras=4)}),
            KV,
            SglangEngineConfig(kind="sglang"),
            EngineRole.AGGREGATED,
            "10.0.0.8",
            NetworkConfig(),
        ),
        EnginePorts(server=31003),
    ),
}
TAG = '{"type": "structural_tag", "format": {"type": "const_string", "value": "hi"}}'
SAMPLING = {
    "every_field": SamplingSpec(
        max_tokens=32,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        min_p=0.1,
        seed=7,
        stop=("\n\n",),
        stop_token_ids=(128009,),
        ignore_eos=True,
        min_tokens=2,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        repetition_penalty=1.1,
    ),
    "defaults": SamplingSpec(max_tokens=4),
    "greedy": SamplingSpec(max_tokens=4, temperature=0.0),
    "out_of_range": SamplingSpec(max_tokens=4, repetition_penalty=3.0),
    "choice": SamplingSpec(
        max_tokens=4, logit_bias=((5, 1.5),), structured=StructuredOutput(StructuredKind.CHOICE, ("yes", "a.b"))
    ),
    "json_schema": SamplingSpec(max_tokens=4, structured=StructuredOutput(StructuredKind.JSON, '{"type": "object"}')),
    "structural_tag": SamplingSpec(max_tokens=4, structured=StructuredOutput(StructuredKind.STRUCTURAL_TAG, TAG)),
}
# Requests asking for log-probabilities, whose streams SGLang's own tokenizer-manager code builds.
LOGPROBS = {
    "top_2_and_prompt_1": SamplingSpec(max_tokens=4, logprobs=2, prompt_logprobs=1),
    "sampled_only": SamplingSpec(max_tokens=4, logprobs=0),
    "asked_tokens": SamplingSpec(max_tokens=4, logprobs=1, logprob_token_ids=(101, 107)),
}


@pytest.fixture(scope="module")
def sglang_code() -> dict:
    """tests/fixtures/sglang/sglang_code.py's answer for SERVER_ARGS and SAMPLING."""
    request = {
        "server_args": list(SERVER_ARGS.values()),
        "sampling_params": [sampling_params(spec) for spec in SAMPLING.values()],
        "logprob_kwargs": [logprob_kwargs(spec) for spec in LOGPROBS.values()],
    }
    run = subprocess.run(
        [sys.executable, str(FIXTURES / "sglang_code.py")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert run.returncode == 0, f"SGLang's code did not run (scripts/setup.sh installs it):\n{run.stderr[-3000:]}"
    answer = json.loads(run.stdout.splitlines()[-1])
    answer["server_args"] = dict(zip(SERVER_ARGS, answer["server_args"]))
    answer["sampling_params"] = dict(zip(SAMPLING, answer["sampling_params"]))
    answer["logprob_streams"] = dict(zip(LOGPROBS, answer["logprob_streams"]))
    return answer


def _request(**sampling) -> EngineRequest:
    return EngineRequest("req-1", PROMPT, SamplingSpec(max_tokens=16, **sampling))


def _info(role: EngineRole, host: str = "10.0.0.5", bootstrap_port: int | None = 8998) -> EngineInfo:
    return engine_info(
        role,
        "0.0.0",
        f"engine-{role.value}",
        MODEL,
        KV,
        host,
        EnginePorts(server=30000, bootstrap=bootstrap_port if role is EngineRole.PREFILL else None),
        {"max_total_num_tokens": 160_000},
    )


def _rendezvous(room: int = 42) -> KVTransfer:
    return rendezvous_transfer(_info(EngineRole.PREFILL), len(PROMPT), room)


def test_the_sglang_checked_is_the_pinned_one(sglang_code):
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["sglang"]
    assert f"sglang=={sglang_code['version']}" in extra


# -- ServerArgs ------------------------------------------------------------------


def test_server_args_for_each_role():
    assert SERVER_ARGS["prefill"] == {
        "model_path": "meta-llama/Llama-3.1-8B-Instruct",
        "tokenizer_path": "meta-llama/Llama-3.1-8B-Instruct",
        "served_model_name": "llama",
        "dtype": "bfloat16",
        "context_length": 16384,
        "random_seed": 3,
        "page_size": 16,
        "disable_radix_cache": False,
        "tp_size": 1,
        "host": "10.0.0.5",
        "port": 31000,
        "disaggregation_mode": "prefill",
        "disaggregation_transfer_backend": "nixl",
        "disaggregation_ib_device": "mlx5_0",
        "disaggregation_bootstrap_port": 28999,
        "kv_events_config": json.dumps(
            {"publisher": "zmq", "endpoint": "tcp://*:25557", "replay_endpoint": "tcp://*:25558", "topic": "kv"}
        ),
        "mem_fraction_static": 0.85,
        "chunked_prefill_size": 8192,
        "attention_backend": "fa3",
        "incremental_streaming_output": True,
        "enable_deterministic_inference": True,
    }
    decode = SERVER_ARGS["decode"]
    assert decode["disaggregation_mode"] == "decode" and "disaggregation_bootstrap_port" not in decode
    assert "kv_events_config" not in decode
    agg = SERVER_ARGS["aggregated"]
    assert agg["disaggregation_mode"] == "null" and agg["disable_radix_cache"] is True
    assert "disaggregation_transfer_backend" not in agg and "mem_fraction_static" not in agg


def test_sglangs_server_args_take_what_the_adapter_sets(sglang_code):
    """ServerArgs(**kwargs) as sglang.Engine builds it; kv_events_config as SGLang's KVEventsConfig."""
    answers = sglang_code["server_args"]
    assert all(answer["ok"] for answer in answers.values()), answers


def test_server_args_fields_are_the_installed_sglangs(sglang_code):
    real = frozenset(sglang_code["server_args_fields"])
    assert server_args_fields() == real
    assert RECORDED_SERVER_ARGS_FIELDS <= real
    with pytest.raises(ValueError, match=r"\['cuda_graph_max_bs', 'stream_output'\]"):
        check_server_args(
            SglangEngineConfig(kind="sglang", server_args={"stream_output": True, "cuda_graph_max_bs": 8}), real
        )


def test_lora_on_sglang_loads_each_adapter_once_and_names_it_per_request(sglang_code):
    """SGLang's own code: ServerArgs takes the adapter limits; `async_load_lora_adapter(lora_name, lora_path)`
    loads one at run time and `lora_path` names it in a request. The engine loads an adapter once, before its
    first request; a refusal is the request's 400 and the next request tries again."""
    lora = SERVER_ARGS["lora"]
    assert (lora["enable_lora"], lora["max_loras_per_batch"], lora["max_lora_rank"]) == (True, 3, 16)
    assert lora["lora_target_modules"] == ["all"] and lora["max_loaded_loras"] == 5
    assert {"lora_name", "lora_path"} <= set(sglang_code["async_load_lora_adapter"])
    assert "lora_path" in sglang_code["async_generate"]

    fake = FakeSglang(OUTPUTS["cumulative_stream"], refuse={"broken"})
    engine = _engine(EngineRole.AGGREGATED, fake)
    adapter = LoraAdapter("sql", "/loras/sql")
    for _ in range(2):
        _collect(engine, replace(_request(), lora=adapter))
    assert fake.loads == [("sql", "/loras/sql")]
    assert [c.get("lora_path") for c in fake.calls] == ["sql", "sql"]
    for _ in range(2):
        with pytest.raises(EngineRequestRejected, match="LoRA adapter 'broken' cannot be loaded: .*bad weights"):
            _collect(engine, replace(_request(), lora=LoraAdapter("broken", "/loras/broken")))
    assert fake.loads[1:] == [("broken", "/loras/broken")] * 2 and len(fake.calls) == 2


def test_a_prefill_engine_needs_a_bootstrap_port():
    with pytest.raises(ValueError, match="bootstrap"):
        server_args_kwargs(
            EngineSpec(MODEL, KV, SglangEngineConfig(kind="sglang"), EngineRole.PREFILL, "h", NetworkConfig()),
            EnginePorts(server=1),
        )


def test_prefill_replicas_on_one_node_never_share_a_bootstrap_port():
    """Replicas starting together can draw the same candidates (here: the
    same seed); each still gets its own bootstrap port, drawn as the other
    engine ports are."""
    drawn = [
        draw_ports("127.0.0.1", EngineRole.PREFILL, publish_kv_events=True, rng=random.Random(0)) for _ in range(4)
    ]
    try:
        bootstrap = [ports.bootstrap for ports, _ in drawn]
        assert [reservation.port for _, reservation in drawn] == bootstrap and len(set(bootstrap)) == 4
        ephemeral = ephemeral_ports()
        assert all(port >= FIRST_LISTEN_PORT and port not in ephemeral for port in bootstrap)
    finally:
        for _, reservation in drawn:
            reservation.release()
    ports, released_again = draw_ports("127.0.0.1", EngineRole.PREFILL, False, random.Random(0))
    released_again.release()
    assert ports.bootstrap == bootstrap[0]  # a replica that shut down gave its port back
    decode, none = draw_ports("127.0.0.1", EngineRole.DECODE, publish_kv_events=False)
    assert decode.bootstrap is None and decode.kv_events is None and none is None


# -- requests ----------------------------------------------------------------------


def test_sampling_params_use_sglang_names():
    assert sampling_params(SAMPLING["every_field"]) == {
        "max_new_tokens": 32,
        "min_new_tokens": 2,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.1,
        "ignore_eos": True,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "repetition_penalty": 1.1,
        "stop": ["\n\n"],
        "stop_token_ids": [128009],
        "sampling_seed": 7,
    }
    plain = sampling_params(SAMPLING["defaults"])
    assert plain["top_k"] == -1 and not {"stop", "stop_token_ids", "sampling_seed"} & set(plain)


def test_constraints_and_logit_bias_use_sglang_names():
    assert sampling_params(SAMPLING["choice"])["regex"] == r"(yes|a\.b)"
    assert sampling_params(SAMPLING["choice"])["logit_bias"] == {"5": 1.5}
    assert sampling_params(SAMPLING["json_schema"])["json_schema"] == '{"type": "object"}'
    grammar = SamplingSpec(max_tokens=4, structured=StructuredOutput(StructuredKind.GRAMMAR, "root ::= 'a'"))
    assert sampling_params(grammar)["ebnf"] == "root ::= 'a'"


def test_sglang_accepts_the_constraints_as_sent(sglang_code):
    """SGLang's own SamplingParams keeps each constraint under the name we send."""
    answers = sglang_code["sampling_params"]
    assert answers["choice"]["params"]["regex"] == r"(yes|a\.b)"
    assert answers["json_schema"]["params"]["json_schema"] == '{"type": "object"}'
    assert answers["structural_tag"]["params"]["structural_tag"] == TAG


def test_vllms_grammar_options_are_refused_on_sglang():
    fake = FakeSglang(OUTPUTS["cumulative_stream"])
    engine = _engine(EngineRole.AGGREGATED, fake)
    spec = StructuredOutput(StructuredKind.JSON, '{"type": "object"}', disable_any_whitespace=True)
    with pytest.raises(EngineRequestRejected, match="disable_any_whitespace"):
        _collect(engine, _request(structured=spec))
    assert fake.calls == []  # refused before SGLang saw it


def test_sglang_reads_the_sampling_params_as_meant(sglang_code):
    """SGLang's SamplingParams built, normalized and verified as its tokenizer
    manager does; a seed is kept (used only in deterministic mode: README)."""
    answers = sglang_code["sampling_params"]
    full = answers["every_field"]["params"]
    assert {
        k: full[k]
        for k in (
            "max_new_tokens",
            "min_new_tokens",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "ignore_eos",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "stop_strs",
            "stop_token_ids",
            "sampling_seed",
        )
    } == {
        "max_new_tokens": 32,
        "min_new_tokens": 2,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.1,
        "ignore_eos": True,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "repetition_penalty": 1.1,
        "stop_strs": ["\n\n"],
        "stop_token_ids": [128009],
        "sampling_seed": 7,
    }
    defaults = answers["defaults"]["params"]
    assert defaults["top_k"] == 1 << 30 and defaults["sampling_seed"] is None  # top_k -1: the whole vocabulary
    assert answers["greedy"]["params"]["top_k"] == 1  # temperature 0: greedy
    assert answers["out_of_range"] == {"ok": False, "error": answers["out_of_range"]["error"]}
    assert answers["out_of_range"]["error"].startswith("ValueError: repetition_penalty")  # the adapter's 400


def test_generate_kwargs_carry_the_rendezvous(sglang_code):
    room = random.Random(0).getrandbits(BOOTSTRAP_ROOM_BITS)
    request = _request().for_decode("d0", _rendezvous(room=room))
    kwargs = generate_kwargs(request, "req-1-abc", stream=True)
    assert set(kwargs) <= set(sglang_code["async_generate"])  # Engine.async_generate's parameters
    assert {k: kwargs[k] for k in ("bootstrap_host", "bootstrap_port", "bootstrap_room")} == {
        "bootstrap_host": "10.0.0.5",
        "bootstrap_port": 8998,
        "bootstrap_room": room,
    }
    # SGLang keeps rooms in an int64 (or uint64) buffer (srt/disaggregation/utils.py).
    assert 0 <= room < 2**63
    assert kwargs["input_ids"] == list(PROMPT) and kwargs["rid"] == "req-1-abc" and kwargs["stream"] is True
    assert not {"bootstrap_host", "bootstrap_room"} & set(generate_kwargs(_request(), "r", stream=False))
    assert "rid" in sglang_code["abort_request"]  # TokenizerManager.abort_request(rid=...)


def test_slo_classes_reach_sglang_as_its_priority_lower_values_first(sglang_code):
    """With classes (priority scheduling), each request carries its class's priority and the server schedules
    lower values first, vLLM's rule (SGLang's own default is the reverse); without, neither is sent."""
    request = replace(_request(), priority=10)
    kwargs = generate_kwargs(request, "r", stream=True, priority_scheduling=True)
    assert kwargs["priority"] == 10 and set(kwargs) <= set(sglang_code["async_generate"])
    assert "priority" not in generate_kwargs(request, "r", stream=True)
    spec = EngineSpec(MODEL, KV, ENGINE, EngineRole.DECODE, "10.0.0.6", NetworkConfig(), priority_scheduling=True)
    args = server_args_kwargs(spec, EnginePorts(server=31001))
    assert args["enable_priority_scheduling"] is True and args["schedule_low_priority_values_first"] is True
    assert "enable_priority_scheduling" not in SERVER_ARGS["decode"]


def test_a_transfer_that_is_no_rendezvous_is_rejected():
    vllm_style = KVTransfer("e", 1, 9, {"remote_block_ids": [[1]]})
    with pytest.raises(EngineRequestRejected, match="rendezvous"):
        generate_kwargs(_request().for_decode(None, vllm_style), "r", stream=True)


# -- outputs -------------------------------------------------------------------------


def _chunks(stream: list[dict], mode: StreamMode, request: EngineRequest) -> list[EngineChunk]:
    decoder = ChunkDecoder(request, mode)
    return [c for c in (decoder.feed(parse_output(o)) for o in stream) if c is not None]


@pytest.mark.parametrize(
    "name, mode", [("cumulative_stream", StreamMode.CUMULATIVE), ("incremental_stream", StreamMode.INCREMENTAL)]
)
def test_each_stream_mode_becomes_deltas(name, mode):
    stream = OUTPUTS[name]
    chunks = _chunks(stream, mode, _request(stop_token_ids=()))
    final = stream[-1]
    incremental = mode is StreamMode.INCREMENTAL
    all_ids = [t for o in stream for t in o["output_ids"]] if incremental else final["output_ids"]
    all_text = "".join(o["text"] for o in stream) if incremental else final["text"]
    assert [t for c in chunks for t in c.token_ids] == all_ids
    assert "".join(c.text for c in chunks) == all_text
    assert [c.finished for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[0].num_prompt_tokens == 9 and all(c.num_prompt_tokens == 0 for c in chunks[1:])
    assert chunks[0].num_cached_tokens == stream[0]["meta_info"]["cached_tokens"]


def test_stream_mode_follows_the_server_args():
    assert stream_mode({}) is StreamMode.CUMULATIVE
    assert stream_mode({"incremental_streaming_output": True}) is StreamMode.INCREMENTAL


def test_finish_reasons_and_stop_reasons(sglang_code):
    reasons = sglang_code["finish_reasons"]
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


def test_aborts_raise_by_whose_fault_they_are(sglang_code):
    reasons = sglang_code["finish_reasons"]

    def feed(finish):
        out = {"text": "", "output_ids": [], "meta_info": {"prompt_tokens": 9, "finish_reason": finish}}
        return ChunkDecoder(_request()).feed(parse_output(out))

    with pytest.raises(EngineRequestRejected, match="exceeds"):
        feed(reasons["abort_bad_request"])
    with pytest.raises(EngineError, match="kvcache"):
        feed(reasons["abort_transfer_failed"])
    with pytest.raises(EngineError, match="Aborted"):
        feed(reasons["abort_default"])


# -- log-probabilities -------------------------------------------------------------------


def _token_texts(token_ids):
    return [f"<{t}>" for t in token_ids]


def _logprob_chunks(sglang_code: dict, name: str, mode: str) -> list[EngineChunk]:
    """SGLang's stream for LOGPROBS[name] in `mode`, through the adapter's decoder."""
    stream = sglang_code["logprob_streams"][name][mode]
    decoder = ChunkDecoder(EngineRequest("req-1", PROMPT, LOGPROBS[name]), StreamMode(mode), _token_texts)
    return [c for c in (decoder.feed(parse_output(o)) for o in stream) if c is not None]


def _scored(positions) -> list[list[tuple[int, float, int | None]] | None]:
    return [None if p is None else [(c.token_id, c.logprob, c.rank) for c in p.candidates] for p in positions]


def test_logprob_arguments_are_async_generates(sglang_code):
    for spec in LOGPROBS.values():
        assert set(logprob_kwargs(spec)) <= set(sglang_code["async_generate"])
    assert logprob_kwargs(LOGPROBS["top_2_and_prompt_1"]) == {
        "return_logprob": True,
        "top_logprobs_num": 2,  # one number for the output's and the prompt's: the larger, each trimmed
        "logprob_start_len": 0,
    }
    assert logprob_kwargs(LOGPROBS["asked_tokens"])["token_ids_logprob"] == [101, 107]
    assert logprob_kwargs(SamplingSpec(max_tokens=4)) == {}


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
def test_output_logprobs_in_vllms_order_from_either_stream_mode(sglang_code, mode):
    """Sampled token first (with its rank where SGLang's top list has it), then the top `logprobs` less
    it; the token SGLang sampled from outside its top list has no rank. Each chunk scores its own tokens."""
    chunks = _logprob_chunks(sglang_code, "top_2_and_prompt_1", mode)
    assert [len(c.logprobs) for c in chunks] == [len(c.token_ids) for c in chunks] == [1, 2, 1]
    positions = [p for c in chunks for p in c.logprobs]
    assert [p.sampled.token_id for p in positions] == [t for c in chunks for t in c.token_ids] == [108, 106, 120, 101]
    assert _scored(positions) == [
        [(108, -1.33, 1), (101, -1.51, 2)],
        [(106, -1.56, 2), (102, -1.27, 1)],
        [(120, -2.95, None), (107, -1.32, 1), (100, -1.5, 2)],
        [(101, -1.26, 1), (105, -1.55, 2)],
    ]
    assert positions[0].sampled.token == "<108>"  # named by the engine's tokenizer


@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
def test_prompt_logprobs_come_in_the_first_chunk_trimmed_to_their_own_number(sglang_code, mode):
    first, *rest = _logprob_chunks(sglang_code, "top_2_and_prompt_1", mode)
    assert _scored(first.prompt_logprobs) == [
        None,  # the first prompt token, as vLLM
        [(101, -1.76, None), (104, -1.29, 1)],
        [(102, -1.52, 2), (109, -1.34, 1)],  # rank 2 in the top 2 SGLang sent, listed past the 1 asked
        [(103, -1.28, 1)],
    ]
    assert all(c.prompt_logprobs is None for c in rest)


def test_the_sampled_token_alone_and_asked_tokens_in_place_of_the_top(sglang_code):
    sampled = [p for c in _logprob_chunks(sglang_code, "sampled_only", "cumulative") for p in c.logprobs]
    assert [len(p.candidates) for p in sampled] == [1, 1, 1, 1]
    asked = [p for c in _logprob_chunks(sglang_code, "asked_tokens", "incremental") for p in c.logprobs]
    assert [[c.token_id for c in p.candidates] for p in asked] == [
        [108, 101, 107],
        [106, 101, 107],
        [120, 101, 107],
        [101, 107],  # the sampled token once
    ]
    assert all(c.rank is None for p in asked for c in p.candidates)


def test_a_stream_short_of_logprobs_is_an_engine_error(sglang_code):
    stream = sglang_code["logprob_streams"]["top_2_and_prompt_1"]["incremental"]
    short = {**stream[1], "meta_info": {**stream[1]["meta_info"], "output_token_logprobs": []}}
    request = EngineRequest("req-1", PROMPT, LOGPROBS["top_2_and_prompt_1"])
    decoder = ChunkDecoder(request, StreamMode.INCREMENTAL, _token_texts)
    decoder.feed(parse_output(stream[0]))
    with pytest.raises(EngineError, match="for 0 of 2 new tokens"):
        decoder.feed(parse_output(short))


def test_prompt_logprobs_of_a_disaggregated_decode_are_refused():
    engine = _engine(EngineRole.DECODE, FakeSglang([]))
    request = EngineRequest("req-1", PROMPT, LOGPROBS["top_2_and_prompt_1"]).for_decode("d0", _rendezvous())
    with pytest.raises(EngineRequestRejected, match="prompt_logprobs"):
        _collect(engine, request)


def test_the_engine_asks_sglang_for_logprobs_and_names_tokens_with_its_tokenizer(sglang_code):
    fake = FakeSglang(sglang_code["logprob_streams"]["top_2_and_prompt_1"]["cumulative"])
    engine = _engine(EngineRole.AGGREGATED, fake)
    chunks = _collect(engine, EngineRequest("req-1", PROMPT, LOGPROBS["top_2_and_prompt_1"]))
    (call,) = fake.calls
    assert (call["return_logprob"], call["top_logprobs_num"], call["logprob_start_len"]) == (True, 2, 0)
    assert chunks[0].logprobs[0].sampled.token == "t108"  # FakeSglang's tokenizer
    assert chunks[0].prompt_logprobs[1].sampled.token == "t101"


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


# -- KV events, as SGLang's recorder and publisher make them (sglang_code.py's kv_batches) ---

PAGE_TOKENS = tuple(range(100, 112))  # three pages of 4 tokens
PAGE_HASHES = (-7001, 7002, 7003)
OTHER_PROMPT = list(range(500, 508))


def _frames(sglang_code: dict, name: str) -> tuple[bytes, bytes]:
    entry = sglang_code["kv_batches"][name]
    return bytes.fromhex(entry["seq_frame_hex"]), bytes.fromhex(entry["payload_hex"])


def _batch(sglang_code: dict, name: str):
    return decode_batch(*_frames(sglang_code, name))


def _hits(index: KVIndex, tokens) -> dict[str, int]:
    return index.overlaps(block_hashes(list(tokens), 4))


def test_the_decoder_knows_every_event_kind_sglang_sends(sglang_code):
    assert kv_event_decoder("sglang") is decode_batch
    assert sglang_code["kv_event_kinds"] == ["AllBlocksCleared", "BlockRemoved", "BlockStored"]


def test_consecutive_pages_come_as_one_event_that_the_index_chains(sglang_code):
    batch = _batch(sglang_code, "stored_pages")
    assert (batch.seq, batch.ts) == (0, 1700000000.5)
    assert batch.events == (BlockStored(PAGE_HASHES, None, PAGE_TOKENS, 4),)
    index = KVIndex()
    index.apply("p0", batch.events)
    assert _hits(index, PAGE_TOKENS) == {"p0": 3}


def test_a_salted_prompts_pages_are_found_only_under_its_salt(sglang_code):
    """SGLang sends the salt on each page of a salted prompt; the index chains them from the salt's root,
    so only a request with the same salt is routed towards them (SGLang's radix cache keeps them apart)."""
    (stored,) = _batch(sglang_code, "salted_pages").events
    assert stored == BlockStored((9001, 9002, 9003), None, PAGE_TOKENS, 4, cache_salt="tenant-a")
    index = KVIndex()
    index.apply("p0", [stored])
    assert index.overlaps(block_hashes(list(PAGE_TOKENS), 4, prefix_root("tenant-a"))) == {"p0": 3}
    assert _hits(index, PAGE_TOKENS) == {}
    assert index.overlaps(block_hashes(list(PAGE_TOKENS), 4, prefix_root("tenant-b"))) == {}


def test_the_engine_gives_sglang_the_requests_salt(sglang_code):
    salted = generate_kwargs(replace(_request(), cache_salt="tenant-a"), "rid-1", stream=True)
    assert salted["cache_salt"] == "tenant-a" and "cache_salt" in sglang_code["async_generate"]
    assert "cache_salt" not in generate_kwargs(_request(), "rid-1", stream=True)


def test_a_block_held_only_in_host_memory_is_no_hit(sglang_code):
    index = KVIndex()
    index.apply("p0", _batch(sglang_code, "stored_pages").events)
    backed_up_then_evicted = _batch(sglang_code, "backed_up_then_evicted")
    assert backed_up_then_evicted.events == (BlockRemoved((7003,)),)  # the CPU_PINNED copies are skipped
    index.apply("p0", backed_up_then_evicted.events)
    assert _hits(index, PAGE_TOKENS) == {"p0": 2}
    host_only = _batch(sglang_code, "host_only")
    assert host_only.events == ()  # a host copy removed (its GPU copy stays), another prefix stored on host
    index.apply("p0", host_only.events)
    assert _hits(index, PAGE_TOKENS) == {"p0": 2} and _hits(index, OTHER_PROMPT) == {}


def test_removed_and_cleared(sglang_code):
    assert _batch(sglang_code, "removed_and_cleared").events == (BlockRemoved((7002,)), AllBlocksCleared())


def test_bigram_pages_are_indexed_by_their_own_tokens(sglang_code):
    assert _batch(sglang_code, "bigram_pages").events == (BlockStored(PAGE_HASHES, None, PAGE_TOKENS, 4),)


def test_an_unknown_event_kind_is_counted_and_resyncs_the_replica_never_a_wrong_hit(sglang_code):
    """The subscriber counts a MalformedEvents batch and drops it; the gap it
    leaves, not filled by replay, clears the replica's blocks."""
    with pytest.raises(MalformedEvents, match="BlockPinned"):
        _batch(sglang_code, "unknown_kind")
    ingest = KVEventIngest(KVIndex())
    assert ingest.on_batch("p0", _batch(sglang_code, "stored_pages")).action is Action.APPLIED
    after_the_dropped_one = replace(_batch(sglang_code, "host_only"), seq=2)
    assert ingest.on_batch("p0", after_the_dropped_one).action is Action.REPLAY
    outcome = ingest.on_batch("p0", after_the_dropped_one, can_replay=False)
    assert (outcome.action, outcome.resync) == (Action.RESYNCED, ResyncReason.GAP)
    assert _hits(ingest.index, PAGE_TOKENS) == {}


def test_vllms_decoder_reads_sglang_payloads_but_not_bigram_pages(sglang_code):
    """The two engines now send the same event shape; each keeps its decoder
    for what the other lacks (SGLang's bigram pages, vLLM's KV groups)."""
    from orchestrator.engines.vllm_kv_events import decode_batch as vllm_decode

    for name in ("stored_pages", "backed_up_then_evicted", "host_only", "removed_and_cleared"):
        assert vllm_decode(*_frames(sglang_code, name)) == _batch(sglang_code, name)
    with pytest.raises(MalformedEvents):
        vllm_decode(*_frames(sglang_code, "bigram_pages"))


def test_garbage_and_the_old_array_shape_are_malformed():
    with pytest.raises(MalformedEvents):
        decode_batch(bytes(8), b"\xc1not msgpack")
    with pytest.raises(MalformedEvents):
        decode_batch(bytes(8), msgspec.msgpack.encode({"a": 1}))
    with pytest.raises(MalformedEvents):  # events as arrays: SGLang before its events became tagged maps
        decode_batch(bytes(8), msgspec.msgpack.encode([2.0, [["BlockRemoved", [3]]]]))


# -- registration and config validation -------------------------------------------------


def _pool(**engine) -> PoolConfig:
    return PoolConfig(engine={"kind": "sglang", **engine})


def test_unknown_server_args_fail_the_engine_check():
    check_engine_config(_pool(server_args={"attention_backend": "fa3", "max_total_tokens": 1000}))
    with pytest.raises(ValueError, match=r"\['atention_backend'\]"):
        check_engine_config(_pool(server_args={"atention_backend": "fa3"}))
    with pytest.raises(ValueError, match="no field"):
        check_server_args(SglangEngineConfig(kind="sglang", server_args={"x": 1}), frozenset({"y"}))


def test_server_args_may_not_override_what_the_adapter_sets():
    """The keys the adapter writes, for every role with every option set, are the ones `server_args`
    may not name: the check and the translation cannot drift apart."""
    written = set().union(*(set(kwargs) - set(ENGINE.server_args) for kwargs in SERVER_ARGS.values()))
    max_running = server_args_kwargs(
        EngineSpec(
            MODEL,
            KV,
            SglangEngineConfig(kind="sglang", max_running_requests=8),
            EngineRole.DECODE,
            "h",
            NetworkConfig(),
            priority_scheduling=True,
        ),
        EnginePorts(server=1),
    )
    written |= set(max_running)
    assert written | {"skip_tokenizer_init"} == OWNED_SERVER_ARGS
    for key in ("page_size", "max_running_requests", "skip_tokenizer_init"):
        with pytest.raises(ValueError, match=rf"server_args may not set \['{key}'\]"):
            check_engine_config(_pool(server_args={key: 1}))


def test_process_env_maps_the_handshake_timeout():
    from orchestrator.config import AppConfig

    app = AppConfig(model=MODEL, decode_pool=_pool(), network=NetworkConfig(kv_handshake_timeout_s=60))
    assert process_env(app, app.decode_pool) == {
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "60",
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "60",
    }
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

            async def prefill(self, request: EngineRequest, view=None) -> PrefillResult:
                pools.prefills.append(request)
                assert request.kv_transfer is not None, "an SGLang prefill needs the rendezvous"
                if request.target_replica in pools.stalled_prefills:
                    await asyncio.sleep(3600)
                await asyncio.sleep(0.01)  # decode is already waiting in the room
                if request.target_replica in pools.failing_prefills:
                    raise RuntimeError("prefill replica died")
                pools._room(request).set()
                return PrefillResult(request.kv_transfer, len(request.prompt_token_ids), 0, request.target_replica)

            def generate(self, request, view=None):
                raise AssertionError("prefill replicas do not decode")

        return Prefill()

    def decode_pool(self):
        pools = self

        class Decode:
            name = "decode_pool"

            def replicas(self):
                return [ReplicaView(r, _info(EngineRole.DECODE)) for r in pools.decode_ids]

            async def prefill(self, request, view=None):
                raise AssertionError

            async def generate(self, request: EngineRequest, view=None) -> AsyncIterator[EngineChunk]:
                pools.decodes.append(request)
                try:
                    if request.kv_transfer is None:
                        raise EngineRequestRejected("Disaggregated request received without bootstrap room id")
                    await pools._room(request).wait()
                    already = len(request.prompt_token_ids) - len(PROMPT)
                    for i in range(request.sampling.max_tokens):
                        if (
                            pools.decode_fails_after is not None
                            and already + i == pools.decode_fails_after
                            and len(pools.decodes) == 1
                        ):
                            raise RuntimeError("decode replica died")
                        yield EngineChunk(
                            (1000 + already + i,),
                            f"t{already + i} ",
                            FinishReason.LENGTH if i == request.sampling.max_tokens - 1 else None,
                            num_prompt_tokens=len(request.prompt_token_ids) if i == 0 else 0,
                            num_cached_tokens=len(request.prompt_token_ids) if i == 0 else 0,
                        )
                finally:
                    pools.closed.append(request.request_id)

        return Decode()


class FixedScheduler:
    def __init__(self, route: RouteDecision) -> None:
        self.route = route

    def route_request(self, request, prefill_replicas, decode_replicas, blocks=None):
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
    path = RequestPath(
        pools.decode_pool(),
        pools.prefill_pool(),
        FixedScheduler(route),
        metrics,
        prefill_timeout_s=kwargs.pop("prefill_timeout_s", 5.0),
        rng=random.Random(0),
        **kwargs,
    )
    return path, metrics


def _run(
    path: RequestPath, max_tokens: int = 4, spec: SamplingSpec | None = None
) -> tuple[list[EngineChunk], RequestTrace]:
    trace = RequestTrace()
    request = EngineRequest("req-1", PROMPT, spec or SamplingSpec(max_tokens=max_tokens))

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
    assert decode.kv_transfer.engine_params == {
        "bootstrap_host": "host-p0",
        "bootstrap_port": 8998,
        "bootstrap_room": room,
    }
    assert prefill.target_replica == "p0" and prefill.sampling.max_tokens == 1 and decode.target_replica == "d0"
    assert trace.prefill is not None and trace.fallback is None
    assert _metric(metrics, "orchestrator_kv_handoffs_total") == 1


def test_the_prefill_half_samples_the_first_token_as_the_request_asks():
    """SGLang's decode engine continues from the token the prefill engine sampled (its grammar accepts it,
    its log-probabilities come with it): the prefill half carries the constraint and the log-probabilities
    asked, and may not end at EOS before min_tokens; the prompt's log-probabilities are not its to give."""
    pools = RendezvousPools()
    path, _ = _path(pools)
    constraint = StructuredOutput(StructuredKind.JSON_OBJECT)
    spec = SamplingSpec(max_tokens=4, min_tokens=3, logprobs=2, logprob_token_ids=(7,), structured=constraint)
    chunks, _ = _run(path, spec=spec)
    assert len(chunks) == 4
    (prefill,), (decode,) = pools.prefills, pools.decodes
    assert decode.sampling == spec
    assert prefill.sampling == replace(spec, max_tokens=1, min_tokens=1)
    aggregated = replace(spec, prompt_logprobs=1, min_tokens=0)
    assert EngineRequest("r", PROMPT, aggregated).for_prefill("p0", samples_first_token=True).sampling == replace(
        aggregated, max_tokens=1, prompt_logprobs=None
    )


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


class FakeTokenizer:
    def batch_decode(self, sequences: list[list[int]]) -> list[str]:
        return ["".join(f"t{t}" for t in ids) for ids in sequences]


class FakeTokenizerManager:
    def __init__(self) -> None:
        self.aborted: list[str] = []
        self.tokenizer = FakeTokenizer()

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.aborted.append(rid)


@dataclass
class LoadResult:
    """SGLang's LoadLoRAAdapterReqOutput, the fields the adapter reads."""

    success: bool
    error_message: str | None = None


class FakeSglang:
    """`async_generate(**kwargs)`: with stream=True an async iterator of
    output dicts, else one dict (sglang/srt/entrypoints/engine.py);
    `async_load_lora_adapter`, refusing the names in `refuse`."""

    def __init__(self, outputs: list[dict], error: Exception | None = None, refuse: set[str] = frozenset()) -> None:
        self.outputs = outputs
        self.error = error
        self.calls: list[dict] = []
        self.tokenizer_manager = FakeTokenizerManager()
        self.refuse = refuse
        self.loads: list[tuple[str, str]] = []

    async def async_load_lora_adapter(self, lora_name: str, lora_path: str, pinned: bool = False):
        self.loads.append((lora_name, lora_path))
        if lora_name in self.refuse:
            return LoadResult(False, f"Failed to load LoRA adapter {lora_name}: bad weights")
        return LoadResult(True)

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

    engine = SglangEngine(EngineSpec(MODEL, KV, SglangEngineConfig(kind="sglang"), role, "127.0.0.1", NetworkConfig()))
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


def test_an_aborted_transfer_is_an_engine_error_and_a_failed_transfer(sglang_code):
    failed = sglang_code["finish_reasons"]["abort_transfer_failed"]
    aborted = {
        "text": "",
        "output_ids": [],
        "meta_info": {"prompt_tokens": 9, "completion_tokens": 0, "cached_tokens": 0, "finish_reason": failed},
    }
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
