"""Workloads: what each benchmark request asks for, with exact token lengths.

Prompts are token ids, not text, so lengths are exact for the target
tokenizer (sent as `prompt: [ids]` to /v1/completions, as vLLM's own
benchmark does for random data). Every workload is deterministic for a seed.

- synthetic: input/output lengths fixed or drawn from a distribution, a
  fraction of each prompt taken from one of a few shared prefixes;
- Mooncake conversation trace: each `hash_id` is one block of the original
  512 tokens; equal ids at equal positions are shared prefixes. Blocks are
  scaled down to `block_tokens` tokens (each id becomes a fixed random block
  of that many tokens) and every length by the same factor, so the sharing
  structure is preserved for a small model;
- Azure 2023 conversation trace: lengths and arrival times only; prompts are
  random tokens (no sharing).
Trace workloads carry each request's arrival time (seconds from the start).
"""

from __future__ import annotations

import csv
import json
import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Literal

# Ids below this are left out of random prompts (special tokens live there).
FIRST_TOKEN_ID = 10
MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True)
class TokenPool:
    """The token ids random prompts are drawn from."""

    ids: tuple[int, ...]
    name: str

    @classmethod
    def vocabulary(cls, vocab_size: int) -> TokenPool:
        return cls(tuple(range(FIRST_TOKEN_ID, vocab_size)), f"ids {FIRST_TOKEN_ID}..{vocab_size - 1}")

    @classmethod
    def words(cls, tokenizer) -> TokenPool:
        """Ids of whole space-prefixed words that decode and re-encode to
        themselves: any sequence of them survives text round trips exactly,
        for servers and routers that only take text prompts."""
        ids = []
        for i in range(len(tokenizer)):
            text = tokenizer.decode([i])
            if (
                len(text) > 2
                and text[0] == " "
                and text[1:].isascii()
                and text[1:].isalpha()
                and tokenizer.encode(text, add_special_tokens=False) == [i]
            ):
                ids.append(i)
        if len(ids) < 16:
            raise ValueError("the tokenizer has too few whole-word tokens for text prompts")
        return cls(tuple(ids), f"{len(ids)} whole-word tokens")

    def describe(self) -> dict:
        return {"name": self.name, "size": len(self.ids)}


@dataclass(frozen=True)
class RequestSpec:
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival_s: float | None = None  # trace replay: when to send, from the start
    model: str | None = None  # the `model` to name (a LoRA adapter); None: the target's
    headers: tuple[tuple[str, str], ...] = ()  # sent with the request (an API key, x-slo-class)


@dataclass(frozen=True)
class LengthDist:
    """A length: fixed (`std` 0) or normal around `mean`, clipped to [min, max]."""

    mean: int
    std: float = 0.0
    min: int = 1
    max: int | None = None

    def draw(self, rng: random.Random) -> int:
        value = self.mean if self.std <= 0 else round(rng.gauss(self.mean, self.std))
        return max(self.min, min(value, self.max if self.max is not None else value))


@dataclass(frozen=True)
class SyntheticWorkload:
    isl: LengthDist
    osl: LengthDist
    pool: TokenPool
    shared_prefix_fraction: float = 0.0  # of each prompt, taken from a shared prefix
    num_prefixes: int = 1
    seed: int = 0
    kind: Literal["synthetic"] = "synthetic"

    def requests(self, n: int) -> list[RequestSpec]:
        rng = random.Random(self.seed)
        longest = self.isl.max or self.isl.mean * 4
        prefixes = [
            _random_tokens(random.Random(f"prefix-{self.seed}-{i}"), longest, self.pool)
            for i in range(self.num_prefixes)
        ]
        out = []
        for _ in range(n):
            isl = self.isl.draw(rng)
            shared = min(int(isl * self.shared_prefix_fraction), len(prefixes[0]))
            prefix = prefixes[rng.randrange(self.num_prefixes)][:shared] if shared else ()
            out.append(RequestSpec(tuple(prefix) + _random_tokens(rng, isl - shared, self.pool), self.osl.draw(rng)))
        return out

    def describe(self) -> dict:
        return asdict(self) | {"pool": self.pool.describe()}


@dataclass(frozen=True)
class MooncakeTrace:
    path: str
    pool: TokenPool
    block_tokens: int = 32  # tokens per hash id after scaling (512 in the original)
    osl_scale: float | None = None  # default: the same factor as the prompt
    max_osl: int | None = None
    max_isl: int | None = None  # requests longer than this (after scaling) are skipped
    kind: Literal["mooncake"] = "mooncake"

    @property
    def scale(self) -> float:
        return self.block_tokens / MOONCAKE_BLOCK_TOKENS

    def block(self, hash_id: int) -> tuple[int, ...]:
        return _random_tokens(random.Random(f"mooncake-{hash_id}"), self.block_tokens, self.pool)

    def requests(self, n: int | None = None) -> list[RequestSpec]:
        out = []
        osl_scale = self.scale if self.osl_scale is None else self.osl_scale
        blocks: dict[int, tuple[int, ...]] = {}  # hash ids recur across requests: that is the point
        with open(self.path) as f:
            for line in f:
                if n is not None and len(out) >= n:
                    break
                row = json.loads(line)
                hash_ids = row["hash_ids"]
                isl = max(1, min(math.ceil(row["input_length"] * self.scale), len(hash_ids) * self.block_tokens))
                if self.max_isl is not None and isl > self.max_isl:
                    continue
                tokens: list[int] = []
                for hash_id in hash_ids:
                    block = blocks.get(hash_id)
                    if block is None:
                        block = blocks[hash_id] = self.block(hash_id)
                    tokens.extend(block)
                osl = max(1, round(row["output_length"] * osl_scale))
                if self.max_osl is not None:
                    osl = min(osl, self.max_osl)
                out.append(RequestSpec(tuple(tokens[:isl]), osl, arrival_s=row["timestamp"] / 1000.0))
        return out

    def describe(self) -> dict:
        return asdict(self) | {"path": Path(self.path).name, "pool": self.pool.describe()}


@dataclass(frozen=True)
class AzureTrace:
    path: str
    pool: TokenPool
    isl_scale: float = 1.0
    osl_scale: float = 1.0
    max_isl: int | None = None
    max_osl: int | None = None
    seed: int = 0
    kind: Literal["azure"] = "azure"

    def requests(self, n: int | None = None) -> list[RequestSpec]:
        rng = random.Random(self.seed)
        out: list[RequestSpec] = []
        start = None
        with open(self.path) as f:
            for row in csv.DictReader(f):
                if n is not None and len(out) >= n:
                    break
                at = datetime.fromisoformat(row["TIMESTAMP"][:26])
                start = start or at
                isl = max(1, round(int(row["ContextTokens"]) * self.isl_scale))
                osl = max(1, round(int(row["GeneratedTokens"]) * self.osl_scale))
                if self.max_isl is not None and isl > self.max_isl:
                    continue
                if self.max_osl is not None:
                    osl = min(osl, self.max_osl)
                out.append(
                    RequestSpec(_random_tokens(rng, isl, self.pool), osl, arrival_s=(at - start).total_seconds())
                )
        return out

    def describe(self) -> dict:
        return asdict(self) | {"path": Path(self.path).name, "pool": self.pool.describe()}


def _random_tokens(rng: random.Random, n: int, pool: TokenPool) -> tuple[int, ...]:
    return tuple(rng.choices(pool.ids, k=n)) if n > 0 else ()


def replay_offsets(specs: list[RequestSpec], time_scale: float = 1.0, rate_scale: float = 1.0) -> list[float]:
    """Trace replay: when to send each request, in seconds from the start.
    `time_scale` < 1 compresses time; `rate_scale` > 1 sends the same requests
    at that many times the rate (both shrink the gaps)."""
    first = (specs[0].arrival_s or 0.0) if specs else 0.0
    factor = time_scale / rate_scale
    return [((s.arrival_s or 0.0) - first) * factor for s in specs]


def phase_requests(
    minutes: float,
    rate: float,
    prefill_phase: tuple[int, int],
    decode_phase: tuple[int, int],
    seed: int,
    token_range: tuple[int, int],
) -> list[RequestSpec]:
    """Poisson arrivals at rate x (1 + 0.6 sin(2 pi t / (T/3))) (thinning of
    a Poisson process at 1.6 x rate), unique prompts of token ids in
    `token_range`; (ISL, OSL) `prefill_phase` in the first half of the run,
    `decode_phase` in the second."""
    rng = random.Random(seed)
    horizon, out, t, peak = minutes * 60, [], 0.0, rate * 1.6
    while True:
        t += rng.expovariate(peak)
        if t >= horizon:
            return out
        if rng.random() > (1 + 0.6 * math.sin(2 * math.pi * t / (horizon / 3))) / 1.6:
            continue
        isl, osl = prefill_phase if t < horizon / 2 else decode_phase
        out.append(RequestSpec(tuple(rng.randrange(*token_range) for _ in range(isl)), osl, arrival_s=t))


# -- generated load shapes for the planner's train/test workloads -------------------------------------------------


@dataclass(frozen=True)
class LogNormalLength:
    """A length drawn log-normally by its median and mean (mean > median: a right tail), clipped."""

    median: float
    mean: float
    min: int = 1
    max: int = 16384

    def draw(self, rng: random.Random) -> int:
        sigma = math.sqrt(2 * math.log(self.mean / self.median)) if self.mean > self.median else 0.0
        return max(self.min, min(round(rng.lognormvariate(math.log(self.median), sigma)), self.max))


def _unique_prompt(rng: random.Random, isl: int, token_range: tuple[int, int]) -> tuple[int, ...]:
    return tuple(rng.choices(range(*token_range), k=isl))


def _arrivals(
    minutes: float,
    rng: random.Random,
    gap: Callable[[], float],
    token_range: tuple[int, int],
    isl: LogNormalLength,
    osl: LogNormalLength,
    keep: Callable[[float], bool] = lambda t: True,
) -> list[RequestSpec]:
    """Requests whose arrival times step by `gap()` over the run, each kept when `keep(t)` (thinning),
    with a unique prompt of `isl` and `osl` output tokens."""
    horizon, out, t = minutes * 60, [], 0.0
    while True:
        t += gap()
        if t >= horizon:
            return out
        if keep(t):
            out.append(RequestSpec(_unique_prompt(rng, isl.draw(rng), token_range), osl.draw(rng), arrival_s=t))


def bursty_prefill_requests(
    minutes: float,
    rate: float,
    seed: int,
    token_range: tuple[int, int],
    burst_cv: float = 2.5,
    isl: LogNormalLength = LogNormalLength(median=1470, mean=2000, min=64, max=8192),
    osl: LogNormalLength = LogNormalLength(median=20, mean=28, min=2, max=512),
) -> list[RequestSpec]:
    """Code-completion-like: long prompts, short outputs, arriving in bursts. Gaps between
    arrivals are gamma distributed with mean 1 / `rate` and coefficient of variation
    `burst_cv` (1 would be Poisson; 2.5 packs most requests into clusters)."""
    rng = random.Random(seed)
    shape = 1 / burst_cv**2
    return _arrivals(minutes, rng, lambda: rng.gammavariate(shape, 1 / (rate * shape)), token_range, isl, osl)


def poisson_requests(
    minutes: float,
    rate: float,
    seed: int,
    token_range: tuple[int, int],
    isl: LogNormalLength,
    osl: LogNormalLength,
) -> list[RequestSpec]:
    """Poisson arrivals at `rate`, unique prompts of `isl`, `osl` output tokens."""
    rng = random.Random(seed)
    return _arrivals(minutes, rng, lambda: rng.expovariate(rate), token_range, isl, osl)


def decode_heavy_requests(
    minutes: float,
    rate: float,
    seed: int,
    token_range: tuple[int, int],
    isl: LogNormalLength = LogNormalLength(median=250, mean=300, min=16, max=2048),
    osl: LogNormalLength = LogNormalLength(median=600, mean=800, min=32, max=4096),
) -> list[RequestSpec]:
    """Long outputs after short prompts (summaries, long-form generation), Poisson arrivals."""
    return poisson_requests(minutes, rate, seed, token_range, isl, osl)


def diurnal_requests(
    minutes: float,
    peak_rate: float,
    seed: int,
    token_range: tuple[int, int],
    trough: float = 0.15,
    isl: LogNormalLength = LogNormalLength(median=800, mean=1100, min=16, max=8192),
    osl: LogNormalLength = LogNormalLength(median=150, mean=200, min=4, max=2048),
) -> list[RequestSpec]:
    """One day compressed into the run: the rate ramps from `trough` x `peak_rate` at the start up
    to `peak_rate` half-way and back down (a raised cosine), conversation-like lengths; Poisson
    arrivals at that rate (thinning)."""
    rng = random.Random(seed)
    horizon = minutes * 60

    def keep(t: float) -> bool:
        return rng.random() <= trough + (1 - trough) * (1 - math.cos(2 * math.pi * t / horizon)) / 2

    return _arrivals(minutes, rng, lambda: rng.expovariate(peak_rate), token_range, isl, osl, keep)
