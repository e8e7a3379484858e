"""`orchestrator bench` against the running CPU application: a short sweep
whose result document is well-formed and whose counts agree with the server."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tools.bench import RESULT_SCHEMA
from tools.cli import main

pytestmark = pytest.mark.integration


def test_a_short_sweep_writes_a_consistent_result(apps, tiny_model, tmp_path):
    generated_before = apps.metric("agg", "orchestrator_generation_tokens_total")
    prompt_before = apps.metric("agg", "orchestrator_prompt_tokens_total")
    out = tmp_path / "sweep.json"
    assert (
        main(
            [
                "bench",
                "--url",
                apps.url("agg", ""),
                "--tokenizer",
                str(tiny_model),
                "--isl",
                "96",
                "--osl",
                "8",
                "--concurrency",
                "1,2",
                "--requests-per-point",
                "6",
                "--max-concurrency",
                "2",
                "--warmup",
                "2",
                "--slo",
                "ttft_p99_ms=5000",
                "itl_p50_ms=1000",
                "--label",
                "agg",
                "--out",
                str(out),
            ]
        )
        == 0
    )

    doc = json.loads(out.read_text())
    jsonschema.validate(doc, RESULT_SCHEMA)
    assert [p["concurrency"] for p in doc["sweep"]] == [1, 2]
    for point in doc["sweep"]:
        assert point["completed"] + point["failed"] == point["sent"] == 6
        assert point["failed"] == 0
        # ignore_eos: every request returns exactly its max_tokens, as the server's usage says.
        assert point["output_tokens"] == 6 * 8 and point["prompt_tokens"] == 6 * 96
        assert point["goodput_requests"] == pytest.approx(point["request_throughput"])
    assert doc["knee"]["concurrency"] in (1, 2)
    assert out.with_suffix(".md").exists() and out.with_suffix(".png").stat().st_size > 0
    # The server counted the same tokens (the 2 warm-up requests included).
    assert apps.metric("agg", "orchestrator_generation_tokens_total") - generated_before == (12 + 2) * 8
    assert apps.metric("agg", "orchestrator_prompt_tokens_total") - prompt_before == (12 + 2) * 96
