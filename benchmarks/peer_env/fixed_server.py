"""An OpenAI completions server whose timing is sleeps: token i (from 0) leaves at TTFT + i * ITL. The stand-in
server of benchmarks/aiperf_crosscheck.py (run in our venv):

    python fixed_server.py PORT TTFT_MS ITL_MS TOKENIZER_JSON MODEL_NAME
"""

import asyncio
import json
import sys
import time

import uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route
from tokenizers import Tokenizer


def event(body, **fields):
    doc = {"id": "cmpl", "object": "text_completion", "model": body.get("model"), **fields}
    return "data: " + json.dumps(doc) + "\n\n"


def app(ttft_ms: float, itl_ms: float, tokenizer: Tokenizer, name: str) -> Starlette:
    async def completions(request):
        body = await request.json()
        prompt = body.get("prompt")
        n_in = len(prompt) if isinstance(prompt, list) else len(tokenizer.encode(prompt).ids)
        n_out = int(body.get("max_tokens") or 16)
        usage = (body.get("stream_options") or {}).get("include_usage")

        async def stream():
            start = time.perf_counter()
            for i in range(n_out):
                await asyncio.sleep(max(0.0, start + (ttft_ms + i * itl_ms) / 1000 - time.perf_counter()))
                done = "length" if i == n_out - 1 else None
                yield event(body, choices=[{"index": 0, "text": " tok", "finish_reason": done}])
            if usage:
                yield event(
                    body,
                    choices=[],
                    usage={"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out},
                )
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model"}]})

    return Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/models", models),
            Route("/health", models),
        ]
    )


if __name__ == "__main__":
    port, ttft_ms, itl_ms, tokenizer_json, name = sys.argv[1:6]
    uvicorn.run(
        app(float(ttft_ms), float(itl_ms), Tokenizer.from_file(tokenizer_json), name),
        host="127.0.0.1",
        port=int(port),
        log_level="warning",
    )
