"""Factories for unit tests: the frontend's logic over fake pools.

The fakes stand on the far side of the engine boundary (what a pool replica
would return); the code under test is the real service, request path,
scheduler, SSE framing and metrics.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from orchestrator.api import sse
from orchestrator.api.app import AppHooks, build_openai_app
from orchestrator.api.service import CompletionService
from orchestrator.config import PRIMARY_GROUP, AppConfig, LimitsConfig
from orchestrator.frontend import FrontendParts, PoolGroup, build_frontend
from orchestrator.messages import (
    EngineChunk,
    EngineRequest,
    FinishReason,
    KVTransfer,
    PositionLogprobs,
    PrefillResult,
    TokenLogprob,
)
from orchestrator.metrics import FrontendMetrics
from orchestrator.pools import ReplicaView
from orchestrator.prompts import Tokenizer
from orchestrator.tracing import NOOP_TRACER, Tracer

MODEL = "test-model"


class WordTokenizer:
    """One token per whitespace-separated word; ids are stable per word."""

    def __len__(self) -> int:
        return 1000

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [10 + sum(map(ord, w)) % 900 for w in text.split()]

    def apply_chat_template(self, conversation: list[dict[str, Any]], **kwargs: Any) -> str:
        """Turns, then the template's own variables (`raise_exception` fails as a template can), then the prompt."""
        if kwargs.get("raise_exception"):
            raise RuntimeError(kwargs["raise_exception"])
        turns = " ".join(f"<{m['role']}> {m['content']}" for m in conversation)
        own = {"tools", "tokenize", "add_generation_prompt", "continue_final_message"}
        variables = "".join(f" {k}={v}" for k, v in sorted(kwargs.items()) if k not in own)
        return turns + variables + (" <assistant>" if kwargs.get("add_generation_prompt") else "")

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        return "".join(map(token_text, token_ids))


# Generated token k of a request is OUT + k: outside the tokenizer's ids, so a
# continuation can count the generated tokens in its prompt.
OUT = 5000


def token_text(token_id: int) -> str:
    return f"w{token_id} "


def fake_logprobs(token: int, request: EngineRequest) -> PositionLogprobs:
    """An engine's list for one position: the sampled token (-0.5) first, then the top
    `logprobs` (the sampled one at rank 1, then -1.0, -2.0, ...), as vLLM orders them."""
    sampled = TokenLogprob(token, -0.5, token_text(token))
    asked = request.sampling.logprob_token_ids
    if asked:  # these tokens, after the sampled one, as vLLM lists them
        return PositionLogprobs(sampled, (sampled, *(TokenLogprob(t, -1.0 - t, f"t{t}") for t in asked)))
    others = [TokenLogprob(7 + k, -1.0 - k, f"t{k}") for k in range(max(0, (request.sampling.logprobs or 0) - 1))]
    top = [sampled, *others] if request.sampling.logprobs else []
    return PositionLogprobs(sampled, tuple(dict.fromkeys([sampled, *top])))


def fake_prompt_logprobs(request: EngineRequest) -> tuple[PositionLogprobs | None, ...] | None:
    """An engine's prompt logprobs: None for the first token, then each prompt
    token at -1.5 and rank 3, followed by the top `prompt_logprobs` (-0.1, -0.2, ...)."""
    top = request.sampling.prompt_logprobs
    if top is None:
        return None
    positions: list[PositionLogprobs | None] = [None]
    for t in request.prompt_token_ids[1:]:
        actual = TokenLogprob(t, -1.5, token_text(t), rank=3)
        ranked = tuple(TokenLogprob(7 + k, -0.1 * (k + 1), f"t{k}", rank=k + 1) for k in range(top))
        positions.append(PositionLogprobs(actual, (actual, *ranked)))
    return tuple(positions)


@dataclass
class FakePool:
    """A pool whose replicas answer like an engine: token i of a request is
    `OUT + i`, one chunk per token, finishing at max_tokens."""

    name: str
    replica_ids: tuple[str, ...] = ("r0", "r1")
    prefill_error: Exception | None = None
    prefill_delay_s: float = 0.0
    generate_error_after: int | None = None
    generate_error: Exception = field(default_factory=lambda: RuntimeError("replica died"))
    # Only this replica fails (None: every replica); the others continue greedy output.
    failing_replica: str | None = None
    # Text a continuation's engine wrongly adds at the seam (vLLM's detokenizer
    # restarting on prompt tokens that end inside a character).
    continuation_seam_text: str = ""
    chunk_delay_s: float = 0.0
    # Pieces of text the engine writes (one token each, finishing with "stop"), instead of OUT + k.
    script: tuple[str, ...] | None = None
    # The token ids of each script piece (a real tokenizer's), instead of OUT + k.
    script_token_ids: tuple[tuple[int, ...], ...] | None = None
    prefills: list[EngineRequest] = field(default_factory=list)
    generates: list[EngineRequest] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)

    def replicas(self) -> list[ReplicaView]:
        return [ReplicaView(r) for r in self.replica_ids]

    async def prefill(self, request: EngineRequest, view: ReplicaView | None = None) -> PrefillResult:
        self.prefills.append(request)
        await asyncio.sleep(self.prefill_delay_s)
        if self.prefill_error is not None:
            raise self.prefill_error
        n = len(request.prompt_token_ids)
        transfer = KVTransfer(
            source_engine_id="prefill-engine",
            num_blocks=(n + 31) // 32,
            num_tokens=n,
            engine_params={"remote_block_ids": [[1, 2]]},
        )
        return PrefillResult(
            kv_transfer=transfer, num_prompt_tokens=n, num_cached_tokens=7, replica_id=request.target_replica
        )

    async def generate(self, request: EngineRequest, view: ReplicaView | None = None) -> AsyncIterator[EngineChunk]:
        """Greedy and deterministic: output token k of an original prompt is
        OUT + k, so a continuation (prompt + k tokens) picks up at OUT + k."""
        self.generates.append(request)
        n = request.sampling.max_tokens
        cached = len(request.prompt_token_ids) if request.kv_transfer else 0
        already = sum(1 for t in request.prompt_token_ids if t >= OUT)
        fails_here = self.failing_replica in (None, request.target_replica)
        if self.script is not None:
            n = min(n, len(self.script))
        stop_on = request.sampling.stop[0] if request.sampling.stop else None
        try:
            for i in range(n):
                if self.generate_error_after is not None and i == self.generate_error_after and fails_here:
                    raise self.generate_error
                await asyncio.sleep(self.chunk_delay_s)
                seam = self.continuation_seam_text if already and i == 0 else ""
                token = OUT + already + i
                text = self.script[i] if self.script is not None else token_text(token)
                last = FinishReason.STOP if self.script is not None and n == len(self.script) else FinishReason.LENGTH
                yield EngineChunk(
                    token_ids=self.script_token_ids[i] if self.script_token_ids is not None else (token,),
                    text=seam + text,
                    finish_reason=last if i == n - 1 else None,
                    # A scripted output that stops did so on the request's first stop string, if it has one.
                    stop_reason=stop_on if i == n - 1 and last is FinishReason.STOP else None,
                    num_prompt_tokens=len(request.prompt_token_ids) if i == 0 else 0,
                    num_cached_tokens=cached if i == 0 else 0,
                    logprobs=None if request.sampling.logprobs is None else (fake_logprobs(token, request),),
                    prompt_logprobs=fake_prompt_logprobs(request) if i == 0 else None,
                )
        finally:
            self.closed.append(request.request_id)


@dataclass
class Frontend:
    service: CompletionService
    metrics: FrontendMetrics
    decode: FakePool
    prefill: FakePool | None
    app: Any
    parts: FrontendParts

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://frontend")

    def metric(self, name: str, labels: dict[str, str] | None = None) -> float:
        value = self.metrics.registry.get_sample_value(name, labels or {})
        return 0.0 if value is None else value


def tiny_tokenizer(directory: Any, special_tokens: list[str]) -> Any:
    """The tiny test model's tokenizer (made in `directory`), with a format's `special_tokens` added
    as the model that writes that format has them."""
    from transformers import AutoTokenizer

    from orchestrator.tiny_model import make_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(make_tiny_model(directory))
    tokenizer.add_special_tokens({"additional_special_tokens": special_tokens})
    return tokenizer


def aggregated_config(engine_kind: str, **model: Any) -> AppConfig:
    """An aggregated app of one pool of `engine_kind`, with these `model` fields set."""
    return AppConfig.model_validate(
        {
            "model": {"name": MODEL, "source": "org/test-model", "max_model_len": 64, **model},
            "decode_pool": {"engine": {"kind": engine_kind}},
        }
    )


def make_frontend(
    *,
    disaggregated: bool = True,
    max_model_len: int = 64,
    prefill_timeout_s: float = 5.0,
    decode: FakePool | None = None,
    prefill: FakePool | None = None,
    limits: LimitsConfig = LimitsConfig(),
    max_in_flight: int = 64,
    api_key: str | None = None,
    admin_key: str | None = None,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
    engine_kind: str = "sim",
    tokenizer: Tokenizer | None = None,
    routing: dict[str, Any] | None = None,
    tracer: Tracer = NOOP_TRACER,
    traffic: dict[str, Any] | None = None,
    tenant_keys: dict[str, str] | None = None,
) -> Frontend:
    decode = decode or FakePool("decode_pool")
    prefill = (prefill or FakePool("prefill_pool")) if disaggregated else None
    engine = {"engine": {"kind": engine_kind}}
    config = AppConfig.model_validate(
        {
            "model": {
                "name": MODEL,
                "source": "org/test-model",
                "max_model_len": max_model_len,
                "tool_call_parser": tool_call_parser,
                "reasoning_parser": reasoning_parser,
            },
            "decode_pool": engine,
            **({"prefill_pool": engine} if prefill else {}),
            "routing": routing or {"policy": "round_robin"},
            "frontend": {
                "prefill_timeout_s": prefill_timeout_s,
                "limits": limits.model_dump(),
                "max_in_flight": max_in_flight,
                "retry_after_s": 2,
                # Every replica here fails alike: no replacement comes, so no wait for one.
                "migration_wait_s": 0,
            },
            **({"traffic": traffic} if traffic is not None else {}),
        }
    )
    ids = iter(range(1_000_000))
    parts = build_frontend(
        config,
        {PRIMARY_GROUP: PoolGroup(decode, prefill)},
        tokenizer or WordTokenizer(),
        created=0,
        wall_clock=lambda: 1_700_000_000.0,
        new_id=lambda: f"req{next(ids)}",
        tracer=tracer,
    )

    async def health():
        return parts.health()

    hooks = AppHooks(
        health=health,
        pools=parts.pools_report,
        max_request_bytes=limits.max_request_bytes,
        api_key=api_key,
        admin_key=admin_key,
        tenant_keys=tenant_keys or {},
    )
    app = build_openai_app(parts.service, hooks, parts.responses)
    return Frontend(parts.service, parts.metrics, decode, prefill, app, parts)


def run(coro):
    return asyncio.run(coro)


def post(fe: Frontend, path: str, body: Any):
    """One request to the frontend's OpenAI app, answered whole."""

    async def go():
        async with fe.client() as c:
            return await c.post(path, json=body)

    return run(go())


def chat(fe: Frontend, content: str, **body: Any):
    """A one-message chat completion."""
    return post(
        fe, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": content}], **body}
    )


def json_events(response) -> list[dict]:
    """A streamed answer's JSON events (without the closing [DONE])."""
    return [e for e in sse.parse_events(response.text) if isinstance(e, dict)]
