"""The standalone simulated server (`orchestrator sim-server`) answers the
OpenAI API in process, through its real app, over an ASGI transport."""

from __future__ import annotations

import argparse
import asyncio

import httpx

from tools.sim_server import add_arguments, build


def word_tokenizer_dir(directory):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({f"w{i}": i for i in range(300)} | {"<unk>": 300}, unk_token="<unk>"))
    tok.pre_tokenizer = WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(directory)
    return directory


def test_the_sim_server_streams_and_answers_whole(tmp_path):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--tokenizer", str(word_tokenizer_dir(tmp_path)), "--num-gpu-blocks", "256"])

    async def run():
        app = await build(args)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as client:
            models = (await client.get("/v1/models")).json()
            body = {"model": "sim", "prompt": "w1 w2 w3 w4", "max_tokens": 6}
            whole = (await client.post("/v1/completions", json=body)).json()
            streamed = await client.post("/v1/completions", json=body | {"stream": True})
            bad = await client.post("/v1/completions", json=body | {"max_tokens": -1})
        return models, whole, streamed, bad

    models, whole, streamed, bad = asyncio.run(run())
    assert models["data"][0]["id"] == "sim"
    assert whole["usage"] == {
        "prompt_tokens": 4,
        "completion_tokens": 6,
        "total_tokens": 10,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]")
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
