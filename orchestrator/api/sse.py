"""Server-sent events framing for streamed OpenAI responses."""

from __future__ import annotations

import json
from typing import Any

DONE = "data: [DONE]\n\n"


def event(payload: dict[str, Any]) -> str:
    """One SSE `data:` event. JSON never contains a raw newline, so one line suffices."""
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


def parse_events(stream_text: str) -> list[dict[str, Any] | str]:
    """Inverse of `event` over a whole stream: each payload, or "[DONE]"."""
    out: list[dict[str, Any] | str] = []
    for block in stream_text.split("\n\n"):
        block = block.strip()
        if not block:
            continue
        if not block.startswith("data: "):
            raise ValueError(f"not an SSE data event: {block[:80]!r}")
        data = block[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out
