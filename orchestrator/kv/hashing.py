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

A request's `cache_salt` (vLLM's extension) starts its chain at a root of
its own, `prefix_root(salt)`: as in the engine, where the salt joins the
first block's hash, equal tokens under different salts share no block. The
root is a digest of the salt, the same in every process (str's `hash` is
not); no salt is ROOT_HASH. A request's LoRA adapter does the same (vLLM
joins its name to every block's hash): the root of (salt, adapter), so an
adapter's blocks are hits for that adapter's prompts alone.

These hashes are ours, not the engine's: engines hash with a per-process
seed and their own algorithm, but publish each stored block's token ids, so
the index hashes those with this same function and maps engine hashes to
ours. They steer routing only; a collision (odds ~2^-64 per pair) costs a
worse route, never a wrong answer — the engine checks its own hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from functools import lru_cache

ROOT_HASH = 0x2545F4914F6CDD1D  # the empty prefix: parent of every unsalted prompt's first block


def prefix_root(cache_salt: str | None, lora_name: str | None = None) -> int:
    """The parent of a prompt's first block: ROOT_HASH, or the root of its salt and adapter."""
    if cache_salt is None and lora_name is None:
        return ROOT_HASH
    return _namespaced_root(cache_salt, lora_name)


@lru_cache(maxsize=4096)
def _namespaced_root(cache_salt: str | None, lora_name: str | None) -> int:
    root = ROOT_HASH
    if cache_salt is not None:
        digest = hashlib.blake2b(cache_salt.encode(), digest_size=8, person=b"cache_salt").digest()
        root = hash((root, int.from_bytes(digest, "big")))
    if lora_name is not None:
        digest = hashlib.blake2b(lora_name.encode(), digest_size=8, person=b"lora_name").digest()
        root = hash((root, int.from_bytes(digest, "big")))
    return root


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
