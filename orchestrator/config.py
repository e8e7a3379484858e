"""The application's configuration: one pydantic tree, loaded from YAML.

Every model forbids unknown keys, so a typo fails at build time with the
field's path in the message. Nothing is read from the environment here.
"""

from __future__ import annotations

import enum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Tag,
    model_validator,
)

# vLLM's CPU attention backend only accepts block sizes that are multiples of 32.
CPU_BLOCK_SIZE_MULTIPLE = 32


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Device(str, enum.Enum):
    CUDA = "cuda"
    CPU = "cpu"


class ServingMode(str, enum.Enum):
    DISAGGREGATED = "disaggregated"  # prefill pool + decode pool, KV transferred between them
    AGGREGATED = "aggregated"  # one pool does prefill and decode


class LoraAdapterConfig(_Strict):
    name: str = Field(min_length=1, description="What clients send as `model` to use the adapter.")
    source: str = Field(
        min_length=1,
        description="The adapter in PEFT's format: a local directory (absolute, ~ or .; on every replica's node) "
        "or a Hugging Face id, which each engine downloads on first use.",
    )

    @property
    def resolved_source(self) -> str:
        return resolve_source(self.source)


class LoraConfig(_Strict):
    """LoRA adapters of the base model, on every pool (vLLM's --enable-lora and its limits). Engines load an
    adapter on the first request that names it; `POST /v1/load_lora_adapter` adds adapters at run time."""

    max_loras: PositiveInt = Field(
        default=1, description="Adapters one engine batch may mix (vLLM's max_loras): the replica's adapter slots."
    )
    max_lora_rank: PositiveInt = Field(
        default=16, description="The largest rank an adapter may have (vLLM's max_lora_rank); larger ones are a 400."
    )
    max_cpu_loras: PositiveInt | None = Field(
        default=None,
        description="Adapters an engine keeps in host memory, least recently used evicted (vLLM's max_cpu_loras); "
        "None: max_loras.",
    )
    adapters: list[LoraAdapterConfig] = Field(
        default_factory=list, description="Adapters served from the start; never unloaded."
    )

    @model_validator(mode="after")
    def _check(self) -> LoraConfig:
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise ValueError(f"max_cpu_loras ({self.max_cpu_loras}) must be at least max_loras ({self.max_loras})")
        names = [a.name for a in self.adapters]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"adapter names must be unique; repeated: {repeated}")
        return self


class ModelConfig(_Strict):
    name: str = Field(description="Model name clients send in the OpenAI `model` field.")
    source: str = Field(description="Hugging Face repo id, or a local directory (absolute or ~).")
    tokenizer: str | None = Field(default=None, description="Tokenizer source; defaults to `source`.")
    max_model_len: PositiveInt = Field(
        description="Context length in tokens, prompt plus output: the engine's max_model_len (SGLang: "
        "context_length); the frontend refuses prompts that leave no room and clamps max_tokens to what is left.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto",
        description="Weight and activation dtype, passed to vLLM and SGLang as `dtype` (auto: the engine's own "
        "choice); the simulated engine ignores it.",
    )
    seed: int = Field(
        default=0,
        description="The engine's random seed (vLLM's `seed`, SGLang's `random_seed`).",
    )
    tool_call_parser: str | None = Field(
        default=None,
        min_length=1,
        description='The model\'s tool-call format, for tool_choice "auto": one the frontend reads itself '
        "(orchestrator/api/tool_parsers.py) or any of the engine's own (vLLM's --tool-call-parser names; "
        'checked when the app is built); None: "auto" is a 400, as vLLM without --tool-call-parser.',
    )
    reasoning_parser: str | None = Field(
        default=None,
        min_length=1,
        description="The model's thinking format: chat answers carry it apart as `reasoning`, as vLLM's "
        "--reasoning-parser; one the frontend reads itself (orchestrator/api/reasoning_parsers.py) or any of "
        "the engine's own (vLLM's --reasoning-parser names; checked when the app is built).",
    )
    lora: LoraConfig | None = Field(
        default=None, description="LoRA adapters of this model; None: none (a request naming one gets a 404)."
    )

    @model_validator(mode="after")
    def _check_adapter_names(self) -> ModelConfig:
        if self.lora is not None and any(a.name == self.name for a in self.lora.adapters):
            raise ValueError(f"an adapter cannot take the base model's name {self.name!r}")
        return self

    @property
    def tokenizer_source(self) -> str:
        return resolve_source(self.tokenizer or self.source)

    @property
    def weights_source(self) -> str:
        return resolve_source(self.source)


def resolve_source(source: str) -> str:
    """A source starting with `~`, `/` or `.` is a local path; anything else is a
    hub id and is returned unchanged."""
    if source.startswith(("~", "/", ".")):
        return str(Path(source).expanduser().resolve())
    return source


class KVCacheConfig(_Strict):
    block_size: PositiveInt = Field(
        default=16,
        description="Tokens per KV cache block: the engines' block size (vLLM's block_size, SGLang's page_size, the "
        "simulator's) and the unit the frontend's KV index and scheduler count prompts in. CPU engines: a multiple of "
        "32.",
    )
    enable_prefix_caching: bool = Field(
        default=True,
        description="Engines reuse the KV of cached prompt prefixes (vLLM's enable_prefix_caching; false disables "
        "SGLang's radix cache and the simulator's prefix cache).",
    )


class CpuEngineSettings(_Strict):
    """Settings for an engine on CPU. Each engine is pinned to `threads` OpenMP
    threads that sleep when idle; without this, two engines on a small machine
    spin against each other and every request is ~10x slower."""

    kv_cache_gib: PositiveFloat = Field(
        default=1.0,
        description="KV cache size of each engine on device cpu, in GiB (vLLM's kv_cache_memory_bytes); the SLA "
        "planner takes the decode pool's KV capacity from it, with planner.profile's bytes per token.",
    )
    threads: PositiveInt = Field(
        default=1,
        description="OpenMP threads per engine on device cpu (OMP_NUM_THREADS), neither bound to cores nor spinning "
        "when idle.",
    )
    shm_poll_us: PositiveInt | None = Field(
        default=50,
        description="Microseconds vLLM's engine core and worker sleep between looks at their shared-memory "
        "queues, instead of spinning a core each for 1 s after every message (engines/vllm_plugin.py); "
        "None keeps vLLM's spin.",
    )
    shm_poll_max_us: PositiveInt = Field(
        default=1000,
        description="Longest sleep between those looks: each sleep is 1/16 of the wait so far, from shm_poll_us up "
        "to this, so a long wait costs few looks and a message is seen at most 1/16 of its wait late. Equal to "
        "shm_poll_us: a fixed poll.",
    )

    @model_validator(mode="after")
    def _check_poll(self) -> CpuEngineSettings:
        if self.shm_poll_us is not None and self.shm_poll_max_us < self.shm_poll_us:
            raise ValueError(
                f"cpu.shm_poll_max_us ({self.shm_poll_max_us}) is below cpu.shm_poll_us ({self.shm_poll_us})"
            )
        return self


class VllmEngineConfig(_Strict):
    kind: Literal["vllm"] = Field(
        default="vllm",
        description="vLLM's AsyncLLM in the replica process; the default when `kind` is omitted.",
    )
    device: Device = Field(
        default=Device.CUDA,
        description="cuda: each replica reserves tensor_parallel_size Ray GPUs. cpu: vLLM's CPU build, no GPU: the "
        "`cpu` settings apply, NIXL's KV buffer is host memory and kv_cache.block_size must be a multiple of 32.",
    )
    tensor_parallel_size: PositiveInt = Field(
        default=1,
        description="GPUs per replica (vLLM's tensor_parallel_size), all on one node; above 1 vLLM's Ray executor runs "
        "the ranks in the replica's STRICT_PACK placement group. cuda only.",
    )
    gpu_memory_utilization: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="vLLM's gpu_memory_utilization: the share of each GPU's memory the engine may use, the KV cache "
        "taking what weights and activations leave. On cpu the KV cache is cpu.kv_cache_gib.",
    )
    max_num_seqs: PositiveInt | None = Field(
        default=None,
        description="vLLM's max_num_seqs: most sequences in one batch. None: vLLM's default. The SLA planner takes "
        "the decode pool's as its batch cap (256 when None).",
    )
    max_num_batched_tokens: PositiveInt | None = Field(
        default=None,
        description="vLLM's max_num_batched_tokens: most tokens one scheduler step computes. None: vLLM's default.",
    )
    enforce_eager: bool = Field(
        default=False,
        description="vLLM's enforce_eager: run the model eagerly, without CUDA graphs.",
    )
    cpu: CpuEngineSettings = Field(default=CpuEngineSettings(), description="Settings that apply with device cpu only.")
    engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Further vLLM AsyncEngineArgs, checked at build time against vLLM's own field names "
        "and the ones the adapter sets from model, kv_cache and pool settings (which they may not name).",
    )

    @model_validator(mode="after")
    def _check(self) -> VllmEngineConfig:
        if self.tensor_parallel_size > 1 and self.device is not Device.CUDA:
            raise ValueError("tensor_parallel_size > 1 needs device cuda (vLLM's CPU build runs one rank here)")
        return self


class SimEngineConfig(_Strict):
    """A simulated engine (orchestrator/sim): vLLM-style continuous batching,
    paged KV with prefix caching and KV events, timed by a performance model,
    in real time. Needs no accelerator."""

    kind: Literal["sim"] = Field(
        description="The simulated engine (orchestrator/sim); Ray reserves no GPU for its replicas.",
    )
    gpu: Literal["H100", "H200", "A100"] = Field(
        default="H100",
        description="The modelled GPU: its roofline times each step and its memory sizes the KV cache (unless "
        "num_gpu_blocks); unused with `profile`.",
    )
    model: Literal["llama-3.1-8b", "llama-3.1-70b", "qwen3-32b"] = Field(
        default="llama-3.1-8b",
        description="The modelled model (its size and KV bytes per token, for the roofline and the KV capacity); "
        "unused with `profile`. Output text still comes from the application's tokenizer (model.tokenizer / source).",
    )
    tensor_parallel_size: PositiveInt = Field(
        default=1,
        description="Modelled GPUs per replica: the roofline divides compute and memory traffic among them (adding an "
        "all-reduce per layer) and the KV capacity counts their memory.",
    )
    profile: str | None = Field(
        default=None,
        description="A profile from `orchestrator profile`; its measured step times replace the roofline of gpu/model.",
    )
    num_gpu_blocks: PositiveInt | None = Field(
        default=None,
        description="KV capacity in blocks; None: what the GPU memory left after the weights holds "
        "(roofline), or the profile's measured capacity.",
    )
    gpu_memory_utilization: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Share of each modelled GPU's memory for weights and KV cache: sizes the roofline's KV capacity "
        "when neither num_gpu_blocks nor profile is set.",
    )
    lora_load_s: float = Field(
        default=0.05,
        ge=0,
        description="With model.lora: seconds an engine spends reading an adapter not in its host cache, added to "
        "the step that first runs it (an 8B model's rank-16 adapter, ~80 MB, at ~2 GB/s; assumed, not measured).",
    )
    max_num_seqs: PositiveInt = Field(
        default=256,
        description="Most sequences running in one simulated step (as vLLM's max_num_seqs); the SLA planner's decode "
        "batch cap too.",
    )
    max_num_batched_tokens: PositiveInt = Field(
        default=8192,
        description="Most tokens (prompt chunks and decode tokens) one simulated step computes, as vLLM's "
        "max_num_batched_tokens.",
    )
    link: Literal["nvlink", "infiniband", "pcie"] = Field(
        default="infiniband", description="The prefill -> decode KV transfer path the handoff time is modelled on."
    )

    @property
    def device(self) -> None:
        return None  # simulated: runs on a CPU core whatever it models


class SglangTransferBackend(str, enum.Enum):
    NIXL = "nixl"
    MOONCAKE = "mooncake"


class SglangEngineConfig(_Strict):
    """SGLang's engine (`sglang.Engine`) in its disaggregation role. SGLang
    needs CUDA: this kind runs only on GPU machines (benchmarks/gpu/)."""

    kind: Literal["sglang"] = Field(description="SGLang's engine in the replica process (CUDA only).")
    tensor_parallel_size: PositiveInt = Field(
        default=1,
        description="GPUs per replica (SGLang's tp_size), all held by the replica actor (above 1: in one placement "
        "bundle, on one node).",
    )
    mem_fraction_static: float | None = Field(default=None, gt=0, lt=1, description="None: SGLang's default.")
    max_running_requests: PositiveInt | None = Field(
        default=None,
        description="SGLang's max_running_requests. None: SGLang's default. The SLA planner does not read it (it "
        "assumes 256).",
    )
    chunked_prefill_size: PositiveInt | None = Field(
        default=None,
        description="SGLang's chunked_prefill_size, in tokens. None: SGLang's default.",
    )
    transfer_backend: SglangTransferBackend = Field(
        default=SglangTransferBackend.NIXL,
        description="SGLang's disaggregation_transfer_backend for the prefill -> decode KV transfer; not set for an "
        "aggregated pool.",
    )
    ib_device: str | None = Field(default=None, description="RDMA device(s) for the mooncake backend, e.g. mlx5_0.")
    server_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Further SGLang ServerArgs, checked at build time against SGLang's own field names "
        "and the ones the adapter sets from model, kv_cache and pool settings (which they may not name).",
    )

    @property
    def device(self) -> Device:
        return Device.CUDA


def _engine_kind(value: Any) -> str:
    return value.get("kind", "vllm") if isinstance(value, dict) else value.kind


EngineConfig = Annotated[
    Annotated[VllmEngineConfig, Tag("vllm")]
    | Annotated[SimEngineConfig, Tag("sim")]
    | Annotated[SglangEngineConfig, Tag("sglang")],
    Discriminator(
        _engine_kind,
        custom_error_type="engine_kind",
        custom_error_message="engine.kind must be 'vllm', 'sim' or 'sglang'",
    ),
]


class ServeAutoscaling(_Strict):
    """Ray Serve's own autoscaler for a pool (with the SLA planner off):
    replicas = ongoing requests / target_ongoing_requests, within bounds."""

    target_ongoing_requests: PositiveFloat = Field(
        default=2.0,
        description="Serve's target_ongoing_requests: the ongoing requests per replica the autoscaler aims for.",
    )
    min_replicas: int = Field(
        default=1,
        ge=0,
        description="Fewest replicas Serve's autoscaler keeps; `replicas` is clamped into the bounds as the initial "
        "count.",
    )
    max_replicas: PositiveInt = Field(default=8, description="Most replicas Serve's autoscaler scales the pool to.")
    upscale_delay_s: float = Field(
        default=30.0,
        ge=0,
        description="Serve's upscale_delay_s: seconds the autoscaler must want more replicas before it adds them.",
    )
    downscale_delay_s: float = Field(
        default=600.0,
        ge=0,
        description="Serve's downscale_delay_s: seconds the autoscaler must want fewer replicas before it removes "
        "them.",
    )

    @model_validator(mode="after")
    def _check(self) -> ServeAutoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        return self


class PoolConfig(_Strict):
    replicas: PositiveInt = Field(
        default=1,
        description="Replica count with the planner off and no `autoscaling`; otherwise the initial count, clamped to "
        "the autoscaler's or the planner's bounds.",
    )
    autoscaling: ServeAutoscaling | None = Field(
        default=None,
        description="Ray Serve's default autoscaler for this pool, `replicas` the initial count; "
        "None: a fixed count (or the SLA planner's, with planner.mode act).",
    )
    engine: EngineConfig = Field(description="The replicas' engine, by `kind`: vllm (the default), sim or sglang.")
    num_cpus: float = Field(default=1.0, ge=0, description="Ray logical CPUs per replica.")
    resources: dict[str, PositiveFloat] = Field(
        default_factory=dict,
        description="Ray custom resources each replica needs, e.g. {prefill_node: 1} to keep a pool on the nodes "
        "started with that resource (`ray start --resources`).",
    )
    max_ongoing_requests: PositiveInt = Field(
        default=256, description="Serve-level cap per replica; the engine queues beyond its batch."
    )

    @property
    def num_gpus(self) -> int:
        return self.engine.tensor_parallel_size if self.engine.device is Device.CUDA else 0


class LimitsConfig(_Strict):
    """Checked before any engine sees a request; a request over a limit gets a 4xx."""

    max_request_bytes: PositiveInt = Field(
        default=4 * 2**20,
        description="Largest request body, in bytes (4 MiB); a larger one gets a 413 and is not read past the limit.",
    )
    max_prompt_tokens: PositiveInt | None = Field(default=None, description="None: the model's context length.")
    max_output_tokens: PositiveInt | None = Field(default=None, description="None: whatever the context leaves.")
    max_stop_strings: PositiveInt = Field(default=16, description="Most `stop` strings in one request.")
    max_stop_string_chars: PositiveInt = Field(default=256, description="Longest `stop` string, in characters.")
    max_n: PositiveInt = Field(default=16, description="Most choices (`n`) one prompt may ask for.")
    max_prompts: PositiveInt = Field(default=64, description="Most prompts in one completion request.")
    max_logprobs: int = Field(
        default=20, ge=0, description="Most `logprobs` / `top_logprobs`; at most the engine's (vLLM: 20)."
    )
    max_json_depth: PositiveInt = Field(
        default=64,
        description="Deepest nesting of objects and arrays in a request body (a schema or tool "
        "parameters past it would cost the engine's grammar compiler, not the client).",
    )


class AuthConfig(_Strict):
    """Who may call the application. An application whose HTTP address (Serve's `http_options.host`) is not
    loopback refuses to start without `api_key_env`, unless `allow_unauthenticated` accepts the risk."""

    api_key_env: str | None = Field(
        default=None,
        description="Name of the environment variable holding the API key clients must send as "
        "`Authorization: Bearer <key>` on /v1/*. None: no authentication, allowed only on a loopback address "
        "(or with allow_unauthenticated).",
    )
    admin_key_env: str | None = Field(
        default=None,
        description="Name of the environment variable holding the admin key, separate from the API key, that the "
        "admin surfaces (/pools: replica addresses and endpoints) need as `Authorization: Bearer <key>`. None: "
        "with an API key set, /pools is refused to every caller; without any key (loopback), it is open.",
    )
    allow_unauthenticated: bool = Field(
        default=False,
        description="Serve without an API key on a non-loopback HTTP address: the one switch that accepts the "
        "risk of serving the model, and /pools, to anyone who can reach the address.",
    )


class DataPlane(str, enum.Enum):
    """How requests and their tokens travel between a frontend and the pool replicas."""

    DIRECT = "direct"  # one TCP connection per (frontend, replica), msgpack frames (orchestrator/wire)
    SERVE = "serve"  # Serve deployment-handle calls, each streamed chunk through Ray


class ResponsesConfig(_Strict):
    store: bool = Field(
        default=True,
        description="Keep the responses the Responses API is asked to store (`store: true`, its default), for "
        "`previous_response_id`, `GET /v1/responses/{id}` and background responses. With several frontend "
        "replicas, one store (a Serve replica of its own) serves them all and outlives their restarts, not its own; "
        "with one, the store is that frontend's, lost with it (as vLLM's server keeps them). Off: `store` is "
        "ignored, as vLLM's server does by default.",
    )
    max_stored: PositiveInt = Field(
        default=10_000, description="Stored responses kept at most; past it the oldest are evicted."
    )
    max_stored_bytes: PositiveInt = Field(
        default=256 * 2**20,
        description="Bytes of stored responses (their JSON and their turns' messages) kept at most; past it the "
        "oldest are evicted, and a response larger than this alone is not stored.",
    )


class StalledReadersConfig(_Strict):
    """A streamed answer whose client stops reading (the frontend's writes to it wait) is parked: its engine
    request is aborted, so neither the replica nor its engine holds anything for it, and the frontend keeps
    what arrived before (at most `park_after_tokens` tokens). When the client reads again, the prompt plus the
    tokens sent continue on the replica the scheduler picks, as a migration does (not counted as one). Direct
    data plane only; an answer under a JSON schema or grammar is never parked (its constraint cannot resume)."""

    park: bool = Field(default=True, description="Park stalled streams. Off: a stalled stream runs to its end.")
    park_after_s: PositiveFloat = Field(
        default=2.0,
        description="A stream is parked when a chunk arrives this long after its client last took one, while it "
        "has not come back.",
    )
    park_after_tokens: PositiveInt = Field(
        default=256, description="A stream is parked as soon as this many of its tokens wait unread, however recent."
    )


class FrontendConfig(_Strict):
    replicas: PositiveInt = Field(
        default=1,
        description="Replicas of the `frontend` deployment (a fixed count); each runs its own admission control, "
        "scheduler and KV index.",
    )
    num_cpus: float = Field(default=1.0, ge=0, description="Ray logical CPUs per frontend replica.")
    max_ongoing_requests: PositiveInt = Field(
        default=1024, description="Serve's cap on requests inside one frontend replica (above max_in_flight)."
    )
    max_in_flight: PositiveInt = Field(
        default=256,
        description="Admission control: requests one frontend replica serves at once; beyond it, 429 with Retry-After.",
    )
    retry_after_s: PositiveInt = Field(
        default=1,
        description="Seconds sent in the Retry-After header of the 429 a frontend replica answers at max_in_flight.",
    )
    prefill_timeout_s: PositiveFloat = Field(
        default=30.0, description="A prefill slower than this is abandoned and the decode replica prefills locally."
    )
    max_migrations: int = Field(
        default=2,
        ge=0,
        description="A stream whose decode replica fails moves to another replica at most this often.",
    )
    migration_wait_s: float = Field(
        default=180.0,
        ge=0,
        description="A migration that finds no decode replica but those that failed the stream waits this long for "
        "Serve to start one (a replacement engine loads in minutes), then tries the failed ones again.",
    )
    limits: LimitsConfig = Field(
        default=LimitsConfig(),
        description="Request limits the frontend checks before any engine sees a request.",
    )
    auth: AuthConfig = Field(
        default=AuthConfig(),
        description="API key authentication of `/v1/*` and `/pools` (`/health` stays open).",
    )
    responses: ResponsesConfig = Field(
        default=ResponsesConfig(), description="OpenAI's Responses API (`/v1/responses`): its store of responses."
    )
    stalled_readers: StalledReadersConfig = Field(
        default=StalledReadersConfig(),
        description="Streams whose client stops reading: parked, holding no engine request (direct data plane).",
    )
    data_plane: DataPlane = Field(
        default=DataPlane.DIRECT,
        description="direct: requests and tokens go over the frontend's own connections to each replica, Serve "
        "only tells which replicas exist; serve: through Serve deployment handles (what Serve's own autoscaler "
        "counts).",
    )

    @model_validator(mode="after")
    def _check(self) -> FrontendConfig:
        if self.max_in_flight > self.max_ongoing_requests:
            raise ValueError("max_in_flight must not exceed max_ongoing_requests (Serve would queue before we admit)")
        return self


class RoutingPolicy(str, enum.Enum):
    ROUND_ROBIN = "round_robin"
    KV_AWARE = "kv_aware"


# The group made of the top-level prefill_pool/decode_pool; further groups are `pool_groups`.
PRIMARY_GROUP = "primary"


class ShapePolicy(str, enum.Enum):
    SHAPE = "shape"  # by the request's measured shape (orchestrator/routing/shape.py)
    ROUND_ROBIN = "round_robin"  # shape-blind: groups in turn (a baseline with the same pools)


class ShapeRoutingConfig(_Strict):
    """Which pool group serves a request, by its shape (orchestrator/routing/shape.py):

        short_prompt  prompt < min_prompt_tokens                       -> unique_group
        long_output   max_tokens > max_output_tokens (when set)        -> unique_group
        prefix_heavy  longest cached prefix / prompt blocks >= min_prefix_reuse -> prefix_group
        unique        anything else                                    -> unique_group

    The cached prefix is measured in the frontend's KV index over the replicas
    of every group (the request's reuse, wherever its prefix lives now)."""

    policy: ShapePolicy = Field(
        default=ShapePolicy.SHAPE,
        description="shape: the group by the request's shape (above); round_robin: the groups in turn, shape-blind (a "
        "baseline with the same pools).",
    )
    prefix_group: str = Field(
        description="Group for prefix-heavy requests (e.g. SGLang pools): `primary` or the "
        "name of one of `pool_groups`."
    )
    unique_group: str = Field(default=PRIMARY_GROUP, description="Group for every other request.")
    min_prefix_reuse: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="A request is prefix-heavy when at least this fraction of its prompt's full blocks is a "
        "prefix some replica holds.",
    )
    min_prompt_tokens: int = Field(
        default=0, ge=0, description="Shorter prompts are `short_prompt` (too short for reuse to matter)."
    )
    max_output_tokens: PositiveInt | None = Field(
        default=None,
        description="Requests asking for more output tokens are `long_output`: decode-dominated, "
        "their prefix saves a small share of their work. None: no bound.",
    )


class RoutingConfig(_Strict):
    """How the scheduler picks replicas and decides whether to disaggregate."""

    policy: RoutingPolicy = Field(
        default=RoutingPolicy.KV_AWARE,
        description="kv_aware: the KV-locality scheduler (cost of uncached prompt blocks plus decode load, conditional "
        "disaggregation); round_robin: replicas in turn, every request disaggregated while a prefill replica is live, "
        "no KV events.",
    )
    kv_events: bool = Field(
        default=True,
        description="Engines publish KV cache events and the index follows them. False: approximate mode, "
        "the index remembers the scheduler's own routes for `approximate_ttl_s`.",
    )
    approximate_ttl_s: PositiveFloat = Field(
        default=120.0,
        description="Approximate mode (kv_events false): seconds a route's prompt blocks count as cached on the "
        "replicas it was sent to.",
    )
    event_lag_ttl_s: float = Field(
        default=5.0,
        ge=0,
        description="With events, a route's blocks count as present on its replicas for this long, "
        "bridging the delay before the engine's events arrive (bursts of one prefix).",
    )
    prefill_weight: float = Field(
        default=2.0,
        ge=0,
        description="Cost of an uncached prompt block vs a block of decode load. Dynamo's "
        "default is 1; 2 keeps shared prefixes together under load (benchmarks/results/compare_routing.md).",
    )
    temperature: float = Field(
        default=0.0, ge=0, description="0: lowest cost wins. >0: sample replicas by softmax over normalised costs."
    )
    balance_abs_threshold: NonNegativeInt | None = Field(
        default=None,
        description="SGLang's cache-aware guard: when the decode replicas' request counts (running + waiting, "
        "the larger of the engine's report and this frontend's own count) differ by more than this, and the "
        "busiest has more than `balance_rel_threshold` times the idlest's, a request goes to the least busy "
        "replicas (cost still breaks the tie) instead of following its cache. None: no guard.",
    )
    balance_rel_threshold: float = Field(
        default=1.5,
        ge=1.0,
        description="The balance guard's ratio: it acts only when the busiest decode replica also has more than this "
        "many times the idlest's requests; unused while balance_abs_threshold is None.",
    )
    lora_load_blocks: float = Field(
        default=64.0,
        ge=0,
        description="With model.lora: the cost of a replica reading a request's adapter from its source (not in its "
        "host cache), in blocks of prefill work: about an 8B model's rank-16 adapter (~80 MB) read at ~2 GB/s "
        "against ~1 ms a prefill block on an H100. Chosen, not tuned.",
    )
    lora_slot_wait_blocks: float = Field(
        default=1024.0,
        ge=0,
        description="With model.lora: the cost of a replica whose `max_loras` adapter slots all run other adapters "
        "(the request waits for one to drain), in blocks of prefill work. Chosen, not tuned.",
    )
    local_prefill_max_tokens: int = Field(
        default=512,
        ge=0,
        description="Conditional disaggregation: a prompt with at most this many tokens uncached on the chosen "
        "decode replica is prefilled there, not sent to the prefill pool.",
    )
    max_prefill_queue_tokens: PositiveInt | None = Field(
        default=None,
        description="Prefill pool counts as saturated when even its least loaded replica has more prompt tokens "
        "queued than this; requests then prefill locally. None: never.",
    )
    shape: ShapeRoutingConfig | None = Field(
        default=None,
        description="Routing among pool groups by request shape. None: every request to the "
        "primary group (the top-level pools).",
    )


class SlaConfig(_Strict):
    """Latency targets. Recorded now; the SLA planner sizes pools to them."""

    ttft_p99_ms: PositiveFloat | None = Field(
        default=None,
        description="Target p99 time to first token, in milliseconds. None: no target; planner.mode advisory or act "
        "needs both targets.",
    )
    itl_p50_ms: PositiveFloat | None = Field(
        default=None,
        description="Target median inter-token latency, in milliseconds: the planner sizes decode batches to it. None: "
        "no target.",
    )


class PlannerMode(str, enum.Enum):
    OFF = "off"
    ADVISORY = "advisory"  # decide and report, change nothing
    ACT = "act"  # resize the pools through Ray Serve's autoscaling


class PoolBounds(_Strict):
    min_replicas: int = Field(
        default=1,
        ge=0,
        description="Fewest replicas the planner gives the pool (Serve's min_replicas); `replicas` is clamped into the "
        "bounds as the initial count.",
    )
    max_replicas: PositiveInt = Field(
        default=8,
        description="Most replicas the planner gives the pool (Serve's max_replicas); the layout check (`cluster`) "
        "counts this many with planner.mode act.",
    )

    @model_validator(mode="after")
    def _check(self) -> PoolBounds:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} > max_replicas {self.max_replicas}")
        return self


class PlannerConfig(_Strict):
    """The SLA planner: every `interval_s`, observe -> predict -> propose ->
    constrain -> act, per pool (orchestrator/planner)."""

    mode: PlannerMode = Field(
        default=PlannerMode.OFF,
        description="off: the planner does not run; advisory: it decides every interval and logs and exports its "
        "decision, changing nothing; act: it resizes the primary pools through Ray Serve's autoscaling.",
    )
    interval_s: PositiveFloat = Field(
        default=10.0,
        description="Seconds between planner decisions; also the window over which each replica reports its load to "
        "the planner. The planner's rules were fitted and are measured at 10 s; at 30 s its predictive loop sizes a "
        "rise an interval later (the fast loop, fast_interval_s, catches it sooner).",
    )
    predictor: Literal["constant", "moving_average", "kalman", "seasonal"] = Field(
        default="kalman",
        description="How the next intervals' request rate, ISL, OSL and prefix hit rate are predicted: the last value, "
        "a moving average of 5 intervals, a Kalman level + trend (damped by trend_damping), or seasonal (a period of "
        "24 intervals).",
    )
    profile: str | None = Field(
        default=None,
        description="Engine profile (`orchestrator profile`); None: the "
        "simulated engine's roofline for simulated pools",
    )
    prefill: PoolBounds = Field(
        default=PoolBounds(),
        description="Bounds of the prefill pool's replica count while the planner runs (advisory or act).",
    )
    decode: PoolBounds = Field(
        default=PoolBounds(),
        description="Bounds of the decode pool's replica count while the planner runs (advisory or act).",
    )
    max_gpus: PositiveInt | None = Field(default=None, description="GPU budget shared by both pools; None: no cap")
    best_effort_share: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="With traffic.classes: the most a pool grows for best-effort classes' load, as a share of its "
        "budget (planner.max_gpus where set, else the pool's max_replicas). 0: best effort only fills what the SLO "
        "classes leave.",
    )
    budget_priority: Literal["decode", "prefill"] = Field(
        default="decode",
        description="The pool served first when the GPU budget binds: decode (ITL breaks every "
        "running stream) by default.",
    )
    scale_down_intervals: PositiveInt = Field(
        default=9,
        description="Intervals in a row that must ask for fewer replicas before the pool shrinks, and then to the "
        "most any of them asked for (the stabilisation window: 90 s at the default interval).",
    )
    queueing_factor: PositiveFloat = Field(
        default=4.0,
        description="How far the p99 TTFT lies above the mean when sizing prefill against the p99 target: "
        "wait: the p99 wait over the mean wait (the default, fitted on the training loads); kingman, md1: the p99 "
        "TTFT over the mean TTFT (3 was fitted for those).",
    )
    prefill_queueing: Literal["kingman", "md1", "wait"] = Field(
        default="wait",
        description="The prefill queue the planner sizes for: kingman (G/G/1 with the burstiness measured from "
        "the prompt tokens arriving per peak bucket, its mean TTFT under the p99 target / queueing_factor), md1 "
        "(Poisson arrivals of equal prompts, the rule before), or wait (the same G/G/1 queue, the prompt's "
        "service time plus queueing_factor x its mean wait under the p99 target: the factor on the wait only).",
    )
    decode_step_calibration: bool = Field(
        default=True,
        description="Scale the profile's decode step time by what the decode replicas measure: their median gap "
        "between tokens over the profile's step at the batch they run (the mean of the last two intervals, 1 to "
        "4), so that a pool whose engines run slower than profiled is sized from what they do. false: the "
        "profile as it is.",
    )
    decode_utilization: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="Share of a decode replica's ITL-bound batch the planner fills; the "
        "rest absorbs bursts (a full batch makes new requests wait for a slot).",
    )
    replica_startup_s: float = Field(
        default=0.0,
        ge=0,
        description="A new replica's start-up time: the planner also sizes for the interval "
        "that starts this long after the next one (0: the next interval only).",
    )
    peak_memory_intervals: PositiveInt = Field(
        default=3, description="Intervals of observed peak-to-mean prompt-token ratios the burst headroom remembers."
    )
    peak_window_s: PositiveFloat = Field(
        default=2.0,
        description="Width of the stretches over which replicas count arrived prompt tokens: the burst "
        "headroom sizes prefill for the busiest such stretch of an interval.",
    )
    trend_damping: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="kalman predictor: damping phi of its trend over the look-ahead "
        "(steps ahead: level + (phi + ... + phi^steps) x slope; 1: an undamped straight line). A noisy slope "
        "extrapolated over the start-up time overshoots at every turn of the load.",
    )
    pending_timeout_s: PositiveFloat = Field(
        default=600.0,
        description="How long a pool may have fewer replicas serving than it asked for before the planner reports "
        "them as not coming up (orchestrator_planner_pending_replicas, a warning each interval). Nothing waits on "
        "them: the other pool keeps scaling, and a smaller ask cancels pending replicas first.",
    )
    fast_interval_s: PositiveFloat | None = Field(
        default=2.0,
        description="The fast loop: every this many seconds between the interval's decisions, the planner "
        "re-sizes both pools from the prompt tokens/s of the last few seconds and what their engines hold now (the "
        "prompt tokens queued for prefill, the decode streams running and waiting), and raises a pool that is "
        "short at once; it never "
        "lowers one (a raised pool comes down through scale_down_intervals, as any other). Under Serve it reads "
        "the replicas' latest reports, pushed every second (the pools' autoscaling metrics_interval_s). None: off "
        "(the predictive loop alone).",
    )
    correction_after_intervals: PositiveInt = Field(
        default=2,
        description="Intervals in a row a pool must miss its target while sized for the load (the "
        "replicas the model asks for serving throughout, no queue inherited) before its correction rises: one "
        "interval's p99 is noisy and a burst is no wrong model, but a wrong model misses every interval. 1: "
        "raise on the first such miss.",
    )

    @model_validator(mode="after")
    def _check(self) -> PlannerConfig:
        if self.fast_interval_s is not None and self.fast_interval_s >= self.interval_s:
            raise ValueError(
                f"planner.fast_interval_s ({self.fast_interval_s}) must be shorter than planner.interval_s "
                f"({self.interval_s}): the fast loop runs between the interval's decisions (null: no fast loop)"
            )
        return self


class NetworkConfig(_Strict):
    advertise_host: str | None = Field(
        default=None,
        description="Address peers use to reach a replica's NIXL side channel and KV events; "
        "None means the replica's Ray node address.",
    )
    nixl_backends: list[str] = Field(
        default_factory=lambda: ["UCX"],
        description="NIXL backends of vLLM's NixlConnector (kv_connector_extra_config `backends`) for the prefill -> "
        "decode KV transfer; vLLM pools only.",
    )
    kv_handshake_timeout_s: PositiveInt | None = Field(
        default=None,
        description="How long a decode engine waits for a prefill engine's NIXL handshake before it computes "
        "the prompt itself. None: vLLM's default (30 s).",
    )
    kv_lease_s: int = Field(
        default=30,
        ge=6,
        description="How long a prefill replica holds a prompt's KV blocks for a decode replica that has not read "
        "them (vLLM's `kv_lease_duration`; the decode side renews it every lease/6 s while it waits). A request "
        "whose decode never comes frees its blocks after this. At least 6: vLLM renews every lease // 6 s.",
    )
    transport_env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment of every engine process for the KV transport: UCX_TLS, UCX_NET_DEVICES, "
        "FI_PROVIDER=efa, NCCL_* ... Nothing is set that is not listed here.",
    )
    nixl_progress_delay_us: int | None = Field(
        default=None,
        ge=1,
        description="Poll interval of NIXL's UCX progress thread. None keeps NIXL's busy-polling (lowest "
        "latency, one core per engine); CPU machines want ~1000, or idle engines eat every core.",
    )


class ClusterConfig(_Strict):
    """The GPUs the application may use, for layout checks at build time. Each
    replica's tensor-parallel ranks sit on one node (a STRICT_PACK placement
    group), so a replica never spans nodes."""

    gpus_per_node: PositiveInt = Field(
        default=8,
        description="GPUs per node: no replica may need more (its ranks share one node), and with `nodes` set the "
        "pools' replicas must pack onto nodes of this size.",
    )
    nodes: PositiveInt | None = Field(default=None, description="GPU nodes; None: not checked against a total.")


class PoolGroupConfig(_Strict):
    """A further set of pools serving the same model (same kv_cache, same
    routing settings) behind the same frontend, e.g. an SGLang P/D pair beside
    the primary vLLM pair. Its deployments are `<name>_prefill_pool` and
    `<name>_decode_pool`; it has its own scheduler."""

    name: str = Field(
        pattern=r"^[a-z][a-z0-9_]{0,31}$",
        description="The group's name: prefix of its deployment names, and what routing.shape's prefix_group / "
        "unique_group refer to; `primary` is reserved.",
    )
    prefill_pool: PoolConfig | None = Field(default=None, description="Absent: the group serves aggregated.")
    decode_pool: PoolConfig = Field(
        description="The group's `<name>_decode_pool`: aggregated when prefill_pool is absent.",
    )

    @property
    def mode(self) -> ServingMode:
        return ServingMode.AGGREGATED if self.prefill_pool is None else ServingMode.DISAGGREGATED

    def pools(self) -> dict[str, PoolConfig]:
        """Deployment name -> pool."""
        pools = {f"{self.name}_decode_pool": self.decode_pool}
        if self.prefill_pool is not None:
            pools[f"{self.name}_prefill_pool"] = self.prefill_pool
        return pools


_NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"


class SloClassConfig(_Strict):
    """One class of traffic: its engine priority and its latency targets, or best effort."""

    name: str = Field(pattern=_NAME_PATTERN, description="What a request names in `x-slo-class` or `slo_class`.")
    priority: int = Field(
        default=0,
        description="The engines' priority for the class's requests, on both pools: lower runs first (vLLM's rule). "
        "Classes are shed in the opposite order: the highest value first.",
    )
    ttft_p99_ms: PositiveFloat | None = Field(
        default=None, description="The class's TTFT p99 target. None, with itl_p50_ms None: best effort."
    )
    itl_p50_ms: PositiveFloat | None = Field(
        default=None, description="The class's ITL p50 target. None, with ttft_p99_ms None: best effort."
    )
    max_streams: PositiveInt | None = Field(
        default=None,
        description="Engine streams (prompts x n) the class may hold in one frontend replica; what the class may "
        "not take is kept for the others. None: frontend.max_in_flight.",
    )
    queue_size: NonNegativeInt = Field(
        default=0,
        description="Requests that wait for room instead of a 429 (ordered by deadline, tenants served fairly by "
        "tokens, each tenant at most its weighted share of the queue while others are active). The wait counts "
        "toward a class's TTFT: keep queue_wait_s well under its target. 0: a 429 at once.",
    )
    queue_wait_s: PositiveFloat = Field(
        default=30.0, description="A queued request's deadline: past it, a 429 with Retry-After."
    )
    max_prefill_queue_tokens: PositiveInt | None = Field(
        default=None,
        description="The prompt tokens a replica may have queued for prefill (routed, not yet prefilled) and still "
        "take this class's prompts: what the class's TTFT target allows ahead of a prompt. The KV-aware router "
        "sends them among the replicas within it where any is (the cheapest of all where none is); a class without "
        "it (batch) takes any replica. None: no limit.",
    )
    allow_request_priority: bool = Field(
        default=False,
        description="Accept the request's own `priority` field (vLLM's), at this class's priority or lower "
        "(a larger value); a higher one is a 403. False: a `priority` other than the class's is a 400.",
    )

    @model_validator(mode="after")
    def _check(self) -> SloClassConfig:
        if (self.ttft_p99_ms is None) != (self.itl_p50_ms is None):
            raise ValueError(f"class {self.name!r}: give both ttft_p99_ms and itl_p50_ms, or neither (best effort)")
        if self.queue_size and self.ttft_p99_ms is not None and self.queue_wait_s * 1e3 >= self.ttft_p99_ms:
            raise ValueError(
                f"class {self.name!r}: queue_wait_s ({self.queue_wait_s}) must be under its ttft_p99_ms "
                f"({self.ttft_p99_ms} ms): a request that waits that long has missed it"
            )
        return self


class TenantConfig(_Strict):
    """Who sends traffic: an API key, the classes it may claim and its limits (each per frontend replica)."""

    name: str = Field(pattern=_NAME_PATTERN, description="The tenant's name in metrics and logs.")
    api_key_env: str = Field(
        description="Name of the environment variable holding this tenant's API key (`Authorization: Bearer`)."
    )
    classes: list[str] | None = Field(
        default=None, description="The classes its requests may claim; another is a 403. None: every class."
    )
    default_class: str | None = Field(
        default=None,
        description="The class of its requests that name none. None: traffic.default_class (which it must be allowed).",
    )
    max_in_flight: PositiveInt | None = Field(default=None, description="Requests at once; beyond it, 429.")
    tokens_per_minute: PositiveInt | None = Field(
        default=None,
        description="Tokens a minute (prompt + max_tokens, charged at admission, the unused output refunded); "
        "beyond it, 429 with the Retry-After that refills it.",
    )
    weight: PositiveFloat = Field(
        default=1.0, description="Its share within a class when tenants contend (tokens served / weight equalised)."
    )


class TrafficConfig(_Strict):
    """SLO classes and tenants. No classes: every request is alike, as before classes existed."""

    classes: list[SloClassConfig] = Field(default_factory=list, description="The traffic classes.")
    default_class: str | None = Field(
        default=None, description="The class of a request that names none; required when classes are configured."
    )
    tenants: list[TenantConfig] = Field(
        default_factory=list,
        description="Tenants by API key. frontend.auth.api_key_env, when set, is the key of tenant `default` "
        "(every class).",
    )
    contention_window_s: PositiveFloat = Field(
        default=10.0,
        description="A tenant that sent a request this recently is active: a class at its limit keeps room for "
        "the fair share of each active tenant.",
    )

    @model_validator(mode="after")
    def _check(self) -> TrafficConfig:
        names = [c.name for c in self.classes]
        if len(set(names)) != len(names):
            raise ValueError(f"traffic.classes: names must be unique (got {names})")
        if self.classes and self.default_class is None:
            raise ValueError(f"traffic.default_class is required with classes (one of {names})")
        if self.default_class is not None and self.default_class not in names:
            raise ValueError(f"traffic.default_class {self.default_class!r} is not a class (classes: {names})")
        tenants = [t.name for t in self.tenants]
        if len(set(tenants)) != len(tenants) or "default" in tenants:
            raise ValueError(f"traffic.tenants: names must be unique and not `default` (got {tenants})")
        for t in self.tenants:
            allowed = t.classes if t.classes is not None else names
            for c in [*(t.classes or []), *([t.default_class] if t.default_class else [])]:
                if c not in names:
                    raise ValueError(f"tenant {t.name!r} names class {c!r}, which is not configured ({names})")
            default = t.default_class or self.default_class
            if default is not None and default not in allowed:
                raise ValueError(f"tenant {t.name!r}: its default class {default!r} is not among its classes")
        return self


class TracingConfig(_Strict):
    """OpenTelemetry traces of the frontend's requests (orchestrator/tracing.py); off by default."""

    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP traces endpoint the frontend exports spans to, e.g. http://collector:4318/v1/traces. "
        "None: tracing off (no spans, no trace context sent to the replicas).",
    )
    service_name: str = Field(default="orchestrator", description="The `service.name` of the exported spans.")
    sample_ratio: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="Share of traces sampled where the client sends no sampled `traceparent` (a client's sampling "
        "decision is followed).",
    )


class AppConfig(_Strict):
    model: ModelConfig = Field(description="The one model every pool and group serves.")
    kv_cache: KVCacheConfig = Field(
        default=KVCacheConfig(),
        description="The KV cache layout of every engine, and the block size the frontend's KV index hashes prompts "
        "in.",
    )
    prefill_pool: PoolConfig | None = Field(
        default=None, description="Absent: aggregated serving, the decode pool prefills every prompt."
    )
    decode_pool: PoolConfig = Field(
        description="The `decode_pool` deployment: it decodes, and prefills a prompt itself when serving aggregated or "
        "when the scheduler keeps a prefill local.",
    )
    pool_groups: list[PoolGroupConfig] = Field(
        default_factory=list, description="Further pool groups (same model); `routing.shape` chooses among them."
    )
    frontend: FrontendConfig = Field(
        default=FrontendConfig(),
        description="The `frontend` deployment (the ingress): the OpenAI API, admission, request limits, "
        "authentication and how requests reach the pools.",
    )
    routing: RoutingConfig = Field(
        default=RoutingConfig(),
        description="How the frontend's scheduler picks replicas and decides whether to disaggregate, and which pool "
        "group serves a request.",
    )
    sla: SlaConfig = Field(default=SlaConfig(), description="Latency targets the SLA planner sizes the pools to.")
    planner: PlannerConfig = Field(
        default=PlannerConfig(),
        description="The SLA planner, which sizes the primary prefill and decode pools (off by default).",
    )
    network: NetworkConfig = Field(
        default=NetworkConfig(),
        description="The KV transfer between prefill and decode engines and the address of each replica's KV events.",
    )
    cluster: ClusterConfig | None = Field(default=None, description="None: layouts are not checked.")
    traffic: TrafficConfig = Field(
        default=TrafficConfig(),
        description="SLO classes and tenants: admission, queueing, engine priority and metrics by class and tenant.",
    )
    tracing: TracingConfig = Field(
        default=TracingConfig(),
        description="OpenTelemetry traces of the frontend's requests, exported over OTLP/HTTP (off by default).",
    )
    serving_niceness: int | None = Field(
        default=0,
        ge=-20,
        le=19,
        description="The nice value the frontend and pool replicas run at, and with them the engine "
        "processes they start. Ray starts its workers at 15 (its `worker_niceness`), so that under CPU "
        "contention they yield to every process at 0: HAProxy, Ray's own daemons, a load generator, "
        "other tenants. 0 is what vLLM's own server runs at. Lowering a nice value needs CAP_SYS_NICE "
        "(root on a host; not among Docker's default capabilities): a replica that may not logs a "
        "warning and runs at Ray's value (then start Ray with RAY_worker_niceness=0). None: Ray's.",
    )

    @property
    def mode(self) -> ServingMode:
        return ServingMode.AGGREGATED if self.prefill_pool is None else ServingMode.DISAGGREGATED

    def pools(self) -> dict[str, PoolConfig]:
        """The primary group's pools (the top-level prefill_pool/decode_pool),
        by deployment name; `all_pools` adds the further groups'."""
        pools = {"decode_pool": self.decode_pool}
        if self.prefill_pool is not None:
            pools["prefill_pool"] = self.prefill_pool
        return pools

    def group_names(self) -> list[str]:
        """`primary` first, then `pool_groups` in order."""
        return [PRIMARY_GROUP, *(g.name for g in self.pool_groups)]

    def group_pools(self) -> dict[str, dict[str, PoolConfig]]:
        """Group name -> its pools by deployment name (every deployment name unique)."""
        return {PRIMARY_GROUP: self.pools(), **{g.name: g.pools() for g in self.pool_groups}}

    def all_pools(self) -> dict[str, PoolConfig]:
        return {name: pool for pools in self.group_pools().values() for name, pool in pools.items()}

    def for_group(self, name: str) -> AppConfig:
        """The application as the group's replicas see it: the group's pools as
        the top-level pools, no further groups, no shape routing. Every other
        setting (model, kv_cache, routing, network) is the application's."""
        if name == PRIMARY_GROUP:
            group_prefill, group_decode = self.prefill_pool, self.decode_pool
        else:
            group = next((g for g in self.pool_groups if g.name == name), None)
            if group is None:
                raise KeyError(f"no pool group {name!r} (groups: {self.group_names()})")
            group_prefill, group_decode = group.prefill_pool, group.decode_pool
        args = self.model_dump(mode="json")
        args.update(
            prefill_pool=group_prefill.model_dump(mode="json") if group_prefill else None,
            decode_pool=group_decode.model_dump(mode="json"),
            pool_groups=[],
        )
        args["routing"]["shape"] = None
        return AppConfig.model_validate(args)

    @model_validator(mode="after")
    def _check(self) -> AppConfig:
        if self.planner.mode is PlannerMode.ACT and any(p.autoscaling for p in self.pools().values()):
            raise ValueError(
                "a pool's `autoscaling` (Ray Serve's autoscaler) and planner.mode act both resize it: choose one"
            )
        if self.frontend.data_plane is DataPlane.DIRECT and any(p.autoscaling for p in self.all_pools().values()):
            raise ValueError(
                "a pool's `autoscaling` (Ray Serve's autoscaler) counts requests sent through Serve "
                "handles only: set frontend.data_plane: serve with it"
            )
        if self.planner.mode is not PlannerMode.OFF:
            slo_class = any(c.ttft_p99_ms is not None for c in self.traffic.classes)
            if not slo_class and (self.sla.ttft_p99_ms is None or self.sla.itl_p50_ms is None):
                raise ValueError(
                    "planner.mode needs both sla.ttft_p99_ms and sla.itl_p50_ms, or a traffic class with targets"
                )
            if self.pool_groups:
                raise ValueError(
                    "the SLA planner sizes the primary pools only: planner.mode must be off when "
                    f"pool_groups are configured (groups: {[g.name for g in self.pool_groups]})"
                )
        self._check_groups()
        for name, pool in self.all_pools().items():
            if pool.engine.device is Device.CPU and self.kv_cache.block_size % CPU_BLOCK_SIZE_MULTIPLE:
                raise ValueError(
                    f"kv_cache.block_size={self.kv_cache.block_size}: {name} runs on CPU, "
                    f"where vLLM needs a multiple of {CPU_BLOCK_SIZE_MULTIPLE}"
                )
        if self.cluster is not None:
            from orchestrator.placement import check_layout

            check_layout(self.pool_gpu_demand(), self.cluster.gpus_per_node, self.cluster.nodes)
        return self

    def _check_groups(self) -> None:
        """Group names unique (and not `primary`); shape routing names existing
        groups and has an index to measure reuse in. The groups serve one model:
        model and kv_cache (block size) are the application's, not per group."""
        seen = {PRIMARY_GROUP}
        for group in self.pool_groups:
            if group.name in seen:
                what = "is reserved for the top-level pools" if group.name == PRIMARY_GROUP else "is used twice"
                raise ValueError(f"pool_groups: the group name {group.name!r} {what}")
            seen.add(group.name)
        shape = self.routing.shape
        if shape is None:
            return
        for field in ("prefix_group", "unique_group"):
            name = getattr(shape, field)
            if name not in seen:
                raise ValueError(f"routing.shape.{field}: no pool group {name!r} (groups: {self.group_names()})")
        if shape.policy is ShapePolicy.SHAPE and self.routing.policy is not RoutingPolicy.KV_AWARE:
            raise ValueError("routing.shape measures prefix reuse in the KV index: it needs routing.policy kv_aware")

    def pool_gpu_demand(self) -> dict[str, tuple[int, int]]:
        """Per pool of every group: (GPUs per replica, most replicas it may run) —
        the planner's max_replicas when it acts, else the fixed count."""
        demand = {}
        for name, pool in self.all_pools().items():
            most = pool.replicas
            if self.planner.mode is PlannerMode.ACT:
                most = (self.planner.prefill if name == "prefill_pool" else self.planner.decode).max_replicas
            demand[name] = (pool.num_gpus, most)
        return demand


def load_serve_config(path: str | Path) -> dict[str, Any]:
    with open(path) as f:
        return yaml.safe_load(f)


def shipped_config(path: str | Path, model_source: str | Path, **overrides: Any) -> AppConfig:
    """The first application's args of a Serve config file with another model
    directory and `overrides` given as paths joined by `__`
    (`decode_pool__replicas=2` sets `decode_pool.replicas`): for tests and
    benchmarks that run the shipped configs."""
    args = load_serve_config(path)["applications"][0]["args"]
    args["model"]["source"] = str(model_source)
    for dotted, value in overrides.items():
        node = args
        *parents, leaf = dotted.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return AppConfig.model_validate(args)


def load_app_config(path: str | Path, app_index: int = 0) -> AppConfig:
    """Read the `args` of one application from a Serve config file
    (`applications: [{import_path, args}]`), or a file that is just the args."""
    doc = load_serve_config(path)
    if isinstance(doc, dict) and "applications" in doc:
        doc = doc["applications"][app_index].get("args", {})
    return AppConfig.model_validate(doc)
