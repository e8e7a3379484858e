"""What the vLLM adapter makes of the engine's outputs (vLLM's own RequestOutput, from a scripted AsyncLLM)."""

from __future__ import annotations

import asyncio

import pytest
from vllm.outputs import CompletionOutput, RequestOutput

from orchestrator.config import AppConfig
from orchestrator.engines.adapter import EngineSpec
from orchestrator.engines.base import EngineError, EngineRole
from orchestrator.engines.vllm_engine import VllmEngine
from orchestrator.messages import EngineRequest, FinishReason, SamplingSpec


def _output(tokens: list[int], finish: str | None) -> RequestOutput:
    done = finish is not None
    completion = CompletionOutput(0, "x" * len(tokens), tokens, None, None, finish_reason=finish)
    return RequestOutput("r", None, [1, 2], None, [completion], done, num_cached_tokens=0)


class _ScriptedLLM:
    """AsyncLLM's `generate`, answering every request with the outputs given."""

    def __init__(self, outputs: list[RequestOutput]) -> None:
        self.outputs = outputs

    async def generate(self, prompt, params, request_id):
        for out in self.outputs:
            yield out


def _engine(outputs: list[RequestOutput]) -> VllmEngine:
    app = AppConfig.model_validate(
        {
            "model": {"name": "m", "source": "org/m", "max_model_len": 64},
            "kv_cache": {"block_size": 32},
            "decode_pool": {"engine": {"device": "cpu"}},
        }
    )
    engine = VllmEngine(EngineSpec.for_pool(app, app.decode_pool, EngineRole.AGGREGATED, "127.0.0.1"))
    engine._llm = _ScriptedLLM(outputs)
    return engine


async def _chunks(engine: VllmEngine) -> list:
    return [c async for c in engine.generate(EngineRequest("r", (1, 2), SamplingSpec(max_tokens=8)))]


def test_a_finished_output_carries_its_reason():
    chunks = asyncio.run(_chunks(_engine([_output([5], None), _output([6], "length")])))
    assert [(c.token_ids, c.finish_reason) for c in chunks] == [((5,), None), ((6,), FinishReason.LENGTH)]


def test_vllms_internal_error_finish_is_an_engine_failure_not_a_stop():
    """vLLM ends a request with finish_reason "error" on a retryable internal failure (its server answers a
    500): the adapter raises EngineError after the tokens before it, so the request path migrates or falls back
    instead of ending the answer short as if the model had stopped."""
    engine = _engine([_output([5], None), _output([], "error")])
    seen = []

    async def run():
        async for chunk in engine.generate(EngineRequest("r", (1, 2), SamplingSpec(max_tokens=8))):
            seen.append(chunk.token_ids)

    with pytest.raises(EngineError, match="internal error"):
        asyncio.run(run())
    assert seen == [(5,)]
