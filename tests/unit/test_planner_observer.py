"""A replica's load window: the prompt tokens it holds with no first token
yet, and its prompt tokens per aligned peak bucket; the pool's peak from its
replicas' buckets. Injected clock, hand-checked numbers."""

from __future__ import annotations

import pytest

from orchestrator.planner.observer import BUCKET_KEY, ReplicaLoadWindow, ReplicaReport, pool_peak_prompt_tps


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def window(clock: Clock, span_s: float = 10, peak_window_s: float = 2) -> ReplicaLoadWindow:
    return ReplicaLoadWindow(span_s=span_s, clock=clock, peak_window_s=peak_window_s)


def arrive(w: ReplicaLoadWindow, clock: Clock, at: float, tokens: int) -> int:
    clock.t = at
    return w.arrived(tokens)


def test_prompt_tokens_are_queued_until_the_first_token_or_the_end_and_streams_run_in_between():
    clock = Clock(100.0)
    w = window(clock)
    a, b, c = (arrive(w, clock, 100.0 + i, n) for i, n in enumerate((300, 200, 1000)))
    snap = w.snapshot()
    assert (snap["queued_prompt_tokens"], snap["running"]) == (1500, 0)
    w.prompt_done(a)  # first token of a: it streams
    snap = w.snapshot()
    assert (snap["queued_prompt_tokens"], snap["running"]) == (1200, 1)
    w.prompt_done(a)  # a second first token: counted once
    w.closed(c)  # c failed before its first token: never ran
    snap = w.snapshot()
    assert (snap["queued_prompt_tokens"], snap["running"]) == (200, 1)
    w.prompt_done(b)
    w.closed(a)  # a finished
    w.closed(a)
    snap = w.snapshot()
    assert (snap["queued_prompt_tokens"], snap["running"]) == (0, 1)
    w.closed(b)
    assert w.snapshot()["running"] == 0


def test_output_tokens_asked_for_by_the_arrivals_and_by_the_finished():
    clock = Clock(100.0)
    w = window(clock)
    for i, asked in enumerate((100, 300)):
        clock.t = 100.0 + i
        w.arrived(50, asked)
    w.finished(40, 0, 0.1, 64)
    w.finished(64, 0, 0.1, 64)
    snap = w.snapshot()
    assert (snap["mean_max_tokens"], snap["finished_max_tokens"], snap["mean_osl"]) == (200, 64, 52)
    w.arrived(50)  # one arrival whose ask is not known: the mean says nothing
    w.finished(10, 0, 0.1)
    snap = w.snapshot()
    assert (snap["mean_max_tokens"], snap["finished_max_tokens"]) == (0, 0)


def test_prompt_tokens_per_bucket_and_the_replica_peak():
    # 2 s buckets on the clock's epoch, 10 s span: the last 5 complete buckets (+1 for lining up).
    clock = Clock(0.0)
    w = window(clock)
    for at, tokens in ((97.0, 4000), (100.5, 300), (101.9, 200), (102.0, 1000), (103.99, 500), (104.1, 50)):
        arrive(w, clock, at, tokens)
    clock.t = 104.5  # in bucket 52 = [104, 106): the 50 tokens there are not complete yet
    snap = w.snapshot()
    assert snap["bucket_now"] == 52 and snap["peak_window_s"] == 2
    # j = 1: [102, 104), 2: [100, 102), 3: [98, 100), 4: [96, 98), ...
    assert [snap[f"{BUCKET_KEY}{j}"] for j in range(1, 7)] == [1500, 500, 0, 4000, 0, 0]
    assert snap["peak_prompt_tps"] == 4000 / 2  # bucket 48 is the 4th back, within 5
    clock.t = 108.0  # bucket 54: [96, 98) is now the 6th bucket back, the lining-up one
    snap = w.snapshot()
    assert [snap[f"{BUCKET_KEY}{j}"] for j in range(1, 7)] == [0, 50, 1500, 500, 0, 4000]
    assert snap["peak_prompt_tps"] == 1500 / 2


def test_a_span_shorter_than_a_bucket_reports_one_bucket():
    clock = Clock(0.0)
    w = window(clock, span_s=3, peak_window_s=2)
    arrive(w, clock, 10.5, 600)
    clock.t = 12.2
    snap = w.snapshot()
    assert w.peak_buckets == 1 and snap[f"{BUCKET_KEY}1"] == 600 and snap[f"{BUCKET_KEY}2"] == 0
    assert f"{BUCKET_KEY}3" not in snap and snap["peak_prompt_tps"] == 300


def report(bucket_now: int, counts: list[float], w: float = 2.0, n: int | None = None) -> ReplicaReport:
    n = len(counts) - 1 if n is None else n
    return ReplicaReport.from_metrics(
        {
            "bucket_now": float(bucket_now),
            "peak_window_s": w,
            "peak_prompt_tps": max(counts[:n]) / w,
            **{f"{BUCKET_KEY}{j}": float(c) for j, c in enumerate(counts, start=1)},
        }
    )


def test_the_pool_peak_adds_the_replicas_bucket_by_bucket():
    # Replica A: 1000 tokens in bucket 51, B: 800 in bucket 50. Bucket by bucket
    # the pool peaked at 1000 tokens / 2 s; the replicas' own peaks add up to 900/s.
    a = report(52, [1000, 0, 0])
    b = report(52, [0, 800, 0])
    assert pool_peak_prompt_tps([a, b]) == 500
    assert pool_peak_prompt_tps([a]) == 500 and pool_peak_prompt_tps([]) is None


def test_replicas_whose_reports_straddle_a_boundary_line_up_on_the_shared_clock():
    # n = 1 (3 s interval, 2 s buckets). A reported in bucket 52 (its j=1 is 51,
    # j=2 is 50), B in bucket 53 (j=1 is 52, j=2 is 51): they share bucket 51 only.
    a = report(52, [600, 2000])
    b = report(53, [900, 400])
    assert pool_peak_prompt_tps([a, b]) == (600 + 400) / 2
    # Two buckets apart: nothing shared, the sum of their own peaks (an upper bound).
    c = report(54, [100, 700])
    assert pool_peak_prompt_tps([a, c]) == (600 + 100) / 2


def test_the_pool_peak_from_two_windows_on_one_clock():
    clock = Clock(0.0)
    one, two = window(clock, span_s=4), window(clock, span_s=4)  # n = 2 buckets of 2 s
    for w, at, tokens in (
        (one, 100.2, 500),
        (two, 101.0, 700),
        (one, 102.5, 300),
        (two, 103.5, 100),
        (one, 104.0, 5000),
    ):
        arrive(w, clock, at, tokens)
    clock.t = 104.3
    first = one.report()  # bucket 52: its buckets 51 = 300, 50 = 500 (the 5000 tokens in 52 not yet complete)
    clock.t = 106.1
    second = two.report()  # bucket 53: 52 = 0, 51 = 100, 50 = 700
    # Shared buckets 50 and 51, the newest 2: 51 -> 300 + 100, 50 -> 500 + 700.
    assert pool_peak_prompt_tps([first, second]) == pytest.approx(1200 / 2)
    assert first.peak_prompt_tps + second.peak_prompt_tps == pytest.approx((500 + 100) / 2)
