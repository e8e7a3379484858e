"""Routing hashes of token blocks.

A prompt is cut into full blocks of `block_size` tokens (a partial last
block is never cached by the engine, so it never counts). Block i's hash
chains block i-1's hash with block i's tokens, so equal hashes at position i
mean equal prefixes up to and including block i — the structure of the
engine's own prefix-cache hashes:

    hash_i = hash((hash_{i-1}, tokens of block i)),   hash_{-1} = ROOT_HASH

`hash` is CPython's tuple hash (xxHash-based, 64-bit), which for tuples of
ints is the same in every process and needs no per-block allocation beyond
the slice: the chain costs ~0.4 us a block, for prompts and for KV events
alike (most events carry one or a few blocks, where vectorised hashing loses
to its own call overhead).

These hashes are ours, not the engine's: engines hash with a per-process
seed and their own algorithm, but publish each stored block's token ids, so
the index hashes those with this same function and maps engine hashes to
ours. They steer routing only; a collision (odds ~2^-64 per pair) costs a
worse route, never a wrong answer — the engine checks its own hashes.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

ROOT_HASH = 0x2545F4914F6CDD1D  # the empty prefix: parent of every prompt's first block


def block_hashes(token_ids: Sequence[int], block_size: int, parent: int = ROOT_HASH) -> list[int]:
    """Chained hashes of every full block of `token_ids`, continuing `parent`."""
    tokens = token_ids if isinstance(token_ids, tuple) else tuple(token_ids)
    out = []
    h = parent
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hash((h, tokens[start : start + block_size]))
        out.append(h)
    return out


def iter_block_hashes(token_ids: Sequence[int], block_size: int, parent: int = ROOT_HASH) -> Iterator[int]:
    """`block_hashes`, one at a time: for walks that stop at the first miss."""
    tokens = token_ids if isinstance(token_ids, tuple) else tuple(token_ids)
    h = parent
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hash((h, tokens[start : start + block_size]))
        yield h
