"""One choice's output so far, and its OpenAI form: a whole choice, or stream deltas.

A streamed choice reads each chunk once: the chunk's text goes through the
reasoning splitter's `feed` and, for tool_choice "auto", the call-opener scan,
which carry their state from chunk to chunk; whole-text reads happen once, at
the finish (the calls) or for a whole answer. So a stream's cost is linear in
its length.
"""

from __future__ import annotations

import uuid
from typing import Any

from orchestrator.api.call_opener import CallOpenerScan
from orchestrator.api.logprobs import CompletionLogprobs, Unscored, chat_logprobs, prompt_logprobs_body
from orchestrator.api.prepared import ChoicePlan, PreparedRequest
from orchestrator.api.responses import Endpoint, chat_choice, chat_delta, completion_choice
from orchestrator.api.stream_interval import ChunkInterval
from orchestrator.messages import CompletionTotals, EngineChunk, FinishReason, PositionLogprobs
from orchestrator.request_path import RequestTrace


class ChoiceState:
    """One choice's output so far, and its OpenAI form, whole or as stream deltas."""

    def __init__(self, plan: ChoicePlan, p: PreparedRequest) -> None:
        self.plan = plan
        self.endpoint = p.endpoint
        self.options = p.options
        self.totals = CompletionTotals()
        self.trace = RequestTrace()
        self.started = False  # a delta of this choice has been streamed
        self.call_id: str | None = None  # a named tool call's id, from its first delta
        # Streamed content: its pieces (joined once, where the calls are read at the finish); "auto":
        # where a call begins (`calls`), the characters sent and those read but not yet sent.
        self.content: list[str] = []
        tools = p.options.tools
        self.calls = (
            CallOpenerScan(tools.parser.openers, tools.parser.anchored)
            if tools is not None and tools.parser is not None
            else None
        )
        self.sent_chars = 0
        self.unsent = ""
        top = p.options.top_logprobs
        self.completion_logprobs = (
            CompletionLogprobs(top, p.options.tokens_as_ids)
            if top is not None and p.endpoint is Endpoint.COMPLETIONS
            else None
        )
        self.prompt_ids = list(plan.request.prompt_token_ids) if p.options.return_token_ids else None
        self.held = ChunkInterval(p.options.stream_interval)
        reasoning = p.options.reasoning
        self.splitter = (
            reasoning.splitter(dict(p.options.template_variables), plan.request.prompt_token_ids)
            if reasoning is not None
            else None
        )

    def with_usage(self, event: dict[str, Any], continuous: bool) -> dict[str, Any]:
        """`event`, with this choice's usage so far when the stream reports it continuously (vLLM's:
        its prompt's tokens, the tokens it has generated, their sum)."""
        if not continuous:
            return event
        prompt, generated = len(self.plan.request.prompt_token_ids), len(self.totals.token_ids)
        return event | {
            "usage": {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated}
        }

    def cached_tokens(self) -> int:
        prefill = self.trace.prefill
        return prefill.num_cached_tokens if prefill is not None else self.totals.num_cached_tokens

    @staticmethod
    def _finish_reason(reason: FinishReason | None) -> str | None:
        return reason.value if reason is not None else None

    def _logprobs(self, positions: Any) -> dict[str, Any] | None:
        top = self.options.top_logprobs
        if top is None:
            return None
        if self.completion_logprobs is not None:
            return self.completion_logprobs.body(positions or ())
        return chat_logprobs(positions or (), top, self.options.tokens_as_ids)

    def _token_ids(self, token_ids: Any) -> list[int] | None:
        return list(token_ids) if self.options.return_token_ids and not self.options.hide_reasoning else None

    def prompt_logprobs(self) -> list[dict[str, Any] | None] | None:
        """The `prompt_logprobs` field, when asked for."""
        if not self.options.prompt_logprobs:
            return None
        return prompt_logprobs_body(self.totals.prompt_logprobs or ())

    def _echoed_positions(self, prompt: Any) -> list[PositionLogprobs | Unscored]:
        """Echo with logprobs: the prompt's positions, its first token unscored."""
        first = Unscored(self.plan.request.prompt_token_ids[0], self.plan.first_token)
        return [first if p is None else p for p in prompt or ()]

    # -- whole ------------------------------------------------------------------

    def whole_choice(self) -> dict[str, Any]:
        t = self.totals
        finish = self._finish_reason(t.finish_reason)
        if self.endpoint is Endpoint.COMPLETIONS:
            positions = [] if self.plan.prompt_only else list(t.logprobs)
            if self.plan.echo and self.completion_logprobs is not None:
                positions = self._echoed_positions(t.prompt_logprobs) + positions
            logprobs = self._logprobs(positions)
            text = self.plan.echo + ("" if self.plan.prompt_only else t.text)
            ids = self._token_ids(t.token_ids)
            return completion_choice(
                self.plan.index, text, finish, logprobs, ids, self.prompt_ids, self.prompt_logprobs(), t.stop_reason
            )
        logprobs = self._logprobs(t.logprobs)
        tools = self.options.tools
        reasoning, answer = self.splitter.split(t.text, t.token_ids) if self.splitter is not None else (None, t.text)
        answer = answer or ""
        content, calls = tools.message(answer) if tools is not None else (answer, None)
        role = self.options.role
        if self.plan.echo:
            content = self.plan.echo + (content or "")
        message: dict[str, Any] = {"role": role, "content": content}
        if self.options.reasoning is not None:
            shown = None if self.options.hide_reasoning else reasoning
            message = {"role": role, "reasoning": shown, "content": content or None}
        if calls is not None and tools.parser is not None:
            message["content"] = content or None  # auto: the text before the calls, if any (as vLLM)
        if calls is not None:
            message["tool_calls"] = calls
            finish = tools.finish_reason(finish, called=True)
        return chat_choice(self.plan.index, message, finish, logprobs, self._token_ids(t.token_ids), t.stop_reason)

    # -- streamed ---------------------------------------------------------------

    def delta(self, c: EngineChunk) -> dict[str, Any] | None:
        """This chunk's choice delta, or None when it carries nothing to send. Each chunk is
        read once: the reasoning and tool-call readers carry their state forward, and see
        every chunk (a format's marker may be a token with no text)."""
        self.totals.add(c)
        chat = self.endpoint is Endpoint.CHAT
        reasoning, content = (
            ("", c.text) if self.splitter is None or not chat else self.splitter.feed(c.text, c.token_ids, c.finished)
        )
        ids = self.options.return_token_ids
        positions: list[PositionLogprobs | Unscored] = [] if self.plan.prompt_only else list(c.logprobs or ())
        if not self.started and self.plan.echo and self.completion_logprobs is not None:
            positions = self._echoed_positions(c.prompt_logprobs) + positions
        logprobs = self._logprobs(positions) if positions else None
        if not (c.text or c.finished or logprobs or (ids and c.token_ids)):
            return None
        first = not self.started
        self.started = True
        finish = self._finish_reason(c.finish_reason)
        if not chat:
            text = (self.plan.echo if first else "") + ("" if self.plan.prompt_only else c.text)
            prompt_ids = self.prompt_ids if first else None
            ids = self._token_ids(c.token_ids)
            return completion_choice(
                self.plan.index, text, finish, logprobs, ids, prompt_ids, stop_reason=c.stop_reason
            )
        delta, finish = self._chat_delta(content, c.finished, finish)
        if reasoning and not self.options.hide_reasoning:
            delta = {"reasoning": reasoning, **(delta or {})}
        if delta is None and not logprobs:
            return None
        ids = self._token_ids(c.token_ids)
        return chat_delta(self.plan.index, delta or {}, finish, logprobs, ids, c.stop_reason)

    def _chat_delta(self, piece: str, finished: bool, finish: str | None) -> tuple[dict[str, Any] | None, str | None]:
        """The delta of the answer's next content `piece`, as the tool mode shapes it."""
        tools = self.options.tools
        if self.calls is not None:
            return self._auto_delta(piece, finished, finish)
        if tools is not None and tools.named is None:  # "required": the calls are read from the whole output
            self.content.append(piece)
            if not finished:
                return None, None
            _, calls = tools.message("".join(self.content))
            if not calls:  # no list of calls: nothing was a call, and nothing is content
                return {}, finish
            return {"tool_calls": [{"index": k, **call} for k, call in enumerate(calls)]}, tools.finish_reason(
                finish, True
            )
        if tools is None:
            return ({"content": piece} if piece else {}), finish
        if self.call_id is None:  # named: the arguments stream as they come, as vLLM streams a named call
            self.call_id = f"chatcmpl-tool-{uuid.uuid4().hex}"
            call = {"index": 0, "id": self.call_id, "type": "function"}
            call["function"] = {"name": tools.named, "arguments": piece}
            return {"tool_calls": [call]}, finish
        return ({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]} if piece else {}), finish

    def _auto_delta(self, piece: str, finished: bool, finish: str | None) -> tuple[dict[str, Any] | None, str | None]:
        """ "auto": content streams until a call begins (a suffix that may begin one held
        back); the calls are read from the whole output and sent with the finish.
        An output already streamed as content (no call began where the parser
        looks for one) stays content, as vLLM streams it."""
        tools, scan = self.options.tools, self.calls
        assert tools is not None and scan is not None
        self.content.append(piece)
        began = scan.call_at is not None
        end = scan.feed(piece)
        if not began:  # `unsent` is the output past what was sent, while no call has begun
            self.unsent += piece
        delta: dict[str, Any] = {}
        calls = None
        if finished and scan.call_at is not None:
            text = "".join(self.content)
            content, calls = tools.message(text)
            # A parser's content is the text before its first call; one that trims it leaves nothing more to send.
            if len(content) > self.sent_chars and content.startswith(text[: self.sent_chars]):
                delta["content"] = content[self.sent_chars :]
        else:
            end = scan.length if finished else end
            if end > self.sent_chars:
                delta["content"] = self.unsent[: end - self.sent_chars]
                self.unsent = self.unsent[end - self.sent_chars :]
                self.sent_chars = end
        if calls:
            delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(calls)]
        if not finished:
            return (delta or None), None
        return delta, tools.finish_reason(finish, bool(calls))
