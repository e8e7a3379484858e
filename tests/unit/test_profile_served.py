"""The profiler's estimators and the served source's parsing (harness/profile.py), with a fake engine on
the other side of the Engine boundary."""

import asyncio
from dataclasses import dataclass

import pytest

from harness.profile import _cache_config, _Prompts, measure_decode


@dataclass
class _Chunk:
    token_ids: list[int]


class _CoalescingEngine:
    """Decodes a token every `step_s`, all sequences together, after a prompt that takes `prefill_s`; sends
    its tokens `per_chunk` at a time, as a busy server does."""

    def __init__(self, step_s: float, prefill_s: float, per_chunk: int) -> None:
        self.step_s, self.prefill_s, self.per_chunk = step_s, prefill_s, per_chunk

    async def generate(self, request):
        await asyncio.sleep(self.prefill_s)
        yield _Chunk([1])
        left = request.sampling.max_tokens - 1
        while left:
            n = min(self.per_chunk, left)
            await asyncio.sleep(self.step_s * n)
            yield _Chunk([1] * n)
            left -= n


def test_decode_step_is_the_time_per_token_once_all_decode_whatever_the_chunking():
    prompts = _Prompts(vocab_size=100, seed=0)
    for per_chunk in (1, 4):
        engine = _CoalescingEngine(step_s=0.005, prefill_s=0.01, per_chunk=per_chunk)
        step = asyncio.run(measure_decode(engine, prompts, batch=3, context=16, tokens=25))
        # Chunk gaps would say 0 for most tokens when 4 share a chunk; the estimator says 5 ms.
        assert step == pytest.approx(0.005, rel=0.3)


def test_cache_config_labels_come_from_vllms_info_gauge():
    text = ('# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n'
            '# TYPE vllm:cache_config_info gauge\n'
            'vllm:cache_config_info{block_size="32",enable_prefix_caching="True",num_gpu_blocks="16384"} 1.0\n')
    labels = _cache_config(text)
    assert (labels["block_size"], labels["num_gpu_blocks"]) == ("32", "16384")
    assert _cache_config("# nothing here\n") == {}
