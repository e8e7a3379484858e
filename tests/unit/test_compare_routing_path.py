"""The routing comparison fails a row of ours whose requests did not take the path the row names, read from
the app's own counters around the run."""

from __future__ import annotations

from benchmarks.compare_routing import _summary, path_problem

ROUTED = "orchestrator_route_decisions_total{kind=aggregated}"
EVENTS = "orchestrator_kv_event_batches_total"
PREDICTED = "orchestrator_predicted_cached_prompt_tokens_total"


def test_each_of_our_rows_is_held_to_its_own_path():
    with_events = {ROUTED: 1008, EVENTS: 412, PREDICTED: 52_000}
    from_memory = {ROUTED: 1008, PREDICTED: 48_000}
    blind = {ROUTED: 1000}
    assert path_problem("ours-kv-events", with_events, 1000) is None
    assert path_problem("ours-approximate", from_memory, 1000) is None
    assert path_problem("ours-round-robin", blind, 1000) is None
    # A row configured wrong shows in its counters.
    assert "event" in path_problem("ours-kv-events", from_memory, 1000)
    assert "event" in path_problem("ours-approximate", with_events, 1000)
    assert "predicted" in path_problem("ours-round-robin", from_memory, 1000)
    assert "predicted" in path_problem("ours-approximate", blind, 1000)


def test_a_request_not_routed_aggregated_or_not_routed_at_all_fails_the_row():
    remote = {ROUTED: 990, "orchestrator_route_decisions_total{kind=remote_prefill}": 10}
    assert "routes" in path_problem("ours-round-robin", remote, 1000)
    assert "routes" in path_problem("ours-round-robin", {ROUTED: 999}, 1000)


def test_a_call_off_the_direct_data_plane_fails_the_row():
    fell_back = {ROUTED: 1000, EVENTS: 400, PREDICTED: 5_000, "orchestrator_direct_path_fallbacks_total": 3}
    assert "data plane" in path_problem("ours-kv-events", fell_back, 1000)


def test_a_row_over_rounds_is_the_median_of_each_figure_with_every_round_kept():
    def run(p50, p99, hit, cpu):
        return {
            "ttft_ms": {"p50": p50, "p99": p99},
            "prefix_hit_rate": hit,
            "completed": 10,
            "sent": 10,
            "cpu_ms_per_output_token": {"frontend": cpu},
        }

    rounds = [run(30, 300, 0.8, 1.0), run(50, 900, 0.9, 2.0), run(40, 500, 0.7, 3.0), {"error": "failed"}]
    row = _summary(rounds)
    assert row["ttft_ms"] == {"p50": 40, "p99": 500} and row["prefix_hit_rate"] == 0.8
    assert (row["completed"], row["sent"]) == (30, 30) and row["cpu_ms_per_output_token"] == {"frontend": 2.0}
    assert row["rounds"] == rounds
