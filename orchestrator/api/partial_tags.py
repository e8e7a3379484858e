"""Streaming past tags the model writes (`<think>`, `<tool_call>`): what may be sent yet."""

from __future__ import annotations


def held_back(text: str, tag: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `tag`:
    characters that may still turn out to begin `tag`, so not sent yet."""
    for keep in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-keep:]):
            return keep
    return 0
