"""Load generation: fixed concurrency, Poisson rate, or trace replay, all
through one async client and `stream_completion`."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from tools.client import RequestRecord, stream_completion
from tools.workloads import RequestSpec


@dataclass(frozen=True)
class Target:
    base_url: str  # e.g. http://127.0.0.1:8000 (the /v1/completions endpoint is used)
    model: str
    ignore_eos: bool = True
    temperature: float = 0.0
    # Send prompts as text (for servers that take no token ids); the ids must
    # round-trip through the tokenizer (TokenPool.words).
    detokenize: Callable[[Sequence[int]], str] | None = None

    def body(self, spec: RequestSpec) -> dict:
        prompt = list(spec.prompt_token_ids) if self.detokenize is None else self.detokenize(spec.prompt_token_ids)
        return {
            "model": spec.model or self.model,
            "prompt": prompt,
            "max_tokens": spec.max_tokens,
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos,
        }

    @property
    def url(self) -> str:
        return f"{self.base_url.rstrip('/')}/v1/completions"


def _client(concurrency: int, timeout_s: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=max(concurrency, 16), max_keepalive_connections=max(concurrency, 16))
    return httpx.AsyncClient(timeout=timeout_s, limits=limits)


async def _send(
    client: httpx.AsyncClient, target: Target, spec: RequestSpec, done: Callable[[], None]
) -> RequestRecord:
    record = await stream_completion(client, target.url, target.body(spec), dict(spec.headers))
    done()
    return record


async def run_concurrency(
    target: Target,
    specs: Sequence[RequestSpec],
    concurrency: int,
    progress: Callable[[], None] = lambda: None,
    timeout_s: float = 600,
) -> tuple[list[RequestRecord], float]:
    """Keep `concurrency` requests in flight until `specs` run out."""
    queue: asyncio.Queue[RequestSpec] = asyncio.Queue()
    for spec in specs:
        queue.put_nowait(spec)
    records: list[RequestRecord] = []
    async with _client(concurrency, timeout_s) as client:

        async def worker() -> None:
            while not queue.empty():
                records.append(await _send(client, target, queue.get_nowait(), progress))

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(specs)))))
        return records, time.perf_counter() - start


async def run_schedule(
    target: Target,
    specs: Sequence[RequestSpec],
    offsets_s: Sequence[float],
    progress: Callable[[], None] = lambda: None,
    timeout_s: float = 600,
) -> tuple[list[RequestRecord], float]:
    """Send each request at its offset from the start, whatever is in flight."""
    async with _client(256, timeout_s) as client:
        start = time.perf_counter()

        async def at(offset: float, spec: RequestSpec) -> RequestRecord:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            return await _send(client, target, spec, progress)

        records = await asyncio.gather(*(at(o, s) for o, s in zip(offsets_s, specs)))
        return list(records), time.perf_counter() - start


def poisson_offsets(n: int, rate: float, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out
