"""One streamed OpenAI completion, timed the way vLLM's `bench serve` and
AIPerf time it: TTFT is arrival of the first chunk carrying output, ITL the
gaps between later output chunks, E2E the whole request."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class RequestRecord:
    ok: bool
    start_s: float = 0.0  # perf_counter at send
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float | None = None
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, where the server reports it
    text: str = ""
    error: str | None = None


def _content(event: dict[str, Any]) -> str:
    choice = (event.get("choices") or [{}])[0]
    if "text" in choice:
        return choice.get("text") or ""
    return (choice.get("delta") or {}).get("content") or ""


async def _sse_lines(response: httpx.Response):
    """Lines as SSE defines them (\\n, \\r\\n or \\r), unlike str.splitlines,
    which also breaks at Unicode separators that may sit inside the JSON."""
    buffer = ""
    async for text in response.aiter_text():
        buffer += text
        *lines, buffer = buffer.replace("\r\n", "\n").replace("\r", "\n").split("\n")
        for line in lines:
            yield line
    if buffer:
        yield buffer


async def stream_events(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    record: RequestRecord,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[dict[str, Any]]:
    """POST `body` and yield the stream's JSON events, the usage fields copied
    into `record` as they come. An HTTP error status, an undecodable event or
    an error event sets `record.error` and ends the stream."""
    async with client.stream("POST", url, json=body, headers=headers) as r:
        if r.status_code != 200:
            record.error = f"http_{r.status_code}"
            await r.aread()
            return
        async for line in _sse_lines(r):
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                return
            try:
                event = json.loads(data)
            except json.JSONDecodeError:
                record.error = "bad_event"
                return
            if "error" in event:
                record.error = "stream_error"
                return
            usage = event.get("usage")
            if usage:
                record.output_tokens = usage["completion_tokens"]
                record.prompt_tokens = usage["prompt_tokens"]
                details = usage.get("prompt_tokens_details") or {}
                record.cached_tokens = details.get("cached_tokens")
            yield event


async def stream_completion(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> RequestRecord:
    """POST `body` (with `headers`) with streaming and usage on; never raises for server errors."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    record = RequestRecord(ok=False, start_s=start)
    last = None
    try:
        async for event in stream_events(client, url, body, record, headers):
            text = _content(event)
            finish = any(c.get("finish_reason") for c in event.get("choices") or [])
            # Output arrives as text; a request whose tokens all detokenize
            # to nothing (special tokens, a partial UTF-8 character) shows
            # its first token only with the finish reason.
            if text or (finish and last is None):
                now = time.perf_counter()
                if last is None:
                    record.ttft_s = now - start
                else:
                    record.itl_s.append(now - last)
                last = now
                record.text += text
    except httpx.HTTPError as e:
        record.error = type(e).__name__
        return record
    if record.error:
        return record
    record.e2e_s = time.perf_counter() - start
    record.ok = record.ttft_s is not None
    if not record.ok:
        record.error = "no_output"
    return record


# kv_transfer_params that ask a vLLM prefill server to keep the prompt's KV for a remote decode.
REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


async def pd_completion(
    client: httpx.AsyncClient, prefill_url: str, decode_url: str, body: dict[str, Any]
) -> RequestRecord:
    """One request disaggregated across two vLLM servers with the client as the
    proxy (vLLM's own P/D flow): the prefill server computes the prompt with
    one output token and returns `kv_transfer_params`; the decode server,
    given them, reads the KV over NIXL and streams. Timed from the prefill's
    send, like any other request."""
    start = time.perf_counter()
    prefill_body = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": REMOTE_DECODE}
    prefill_body.pop("stream_options", None)
    try:
        r = await client.post(prefill_url, json=prefill_body)
    except httpx.HTTPError as e:
        return RequestRecord(ok=False, start_s=start, error=type(e).__name__)
    if r.status_code != 200 or not r.json().get("kv_transfer_params"):
        return RequestRecord(ok=False, start_s=start, error=f"prefill_http_{r.status_code}")
    record = await stream_completion(client, decode_url, {**body, "kv_transfer_params": r.json()["kv_transfer_params"]})
    shift = record.start_s - start
    record.start_s = start
    if record.ttft_s is not None:
        record.ttft_s += shift
    if record.e2e_s is not None:
        record.e2e_s += shift
    return record
