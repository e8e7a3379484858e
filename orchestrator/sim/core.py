"""The simulated engine's scheduler: continuous batching with chunked prefill,
as vLLM's v1 scheduler does it, timed by a performance model.

    each step:
      running requests first: one decode token each, or their next prompt
        chunk, within the step's token budget;
      then waiting requests, by priority (lower first), oldest first, while
        blocks and budget last (their cached prefix costs nothing);
      a running request that needs a block when none is free preempts the
        running request of the largest priority value, the newest among them
        (its blocks freed, it recomputes later);
      the step lasts perf_model.step_time(batch).

Output tokens are a deterministic function of the context (its last
CONTEXT_WINDOW tokens and its length), like greedy decoding of a real model:
equal prompts give equal outputs on every replica, and a request continued
elsewhere with its prompt plus the tokens it had goes on with the same tokens.
Disaggregation: a prefill-role request keeps its blocks after its first token
until the decode side has read them (`release`); a request that arrives with a
transfer waits for the transfer, then has its prompt's KV.

Time is the caller's: `step()` says how long the step takes, the driver
waits (real time under Ray Serve, virtual time in the cluster simulator).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from orchestrator.kv.events import KVEvent
from orchestrator.sim.block_manager import BlockManager, SequenceBlocks
from orchestrator.sim.lora_slots import EngineLoras, LoraSpec
from orchestrator.sim.perf_model import Batch, PerfModel

VOCAB = 32000


class State(enum.Enum):
    WAITING = "waiting"
    TRANSFERRING = "transferring"  # KV on its way from a prefill replica
    RUNNING = "running"
    HELD = "held"  # prefill done, blocks kept for a remote decode
    FINISHED = "finished"


@dataclass(slots=True)
class SimRequest:
    request_id: str
    prompt: list[int]
    max_tokens: int
    hold_for_transfer: bool = False  # prefill role: keep KV after the first token
    cache_salt: str | None = None  # vLLM's: the prompt's cached blocks are keyed under it
    lora_name: str | None = None  # the adapter it runs with: its cached blocks are keyed under it
    priority: int = 0  # its SLO class's: lower is scheduled first and preempted last (vLLM's priority policy)
    transfer_done_at: float | None = None  # decode of a remote prefill: KV arrives then
    state: State = State.WAITING
    seq: SequenceBlocks | None = None
    generated: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    transferred_tokens: int = 0
    preemptions: int = 0


class Emitted(NamedTuple):
    request_id: str
    token_id: int
    first: bool
    finished: bool
    cached_tokens: int = 0  # on a first token: prompt tokens found in the prefix cache


@dataclass
class StepResult:
    duration_s: float
    emitted: list[Emitted]
    events: list[KVEvent]


CONTEXT_WINDOW = 4


def next_token(tail: Sequence[int], length: int, vocab_size: int = VOCAB) -> int:
    """The simulated model's greedy choice after a context of `length` tokens
    ending in `tail` (its last CONTEXT_WINDOW tokens). Ids below 100 (special
    tokens, in small vocabularies half the ids) are never produced."""
    first = min(100, vocab_size // 2)
    return hash((tuple(tail), length)) % (vocab_size - first) + first


def greedy_output(prompt: Sequence[int], n: int, vocab_size: int = VOCAB) -> list[int]:
    """The n tokens an uninterrupted request for `prompt` emits."""
    context = list(prompt)
    for _ in range(n):
        context.append(next_token(context[-CONTEXT_WINDOW:], len(context), vocab_size))
    return context[len(prompt) :]


def _tail(req: SimRequest) -> list[int]:
    g = req.generated
    if len(g) >= CONTEXT_WINDOW:
        return g[-CONTEXT_WINDOW:]
    return req.prompt[-(CONTEXT_WINDOW - len(g)) :] + g


class SimCore:
    def __init__(
        self,
        perf: PerfModel,
        num_blocks: int,
        block_size: int,
        max_num_seqs: int = 256,
        max_batched_tokens: int = 8192,
        enable_prefix_caching: bool = True,
        vocab_size: int = VOCAB,
        lora: LoraSpec | None = None,
    ) -> None:
        self.perf = perf
        self.loras = EngineLoras(lora) if lora is not None else None  # None: no adapters (requests name none)
        self.vocab_size = vocab_size
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching)
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.transferring: list[SimRequest] = []
        self.held: dict[str, SimRequest] = {}
        self.requests: dict[str, SimRequest] = {}
        self.now = 0.0
        # Cumulative counters, as an engine reports them.
        self.prompt_tokens_computed = 0
        self.prompt_tokens_cached = 0
        self.prompt_tokens_transferred = 0
        self.generation_tokens = 0
        self.finished = 0

    # -- requests ---------------------------------------------------------------

    def add(self, req: SimRequest) -> None:
        self.requests[req.request_id] = req
        if req.transfer_done_at is not None:
            req.state = State.TRANSFERRING
            self.transferring.append(req)
        else:
            self._wait(req)

    def _wait(self, req: SimRequest, first: bool = False) -> None:
        """Into the waiting queue, after every request of its priority or less (`first`: before those of its
        priority); with equal priorities, the back (the front)."""
        if first and (not self.waiting or self.waiting[0].priority >= req.priority):
            self.waiting.appendleft(req)
            return
        if not first and (not self.waiting or self.waiting[-1].priority <= req.priority):
            self.waiting.append(req)
            return
        i = len(self.waiting)
        while i and (
            self.waiting[i - 1].priority > req.priority or (first and self.waiting[i - 1].priority == req.priority)
        ):
            i -= 1
        self.waiting.insert(i, req)

    def abort(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is None:
            return
        for queue in (self.running, self.transferring):
            if req in queue:
                queue.remove(req)
        if req in self.waiting:
            self.waiting.remove(req)
        self.held.pop(request_id, None)
        self._finish(req)

    def release(self, request_id: str) -> None:
        """The remote decode has read this prefill's KV: free it."""
        req = self.held.pop(request_id, None)
        if req is not None:
            self.requests.pop(request_id, None)
            self._finish(req)

    # -- load ---------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting) + len(self.transferring)

    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.transferring)

    def next_transfer_at(self) -> float | None:
        return min((r.transfer_done_at for r in self.transferring), default=None)

    # -- the step -------------------------------------------------------------------

    def step(self) -> StepResult:
        if self.transferring:
            self._land_transfers()
        budget = self.max_batched_tokens
        # (request, tokens to compute this step, whether they are prompt tokens)
        plan: list[tuple[SimRequest, int, bool]] = []
        for req in self.running:
            if budget <= 0:
                break
            budget -= self._plan(plan, req, budget)
        loras, adapters, load_s = self.loras, self._running_adapters(), 0.0
        skipped: list[SimRequest] = []  # waiting requests whose adapter would exceed max_loras (vLLM's rule)
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            if loras is not None and not loras.admits(adapters, req.lora_name):
                skipped.append(self.waiting.popleft())
                continue
            seq = self.blocks.allocate(req.prompt + req.generated, req.cache_salt, req.lora_name)
            if seq is None:
                break
            self.waiting.popleft()
            req.seq, req.state = seq, State.RUNNING
            if not req.preemptions:
                req.cached_tokens = seq.cached_tokens
                self.prompt_tokens_cached += seq.cached_tokens
            if req.lora_name is not None and loras is not None and req.lora_name not in adapters:
                adapters.add(req.lora_name)
                load_s += loras.activate(req.lora_name)
            self.running.append(req)
            budget -= self._plan(plan, req, budget)
        self.waiting.extendleft(reversed(skipped))
        if not plan:
            return StepResult(0.0, [], self.blocks.drain_events())
        batch = Batch(
            prefill=tuple((n, r.seq.computed_tokens) for r, n, prompt in plan if prompt),
            decode_contexts=tuple(len(r.prompt) + len(r.generated) for r, n, prompt in plan if not prompt),
        )
        duration = self.perf.step_time(batch) + load_s
        self.now += duration
        return StepResult(duration, self._advance(plan), self.blocks.drain_events())

    def _running_adapters(self) -> set[str]:
        if self.loras is None:
            return set()
        return {r.lora_name for r in self.running if r.lora_name is not None}

    @staticmethod
    def _plan(plan: list[tuple[SimRequest, int, bool]], req: SimRequest, budget: int) -> int:
        """Plan the request's next tokens within the budget. Pending tokens are
        those whose KV comes before its next output token; more than one, or
        none generated yet, means prompt work (a prompt, or after a preemption
        prompt and output so far); a decode step computes just the last token."""
        pending = len(req.prompt) + len(req.generated) - req.seq.computed_tokens
        n = pending if pending < budget else budget
        plan.append((req, n, pending > 1 or not req.generated))
        return n

    def _advance(self, plan: list[tuple[SimRequest, int, bool]]) -> list[Emitted]:
        emitted: list[Emitted] = []
        mark_computed, vocab, running = self.blocks.mark_computed, self.vocab_size, State.RUNNING
        for req, n, prompt in plan:
            if req.state is not running:
                continue  # preempted earlier in this step
            if prompt:
                self.prompt_tokens_computed += n
            seq = req.seq
            mark_computed(seq, n)
            generated = req.generated
            context = len(req.prompt) + len(generated)
            if context > seq.computed_tokens:
                continue  # more prompt chunks to go
            token = next_token(_tail(req), context, vocab)
            first = not generated
            generated.append(token)
            self.generation_tokens += 1
            done = len(generated) >= req.max_tokens
            emitted.append(
                Emitted(req.request_id, token, first, done or req.hold_for_transfer, req.cached_tokens if first else 0)
            )
            if req.hold_for_transfer:
                self.running.remove(req)
                req.state = State.HELD
                self.held[req.request_id] = req
            elif done:
                self.running.remove(req)
                self.requests.pop(req.request_id, None)
                self._finish(req)
            else:
                self._make_room(req, token)
        return emitted

    def _make_room(self, req: SimRequest, token: int) -> None:
        """The slot for the token just emitted. Out of blocks: the newest running
        request goes back to waiting, to recompute its prompt and the tokens
        it had (vLLM's recompute preemption), until the slot fits."""
        while not self.blocks.append_slot(req.seq, token):
            victim = max(reversed(self.running), key=lambda r: r.priority)  # the newest of the largest value
            self.running.remove(victim)
            self.blocks.free(victim.seq)
            victim.state, victim.seq = State.WAITING, None
            victim.preemptions += 1
            self._wait(victim, first=True)
            if victim is req:
                return  # it recomputes its context, the emitted token included, then goes on

    def _land_transfers(self) -> None:
        """Transfers whose KV has arrived: their prompts become computed blocks."""
        for req in [r for r in self.transferring if r.transfer_done_at <= self.now]:
            seq = self.blocks.allocate(req.prompt, req.cache_salt, req.lora_name)
            if seq is None:
                continue  # no room yet: it stays in transit
            self.transferring.remove(req)
            req.seq, req.state = seq, State.RUNNING
            req.cached_tokens = seq.cached_tokens
            moved = len(req.prompt) - 1 - seq.computed_tokens
            if moved > 0:
                self.blocks.mark_computed(seq, moved)
                req.transferred_tokens = moved
                self.prompt_tokens_transferred += moved
            self.running.append(req)

    def _finish(self, req: SimRequest) -> None:
        if req.seq is not None:
            self.blocks.free(req.seq)
            req.seq = None
        req.state = State.FINISHED
        self.finished += 1
