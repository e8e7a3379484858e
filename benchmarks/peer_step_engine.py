"""An engine for Ray Serve LLM that costs (almost) nothing: the peer's side of
`frontend_capacity.py`, as Dynamo's mocker and our `kind: sim` are the others.

Ray Serve LLM's `LLMServer` takes its engine class from `RAYLLM_VLLM_ENGINE_CLS`
(its documented escape hatch for tests); everything above the engine — the
OpenAI ingress, handles, request router, the server's output batching — is
Ray Serve LLM's own. Runs only inside Ray Serve LLM's environment.

Contract: every `STEP_S` while any stream runs, each running completion gets
one token, streamed as one OpenAI SSE event (`data: {...}\\n\\n`), then the
usage event if asked and `data: [DONE]`. The events are built with
`json.dumps`, cheaper than vLLM's pydantic serialization, so the peer's
replica CPU measured with it is a lower bound of its cost with vLLM.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from ray.llm._internal.serve.core.engine.protocol import LLMEngine

STEP_S = 0.005


class StepEngine(LLMEngine):
    def __init__(self, llm_config):
        self._model = llm_config.model_id
        self._running = 0
        self._step: asyncio.Future | None = None
        self._work = asyncio.Event()

    async def start(self):
        asyncio.get_running_loop().create_task(self._clock())

    async def _clock(self) -> None:
        """One step every STEP_S while a stream waits; each step wakes every waiting stream once."""
        loop = asyncio.get_running_loop()
        self._step = loop.create_future()
        while True:
            await self._work.wait()
            await asyncio.sleep(STEP_S)
            step, self._step = self._step, loop.create_future()
            step.set_result(None)
            if self._running == 0:
                self._work.clear()

    def routing_stats(self) -> dict:
        return {}

    async def resolve_lora(self, lora_model):
        return None

    async def check_health(self) -> None:
        return None

    async def completions(self, request, raw_request_info=None):
        prompt = request.prompt
        prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        max_tokens = request.max_tokens or 16
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        head = {"id": rid, "object": "text_completion", "created": created, "model": self._model}
        self._running += 1
        self._work.set()
        try:
            for i in range(max_tokens):
                await self._step
                finish = "length" if i == max_tokens - 1 else None
                yield (
                    "data: "
                    + json.dumps(
                        {**head, "choices": [{"index": 0, "text": " x", "logprobs": None, "finish_reason": finish}]}
                    )
                    + "\n\n"
                )
        finally:
            self._running -= 1
        options = getattr(request, "stream_options", None)
        if options is not None and getattr(options, "include_usage", False):
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": max_tokens,
                "total_tokens": prompt_tokens + max_tokens,
            }
            yield "data: " + json.dumps({**head, "choices": [], "usage": usage}) + "\n\n"
        yield "data: [DONE]\n\n"


def _unsupported(name: str):
    async def method(self, *args, **kwargs):
        raise NotImplementedError(f"StepEngine serves streamed completions only, not {name}")

    return method


for _name in StepEngine.__abstractmethods__:
    setattr(StepEngine, _name, _unsupported(_name))
StepEngine.__abstractmethods__ = frozenset()
