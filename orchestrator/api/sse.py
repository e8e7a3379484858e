"""Server-sent events framing for streamed OpenAI responses."""

from __future__ import annotations

import json
from typing import Any

DONE = "data: [DONE]\n\n"

# JSON leaves these unescaped, but many line readers (Python's splitlines,
# JavaScript) treat them as line breaks and would cut an event in two.
_LINE_BREAKS_JSON_KEEPS = str.maketrans({"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def event(payload: dict[str, Any]) -> str:
    """One SSE `data:` event on one line: JSON escapes control characters, and
    the Unicode line separators it would keep are escaped here."""
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).translate(_LINE_BREAKS_JSON_KEEPS)
    return f"data: {data}\n\n"


def parse_events(stream_text: str) -> list[dict[str, Any] | str]:
    """Inverse of `event` over a whole stream: each payload, or "[DONE]"."""
    out: list[dict[str, Any] | str] = []
    for block in stream_text.split("\n\n"):
        block = block.strip()
        if not block:
            continue
        if not block.startswith("data: "):
            raise ValueError(f"not an SSE data event: {block[:80]!r}")
        data = block[len("data: ") :]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out
