"""Workloads: exact lengths, shared prefixes, and the traces' prefix structure
kept after scaling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.workloads import AzureTrace, LengthDist, MooncakeTrace, SyntheticWorkload, TokenPool, replay_offsets

POOL = TokenPool.vocabulary(600)

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"


def test_synthetic_lengths_and_shared_prefixes_are_exact_and_seeded():
    w = SyntheticWorkload(
        LengthDist(100), LengthDist(20), TokenPool.vocabulary(500), shared_prefix_fraction=0.5, num_prefixes=2, seed=3
    )
    reqs = w.requests(20)
    assert all(len(r.prompt_token_ids) == 100 and r.max_tokens == 20 for r in reqs)
    assert all(10 <= t < 500 for r in reqs for t in r.prompt_token_ids)
    assert len({r.prompt_token_ids[:50] for r in reqs}) == 2
    assert len({r.prompt_token_ids[50:] for r in reqs}) == 20
    assert reqs == w.requests(20)


def test_length_distributions_clip():
    d = LengthDist(50, std=100, min=10, max=60)
    import random

    rng = random.Random(0)
    assert all(10 <= d.draw(rng) <= 60 for _ in range(200))


def _mooncake(tmp_path, rows):
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return path


def test_mooncake_hash_ids_become_shared_scaled_blocks(tmp_path):
    path = _mooncake(
        tmp_path,
        [
            {"timestamp": 0, "input_length": 1500, "output_length": 160, "hash_ids": [7, 8, 9]},
            {"timestamp": 500, "input_length": 1100, "output_length": 64, "hash_ids": [7, 8, 4]},
            {"timestamp": 2000, "input_length": 300, "output_length": 32, "hash_ids": [5]},
        ],
    )
    a, b, c = MooncakeTrace(str(path), POOL, block_tokens=32).requests()
    # Lengths scale by 32/512; blocks of equal ids at equal positions are equal.
    assert (len(a.prompt_token_ids), len(b.prompt_token_ids), len(c.prompt_token_ids)) == (94, 69, 19)
    assert a.prompt_token_ids[:64] == b.prompt_token_ids[:64]
    assert a.prompt_token_ids[64:69] != b.prompt_token_ids[64:69]
    assert (a.max_tokens, b.max_tokens) == (10, 4)
    assert (a.arrival_s, b.arrival_s, c.arrival_s) == (0.0, 0.5, 2.0)
    assert replay_offsets([a, b, c], time_scale=0.5, rate_scale=2.0) == [0.0, 0.125, 0.5]


def test_real_mooncake_trace_keeps_its_sharing_after_scaling():
    path = TRACES / "mooncake_conversation.jsonl"
    if not path.exists():
        pytest.skip(f"{path} not present (../shared/traces)")
    rows = [json.loads(line) for line in path.open().readlines()[:40]]
    reqs = MooncakeTrace(str(path), POOL, block_tokens=16).requests(40)
    for i in range(40):
        for j in range(i + 1, 40):
            ids_a, ids_b = rows[i]["hash_ids"], rows[j]["hash_ids"]
            a, b = reqs[i].prompt_token_ids, reqs[j].prompt_token_ids
            for k in range(min(len(ids_a), len(ids_b), len(a) // 16, len(b) // 16)):
                same_block = a[k * 16 : (k + 1) * 16] == b[k * 16 : (k + 1) * 16]
                assert same_block == (ids_a[k] == ids_b[k])
                if not same_block:
                    break


def test_azure_trace_has_lengths_and_arrivals(tmp_path):
    path = tmp_path / "az.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n"
    )
    a, b = AzureTrace(str(path), POOL, isl_scale=0.5).requests()
    assert (len(a.prompt_token_ids), a.max_tokens, len(b.prompt_token_ids)) == (187, 44, 198)
    assert b.arrival_s == pytest.approx(4.314579, abs=1e-5)


def test_word_tokens_survive_a_text_round_trip():
    from orchestrator.prompts import load_tokenizer
    from orchestrator.tiny_model import make_tiny_model

    tok = load_tokenizer(str(make_tiny_model(Path.home() / ".cache" / "orchestrator" / "tiny-llama")))
    pool = TokenPool.words(tok)
    spec = SyntheticWorkload(LengthDist(300), LengthDist(4), pool, seed=1).requests(1)[0]
    assert tok.encode(tok.decode(list(spec.prompt_token_ids)), add_special_tokens=False) == list(spec.prompt_token_ids)
