"""Where a tool call begins in a streamed output (`tool_choice: "auto"`), found in one pass.

A stream's content flows until a call begins; what may be sent depends only
on the parser's openers (orchestrator/api/tool_parsers.py):

    openers None        -> a call may begin anywhere: nothing is sent before the finish
    anchored            -> a call begins at 0 iff the output begins with an opener;
                           while the output is a proper prefix of one, it is held
    else                -> the first opener anywhere begins a call; a suffix that may
                           begin one is held

Each piece is read once: the scan keeps only the last (longest opener - 1)
characters, or, anchored and undecided, the output so far (shorter than an
opener). So a stream's cost is linear in its length.
"""

from __future__ import annotations

from orchestrator.api.partial_tags import held_back


class CallOpenerScan:
    def __init__(self, openers: tuple[str, ...] | None, anchored: bool) -> None:
        self.openers = openers
        self.anchored = anchored
        self._keep = max(map(len, openers), default=1) - 1 if openers else 0
        self.length = 0  # characters fed
        self.call_at: int | None = None  # where the first call begins
        self._decided = False  # anchored: whether the output's beginning is known to open no call
        self._tail = ""  # the last characters fed, where an opener may still be completed

    def feed(self, piece: str) -> int:
        """The output's next piece in; out, how many of its characters from the start are content
        that may be sent (all before `call_at` once a call has begun)."""
        start, self.length = self.length, self.length + len(piece)
        if self.call_at is not None:
            return self.call_at
        if self.openers is None:
            if self.length:
                self.call_at = 0
            return 0
        window = self._tail + piece
        if self.anchored:
            return self._feed_anchored(window)
        offset = start - len(self._tail)
        found = [at for opener in self.openers if (at := window.find(opener)) >= 0]
        if found:
            self.call_at = offset + min(found)
            return self.call_at
        self._tail = window[max(len(window) - self._keep, 0) :]
        return self.length - max(held_back(window, opener) for opener in self.openers)

    def _feed_anchored(self, head: str) -> int:
        """`head`: the output so far, while its beginning is undecided."""
        assert self.openers is not None
        if self._decided:
            return self.length
        if head.startswith(self.openers):
            self.call_at = 0
            return 0
        if any(opener.startswith(head) for opener in self.openers):
            self._tail = head
            return 0
        self._decided, self._tail = True, ""
        return self.length
