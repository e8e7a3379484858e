"""The main job's sample request tells a newcomer which way the request took,
from the app's counters and replica reports around it."""

from tools.sample_request import describe_route

ROUTES = "orchestrator_route_decisions_total"
BLOCKS = "orchestrator_kv_handoff_blocks_total"


def test_a_remote_prefill_names_both_replicas_and_the_kv_moved():
    before = {
        ("prefill_pool", "p1"): {"prompt_tokens_computed_total": 100},
        ("decode_pool", "d1"): {"generation_tokens_total": 5},
        ("decode_pool", "d2"): {"generation_tokens_total": 9, "kv_transfer_bytes_total": 0},
    }
    after = {
        ("prefill_pool", "p1"): {"prompt_tokens_computed_total": 1124},
        ("decode_pool", "d1"): {"generation_tokens_total": 5},
        ("decode_pool", "d2"): {
            "generation_tokens_total": 41,
            "kv_transfer_bytes_total": 2 * 2**20,
            "kv_transfer_seconds_total": 0.0042,
        },
    }
    text = describe_route(
        {(ROUTES, "remote_prefill"): 3, (BLOCKS, ""): 10},
        {(ROUTES, "remote_prefill"): 4, (BLOCKS, ""): 42},
        before,
        after,
    )
    assert "prefill_pool replica p1 (1024 prompt tokens computed)" in text
    assert "32 blocks, 2.0 MiB in 4.2 ms" in text and "decode_pool replica d2" in text


def test_a_local_route_says_so():
    before = {("decode_pool", "d1"): {"generation_tokens_total": 5}}
    after = {("decode_pool", "d1"): {"generation_tokens_total": 37}}
    text = describe_route({(ROUTES, "local_prefill"): 1}, {(ROUTES, "local_prefill"): 2}, before, after)
    assert text == "route: local_prefill, computed and decoded on decode_pool replica d1"
