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


class _RecordingLLM:
    """AsyncLLM's `generate`, recording the keywords each call got."""

    def __init__(self) -> None:
        self.kwargs: list[dict] = []

    async def generate(self, prompt, params, request_id, **kwargs):
        self.kwargs.append(kwargs)
        yield _output([5], "length")


def test_the_trace_context_reaches_vllm_only_where_it_exports_traces():
    """A request's traceparent goes to AsyncLLM.generate as `trace_headers` when the engine has an OTLP
    endpoint (engine_args otlp_traces_endpoint); otherwise, or with no context, nothing is passed."""
    traced = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    def calls(engine_args: dict, trace_context: str | None) -> list[dict]:
        app = AppConfig.model_validate(
            {
                "model": {"name": "m", "source": "org/m", "max_model_len": 64},
                "kv_cache": {"block_size": 32},
                "decode_pool": {"engine": {"device": "cpu", "engine_args": engine_args}},
            }
        )
        engine = VllmEngine(EngineSpec.for_pool(app, app.decode_pool, EngineRole.AGGREGATED, "127.0.0.1"))
        engine._llm = llm = _RecordingLLM()
        request = EngineRequest("r", (1, 2), SamplingSpec(max_tokens=8), trace_context=trace_context)

        async def go():
            return [c async for c in engine.generate(request)]

        asyncio.run(go())
        return llm.kwargs

    exporting = {"otlp_traces_endpoint": "http://collector:4318/v1/traces"}
    assert calls(exporting, traced) == [{"trace_headers": {"traceparent": traced}}]
    assert calls(exporting, None) == [{}]
    assert calls({}, traced) == [{}]
