"""A decode replica that fails a stream is set aside: the stream migrates, and
new requests avoid that replica for `suspect_s` (a dead engine stays in the
pool's live set until Serve replaces it), then it is tried again; with every
replica set aside, they are all tried."""

from __future__ import annotations

import asyncio

import pytest

from orchestrator.messages import EngineRequest, SamplingSpec
from orchestrator.metrics import FrontendMetrics
from orchestrator.request_path import RequestPath, RequestTrace
from orchestrator.routing.round_robin import RoundRobinScheduler
from tests.factories import FakePool, run
from tests.virtual_time import loop_time, run_virtual


def _path(decode: FakePool, now: list[float]) -> RequestPath:
    return RequestPath(
        decode,
        None,
        RoundRobinScheduler(),
        FrontendMetrics(),
        prefill_timeout_s=5,
        clock=lambda: now[0],
        suspect_s=10.0,
    )


def _complete(path: RequestPath, i: int) -> int:
    async def go():
        request = EngineRequest(f"req{i}", (1, 2, 3), SamplingSpec(max_tokens=3, temperature=0))
        return sum([len(c.token_ids) async for c in path.stream(request, RequestTrace())])

    return run(go())


def test_a_replica_that_failed_a_stream_gets_no_new_request_until_its_time_is_up():
    # r0's engine is dead: every stream there fails before its first token.
    decode = FakePool("decode_pool", replica_ids=("r0", "r1"), generate_error_after=0, failing_replica="r0")
    now = [0.0]
    path = _path(decode, now)
    tokens = [_complete(path, i) for i in range(4)]
    assert tokens == [3, 3, 3, 3]  # every request answered in full
    targets = [r.target_replica for r in decode.generates]
    assert targets[:2] == ["r0", "r1"]  # the first went to r0, failed and migrated
    assert targets[2:] == ["r1", "r1", "r1"]  # round robin would have sent two of them to r0
    assert path.metrics.decode_replicas_set_aside._value.get() == 1

    now[0] = 10.5  # set aside no longer: r0 is tried again, fails again, is set aside again
    assert _complete(path, 4) == 3 and _complete(path, 5) == 3
    assert [r.target_replica for r in decode.generates[5:]].count("r0") == 1


def test_with_every_replica_set_aside_all_are_tried():
    decode = FakePool("decode_pool", replica_ids=("r0",), generate_error_after=0, failing_replica="r0")
    now = [0.0]
    path = _path(decode, now)
    path.max_migrations = 0
    for i in range(2):
        try:
            _complete(path, i)
        except Exception:  # the only replica is dead: the error reaches the client
            pass
    assert [r.target_replica for r in decode.generates] == ["r0", "r0"]  # not routed nowhere


def _waiting_path(decode: FakePool, wait_s: float) -> RequestPath:
    return RequestPath(
        decode, None, RoundRobinScheduler(), FrontendMetrics(), 5, clock=loop_time, migration_wait_s=wait_s
    )


async def _tokens_when(
    path: RequestPath, replacement_at_s: float | None, decode: FakePool, ended_at: list[float] | None = None
) -> tuple[int, float]:
    """Streams one request while the pool's only replica is dead; Serve's
    replacement `r1` joins the pool `replacement_at_s` later (None: never).
    `ended_at` gets the loop time the stream ended at, however it ended."""
    if replacement_at_s is not None:
        asyncio.get_running_loop().call_later(replacement_at_s, setattr, decode, "replica_ids", ("r0", "r1"))
    request = EngineRequest("req", (1, 2, 3), SamplingSpec(max_tokens=5, temperature=0))
    try:
        tokens = [t async for c in path.stream(request, RequestTrace()) for t in c.token_ids]
    finally:
        if ended_at is not None:
            ended_at.append(loop_time())
    return len(tokens), loop_time()


def test_a_stream_whose_last_replica_died_waits_for_its_replacement_and_finishes():
    decode = FakePool("decode_pool", replica_ids=("r0",), generate_error_after=2, failing_replica="r0")
    tokens, took = run_virtual(_tokens_when(_waiting_path(decode, 120), 40.0, decode))
    assert tokens == 5  # nothing lost, nothing repeated
    assert 40.0 <= took < 41.0  # it waited for r1, not retried r0 meanwhile
    assert [r.target_replica for r in decode.generates] == ["r0", "r1"]


def test_with_no_replacement_in_time_the_failed_replica_is_tried_again():
    decode = FakePool("decode_pool", replica_ids=("r0",), generate_error_after=0, failing_replica="r0")
    path = _waiting_path(decode, 30)
    ended_at: list[float] = []
    with pytest.raises(RuntimeError, match="replica died"):
        run_virtual(_tokens_when(path, None, decode, ended_at))
    assert [r.target_replica for r in decode.generates] == ["r0", "r0", "r0"]  # max_migrations=2
    assert 60.0 <= ended_at[0] < 62.0  # each retry after a 30 s wait for a replacement
