"""vLLM's `stream_interval`: how many tokens one streamed event of a choice
carries at least. A choice's first tokens and its finish go at once; between,
chunks are held and merged until `interval` tokens are waiting."""

from __future__ import annotations

from orchestrator.messages import EngineChunk


class ChunkInterval:
    def __init__(self, interval: int = 1) -> None:
        self.interval = interval
        self.pending: list[EngineChunk] = []
        self.waiting = 0  # tokens in `pending`
        self.sent_tokens = False

    def take(self, chunk: EngineChunk) -> EngineChunk | None:
        """The chunk to send now (this one, or those held merged with it), or None to hold it."""
        if self.interval == 1 and not self.pending:
            return chunk
        self.pending.append(chunk)
        self.waiting += len(chunk.token_ids)
        first = self.waiting and not self.sent_tokens
        if not (chunk.finished or first or self.waiting >= self.interval):
            return None
        ready = EngineChunk.merged(self.pending)
        self.sent_tokens = self.sent_tokens or bool(self.waiting)
        self.pending, self.waiting = [], 0
        return ready
