"""Routing hashes of token blocks.

A prompt is cut into full blocks of `block_size` tokens (a partial last
block is never cached by the engine, so it never counts). Block i's hash
chains its tokens with block i-1's hash, so equal hashes at position i mean
equal prefixes up to and including block i — the same structure as the
engine's own prefix-cache hashes.

These hashes are ours, not the engine's: engines hash with a per-process
seed and their own algorithm, but publish each stored block's token ids, so
the index hashes those with this same function and maps engine hashes to
ours. They steer routing only; a collision (odds ~2^-64 per pair) costs a
worse route, never a wrong answer — the engine checks its own hashes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MASK64 = (1 << 64) - 1
# Hash of the empty prefix: the parent of every prompt's first block.
ROOT_HASH = 0x9E3779B97F4A7C15
_MULTIPLIER = np.uint64(0x100000001B3)  # odd: token position weights stay distinct mod 2^64


def _powers(block_size: int) -> np.ndarray:
    powers = np.empty(block_size, dtype=np.uint64)
    acc = np.uint64(1)
    with np.errstate(over="ignore"):
        for i in range(block_size):
            powers[block_size - 1 - i] = acc
            acc = acc * _MULTIPLIER
    return powers


_POWERS: dict[int, np.ndarray] = {}


def _mix(x: int) -> int:
    """splitmix64 finaliser: spreads every input bit over the output."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & MASK64
    return x ^ (x >> 31)


def block_contents(token_ids: Sequence[int] | np.ndarray, block_size: int) -> list[int]:
    """One 64-bit content hash per full block (not yet chained)."""
    n_blocks = len(token_ids) // block_size
    if n_blocks == 0:
        return []
    powers = _POWERS.get(block_size)
    if powers is None:
        powers = _POWERS[block_size] = _powers(block_size)
    tokens = np.asarray(token_ids[: n_blocks * block_size], dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        contents = (tokens.reshape(n_blocks, block_size) * powers).sum(axis=1, dtype=np.uint64)
    return contents.tolist()


def chain(contents: Sequence[int], parent: int = ROOT_HASH) -> list[int]:
    """Chain content hashes onto `parent`: hash_i = mix(hash_{i-1} + content_i)."""
    out = []
    h = parent
    for c in contents:
        h = _mix((h * 0x9E3779B97F4A7C15 + c + 1) & MASK64)
        out.append(h)
    return out


def block_hashes(token_ids: Sequence[int] | np.ndarray, block_size: int, parent: int = ROOT_HASH) -> list[int]:
    """Chained hashes of every full block of `token_ids`."""
    return chain(block_contents(token_ids, block_size), parent)
