"""SGLang's engine settings from ours: one replica's `sglang.Engine` keyword arguments (= ServerArgs
fields), its ports, the environment its process needs, and the build-time checks of `server_args`."""

from __future__ import annotations

import functools
import json
import random
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from orchestrator.config import LoraConfig, NetworkConfig, SglangEngineConfig
from orchestrator.engines.adapter import EngineSpec, PlannerInputs
from orchestrator.engines.base import (
    EngineRole,
)
from orchestrator.engines.ports import PortReservation, listen_port, reserve_listen_port
from orchestrator.engines.sglang_kv_events import events_config

ENGINE_KIND = "sglang"
# ServerArgs.disaggregation_mode by role.
_DISAGGREGATION_MODE = {EngineRole.PREFILL: "prefill", EngineRole.DECODE: "decode", EngineRole.AGGREGATED: "null"}
# Environment variables SGLang's disaggregation reads (seconds): how long a
# prefill engine waits for its decode peer, and a decode engine for the KV.
BOOTSTRAP_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"
WAITING_TIMEOUT_ENV = "SGLANG_DISAGGREGATION_WAITING_TIMEOUT"


# -- configuration -------------------------------------------------------------


@dataclass(frozen=True)
class EnginePorts:
    """Ports one replica's engine listens on, chosen before it starts."""

    server: int  # ServerArgs.port: SGLang derives its internal ports from it
    bootstrap: int | None = None  # prefill only: the rendezvous server
    kv_events: int | None = None  # ZMQ PUB; None: not publishing
    kv_events_replay: int | None = None  # ZMQ ROUTER


def draw_ports(
    host: str, role: EngineRole, publish_kv_events: bool, rng: random.Random | None = None
) -> tuple[EnginePorts, PortReservation | None]:
    """One replica's ports, drawn as `ports.listen_port` draws them. A prefill
    replica's bootstrap port is also reserved on the node (returned; the
    replica holds it while its engine lives): SGLang's bootstrap server only
    logs a port it cannot bind, and a replica that lost its port would then
    register with another replica's server and mix their requests."""
    bootstrap = reserve_listen_port(host, rng) if role is EngineRole.PREFILL else None
    ports = EnginePorts(
        server=listen_port(host, rng),
        bootstrap=bootstrap.port if bootstrap is not None else None,
        kv_events=listen_port(host, rng) if publish_kv_events else None,
        kv_events_replay=listen_port(host, rng) if publish_kv_events else None,
    )
    return ports, bootstrap


def server_args_kwargs(spec: EngineSpec, ports: EnginePorts) -> dict[str, Any]:
    """`sglang.Engine(**kwargs)` (= ServerArgs fields) for one replica.
    Nothing of `spec.network` maps onto ServerArgs: SGLang's transfer engines
    take their own settings (`ib_device`, environment)."""
    model, kv_cache, role, host = spec.model, spec.kv_cache, spec.role, spec.host
    engine: SglangEngineConfig = spec.engine
    kwargs: dict[str, Any] = {
        "model_path": model.weights_source,
        "tokenizer_path": model.tokenizer_source,
        "served_model_name": model.name,
        "dtype": model.dtype,
        "context_length": model.max_model_len,
        "random_seed": model.seed,
        "page_size": kv_cache.block_size,
        "disable_radix_cache": not kv_cache.enable_prefix_caching,
        "tp_size": engine.tensor_parallel_size,
        "host": host,
        "port": ports.server,
        "disaggregation_mode": _DISAGGREGATION_MODE[role],
    }
    if role is not EngineRole.AGGREGATED:
        kwargs["disaggregation_transfer_backend"] = engine.transfer_backend.value
        if engine.ib_device is not None:
            kwargs["disaggregation_ib_device"] = engine.ib_device
    if role is EngineRole.PREFILL:
        if ports.bootstrap is None:
            raise ValueError("a prefill engine needs a bootstrap port")
        kwargs["disaggregation_bootstrap_port"] = ports.bootstrap
    if spec.publish_kv_events:
        if ports.kv_events is None or ports.kv_events_replay is None:
            raise ValueError("publishing KV events needs their ports")
        kwargs["kv_events_config"] = json.dumps(events_config("kv", ports.kv_events, ports.kv_events_replay))
    optional = {
        "mem_fraction_static": engine.mem_fraction_static,
        "max_running_requests": engine.max_running_requests,
        "chunked_prefill_size": engine.chunked_prefill_size,
    }
    kwargs |= {k: v for k, v in optional.items() if v is not None}
    if model.lora is not None:
        kwargs |= lora_kwargs(model.lora)
    if spec.priority_scheduling:  # SLO classes: lower values first, vLLM's rule (SGLang's default is the reverse)
        kwargs |= {"enable_priority_scheduling": True, "schedule_low_priority_values_first": True}
    return kwargs | dict(engine.server_args)


def lora_kwargs(lora: LoraConfig) -> dict[str, Any]:
    """SGLang's adapter limits from model.lora. Adapters are loaded at run time (each engine on its first
    request with one, `async_load_lora_adapter`), so every supported module is a target, as SGLang requires
    without `lora_paths`. Its batch limit counts base-model requests as one adapter more."""
    return {
        "enable_lora": True,
        "max_loras_per_batch": lora.max_loras + 1,
        "max_lora_rank": lora.max_lora_rank,
        "lora_target_modules": ["all"],
        "max_loaded_loras": (lora.max_cpu_loras or lora.max_loras) + 1,
    }


def process_env(engine: SglangEngineConfig, network: NetworkConfig) -> dict[str, str]:
    """Environment a replica process needs before SGLang starts.
    `network.kv_handshake_timeout_s` bounds both of SGLang's disaggregation
    waits; `nixl_progress_delay_us` and `nixl_backends` are our vLLM plugin's
    and vLLM's, with no SGLang counterpart."""
    del engine
    if network.kv_handshake_timeout_s is None:
        return {}
    timeout = str(network.kv_handshake_timeout_s)
    return {BOOTSTRAP_TIMEOUT_ENV: timeout, WAITING_TIMEOUT_ENV: timeout}


# ServerArgs this adapter sets from model, kv_cache and pool settings (`server_args_kwargs`), and
# `skip_tokenizer_init`, which must stay off (the adapter reads SGLang's detokenized text):
# `server_args` may not name them.
OWNED_SERVER_ARGS = frozenset(
    {
        "model_path",
        "tokenizer_path",
        "served_model_name",
        "dtype",
        "context_length",
        "random_seed",
        "page_size",
        "disable_radix_cache",
        "tp_size",
        "host",
        "port",
        "disaggregation_mode",
        "disaggregation_transfer_backend",
        "disaggregation_ib_device",
        "disaggregation_bootstrap_port",
        "kv_events_config",
        "mem_fraction_static",
        "max_running_requests",
        "chunked_prefill_size",
        "skip_tokenizer_init",
        "enable_lora",
        "max_loras_per_batch",
        "max_lora_rank",
        "lora_target_modules",
        "max_loaded_loras",
        "enable_priority_scheduling",
        "schedule_low_priority_values_first",
    }
)


# ServerArgs field names of sglang 0.5.23 (python/sglang/srt/server_args.py and
# the namespaces of srt/arg_groups/fields/): what `server_args` is checked
# against where SGLang is not installed. A subset of the real class;
# tests/unit/test_sglang_adapter.py checks it against the pinned SGLang's.
RECORDED_SERVER_ARGS_FIELDS = OWNED_SERVER_ARGS | frozenset(
    {
        # commonly tuned
        "tokenizer_mode",
        "load_format",
        "trust_remote_code",
        "revision",
        "download_dir",
        "kv_cache_dtype",
        "quantization",
        "chat_template",
        "completion_template",
        "dp_size",
        "pp_size",
        "nnodes",
        "node_rank",
        "dist_init_addr",
        "base_gpu_id",
        "gpu_id_step",
        "max_total_tokens",
        "max_prefill_tokens",
        "max_queued_requests",
        "schedule_policy",
        "schedule_conservativeness",
        "stream_interval",
        "incremental_streaming_output",
        "attention_backend",
        "sampling_backend",
        "grammar_backend",
        "disable_cuda_graph",
        "cuda_graph_max_bs_decode",
        "cuda_graph_max_bs_prefill",
        "enable_torch_compile",
        "enable_mixed_chunk",
        "enable_dp_attention",
        "enable_deterministic_inference",
        "speculative_algorithm",
        "enable_lora",
        "lora_paths",
        "max_loras_per_batch",
        "allow_auto_truncate",
        "preferred_sampling_params",
        "log_level",
        "enable_metrics",
        "enable_trace",
        "watchdog_timeout",
        "skip_server_warmup",
        "tokenizer_worker_num",
        "reasoning_parser",
        "tool_call_parser",
        "enable_hierarchical_cache",
        "hicache_ratio",
        "radix_eviction_policy",
        "weight_version",
    }
)


# Prints the field names of the installed SGLang's ServerArgs (a msgspec
# struct in 0.5.23) as a JSON list, on the last line of its output.
_LIST_SERVER_ARGS_FIELDS = """
import json, msgspec
from sglang.srt.server_args import ServerArgs
print(json.dumps([f.name for f in msgspec.structs.fields(ServerArgs)]))
"""


@functools.cache
def server_args_fields() -> frozenset[str]:
    """Field names of SGLang's ServerArgs: the installed SGLang's, else
    `RECORDED_SERVER_ARGS_FIELDS`. Read in a child process: importing SGLang
    patches transformers and redirects torch's and Triton's caches (process
    environment) in the importing process, which is the caller's, not an
    engine's."""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        return RECORDED_SERVER_ARGS_FIELDS
    listed = subprocess.run(
        [sys.executable, "-c", _LIST_SERVER_ARGS_FIELDS], capture_output=True, text=True, check=False
    )
    if listed.returncode != 0:
        raise RuntimeError(f"cannot read SGLang's ServerArgs fields: {listed.stderr.strip()[-2000:]}")
    return frozenset(json.loads(listed.stdout.splitlines()[-1]))


def check_server_args(engine: SglangEngineConfig, known_fields: frozenset[str]) -> None:
    """Raise ValueError naming any `server_args` key not in `known_fields`."""
    unknown = sorted(set(engine.server_args) - known_fields)
    if unknown:
        raise ValueError(f"engine.server_args: SGLang's ServerArgs has no field(s) {unknown}")


def check_config(engine: SglangEngineConfig) -> None:
    """`server_args` may not name what the adapter sets (`OWNED_SERVER_ARGS`), and is checked against
    the fields of SGLang's ServerArgs where SGLang is installed (GPU machines); elsewhere against
    `RECORDED_SERVER_ARGS_FIELDS` (a subset: a key outside it fails here and may still be valid, so
    check it where SGLang is installed)."""
    owned = sorted(OWNED_SERVER_ARGS & set(engine.server_args))
    if owned:
        raise ValueError(f"server_args may not set {owned}: they come from model/kv_cache/pool settings")
    check_server_args(engine, server_args_fields())


def planner_inputs(engine: SglangEngineConfig) -> PlannerInputs:
    """No running-sequence limit read: SGLang's is `max_running_requests`,
    which the planner has never been given (it assumes 256)."""
    del engine
    return PlannerInputs(max_num_seqs=None)
