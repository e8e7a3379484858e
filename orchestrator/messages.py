"""Plain objects that cross the frontend <-> engine-replica boundary.

They are pickled by Ray between processes, so they hold only plain data:
no engine objects, no handles.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop string or a stop token
    LENGTH = "length"  # max_tokens or the model's context reached
    ABORT = "abort"  # cancelled by the client or the server


@dataclass(frozen=True)
class SamplingSpec:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0


@dataclass(frozen=True)
class KVTransfer:
    """Where a prompt's KV blocks wait after a remote prefill.

    Contract: the prefill replica that produced it owns those blocks until the
    decode replica named in the route reads them (NIXL READ) or the engine's
    lease on them expires; the frontend only carries this object from one to
    the other. `engine_params` is the engine connector's own metadata, opaque
    to everything but the engine adapter.
    """

    source_engine_id: str
    num_blocks: int
    num_tokens: int
    engine_params: dict[str, Any]


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingSpec
    # Set on a decode request whose prompt was prefilled remotely.
    kv_transfer: KVTransfer | None = None
    # The replica the scheduler chose (Serve replica unique id); None lets Serve pick.
    target_replica: str | None = None

    def for_prefill(self, replica: str | None) -> EngineRequest:
        """The request sent to a prefill replica: the same prompt and sampling,
        one token, KV kept for a remote decode."""
        return replace(
            self,
            request_id=f"{self.request_id}-prefill",
            sampling=replace(self.sampling, max_tokens=1, min_tokens=0),
            kv_transfer=None,
            target_replica=replica,
        )

    def for_decode(self, replica: str | None, kv_transfer: KVTransfer | None) -> EngineRequest:
        return replace(self, kv_transfer=kv_transfer, target_replica=replica)

    def continued(self, generated: Sequence[int], attempt: int) -> EngineRequest:
        """The rest of this request after `generated` tokens, to run elsewhere:
        those tokens join the prompt (the new replica computes their KV) and
        the output budget shrinks by as many. Greedy decoding then continues
        exactly where it stopped."""
        s = self.sampling
        return replace(
            self,
            request_id=f"{self.request_id}-m{attempt}",
            prompt_token_ids=self.prompt_token_ids + tuple(generated),
            sampling=replace(
                s, max_tokens=s.max_tokens - len(generated), min_tokens=max(0, s.min_tokens - len(generated))
            ),
            kv_transfer=None,
            target_replica=None,
        )


@dataclass(frozen=True)
class EngineChunk:
    """New output of one request since the previous chunk."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    # Known from the first chunk on.
    num_prompt_tokens: int = 0
    # Prompt tokens the engine did not compute: local prefix-cache hits plus
    # tokens whose KV arrived by transfer.
    num_cached_tokens: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class PrefillResult:
    kv_transfer: KVTransfer
    num_prompt_tokens: int
    num_cached_tokens: int
    replica_id: str | None = None


@dataclass
class CompletionTotals:
    """Accumulates a stream of chunks into the whole answer."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0

    def add(self, chunk: EngineChunk) -> None:
        self.text += chunk.text
        self.token_ids.extend(chunk.token_ids)
        if chunk.num_prompt_tokens:
            self.num_prompt_tokens = chunk.num_prompt_tokens
            self.num_cached_tokens = chunk.num_cached_tokens
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
