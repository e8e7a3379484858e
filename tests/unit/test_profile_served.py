"""The profiler's estimators (decode step, a prompt's TTFT while a batch decodes) and the served source's
parsing (tools/profile.py), with a fake engine on the other side of the Engine boundary. The fakes pace
their tokens with asyncio.sleep on a virtual clock, so the estimates are exact and no wall time passes."""

import asyncio
from dataclasses import dataclass

import pytest

from tests.virtual_time import run_virtual
from tools.profile import _cache_config, _Prompts, measure_decode, measure_mixed


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
        step = run_virtual(measure_decode(engine, prompts, batch=3, context=16, tokens=25))
        # Chunk gaps would say 0 for most tokens when 4 share a chunk; the estimator says 5 ms.
        assert step == pytest.approx(0.005, rel=1e-9)


class _MixingEngine:
    """Sequences decode a token every `step_s` after a `prefill_s` prompt; a one-token prompt that arrives
    while any decode takes `mixed_s` instead."""

    def __init__(self, step_s: float, prefill_s: float, mixed_s: float) -> None:
        self.step_s, self.prefill_s, self.mixed_s = step_s, prefill_s, mixed_s
        self.decoding = 0

    async def generate(self, request):
        if request.sampling.max_tokens == 1:
            await asyncio.sleep(self.mixed_s if self.decoding else self.prefill_s)
            yield _Chunk([1])
            return
        self.decoding += 1
        try:
            await asyncio.sleep(self.prefill_s)
            for _ in range(request.sampling.max_tokens):
                yield _Chunk([1])
                await asyncio.sleep(self.step_s)
        finally:
            self.decoding -= 1


def test_mixed_point_is_a_prompts_ttft_while_the_batch_decodes_beside_it_alone_and_the_batch_is_cancelled():
    engine = _MixingEngine(step_s=0.002, prefill_s=0.01, mixed_s=0.03)

    async def measure():
        mixed, alone = await measure_mixed(
            engine, _Prompts(vocab_size=100, seed=0), batch=3, context=16, isl=8, repeats=2
        )
        return mixed, alone, engine.decoding

    mixed, alone, still_decoding = run_virtual(measure())
    assert mixed == pytest.approx(0.03, rel=1e-9)
    assert alone == pytest.approx(0.01, rel=1e-9)
    assert still_decoding == 0


def test_cache_config_labels_come_from_vllms_info_gauge():
    text = (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="32",enable_prefix_caching="True",num_gpu_blocks="16384"} 1.0\n'
    )
    labels = _cache_config(text)
    assert (labels["block_size"], labels["num_gpu_blocks"]) == ("32", "16384")
    assert _cache_config("# nothing here\n") == {}


def test_points_are_measured_in_rounds_so_a_drift_reaches_every_point_alike():
    from tools.profile import in_rounds

    calls = []
    speed = iter([1.0, 1.0, 2.0, 2.0, 3.0, 3.0])  # the machine slows down round by round

    async def measure(point: int) -> float:
        calls.append(point)
        return point * next(speed)

    medians = run_virtual(in_rounds([10, 20], measure, repeats=3))
    assert calls == [10, 20, 10, 20, 10, 20]
    assert medians == {10: 20.0, 20: 40.0}  # the 2:1 shape kept


def test_server_cost_is_the_served_ttft_beyond_the_same_engine_in_process_idle_and_busy():
    from tools.profile import measure_server_cost

    order = []

    class _Recording(_MixingEngine):
        def __init__(self, name: str, prefill_s: float, mixed_s: float) -> None:
            super().__init__(step_s=0.002, prefill_s=prefill_s, mixed_s=mixed_s)
            self.name = name

        async def generate(self, request):
            if request.sampling.max_tokens == 1:
                order.append(self.name)
            async for chunk in super().generate(request):
                yield chunk

    # Through the server: 4 ms more when idle, 10 ms more while other requests stream.
    engine, served = _Recording("engine", 0.010, 0.020), _Recording("served", 0.014, 0.030)
    cost = run_virtual(
        measure_server_cost(engine, served, _Prompts(vocab_size=100, seed=0), isl=8, streams=[1, 3], repeats=2)
    )
    assert cost["request_overhead_s"] == pytest.approx(0.004, rel=1e-9)
    assert cost["request_overhead_busy_s"] == pytest.approx(0.010, rel=1e-9)
    assert [p["streams"] for p in cost["points"]] == [1, 3, 1, 3]
    per_point = 12  # 3 alone, 6 mixed, 3 alone
    assert order == (["engine"] * per_point + ["served"] * per_point) * 4
    assert engine.decoding == served.decoding == 0
