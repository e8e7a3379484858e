"""The profile `tests/integration/test_zz_planner_vllm.py` sizes its loads and
its SLA from, measured for that test alone: its own app (configs/disagg-cpu.yaml
with the test's engine settings: small KV caches, the decode engine one
sequence at a time), planner off, measured through the app's own server with
`orchestrator profile --url`'s code, as a client sees it. So a prompt's time
is what the test's requests meet (routing, the remote prefill and its KV
transfer, the decode replica's first step, Serve on two cores), and a decode
step is what one replica serves through Serve one sequence at a time.

Writes tests/integration/planner_vllm_profile.json (nothing else reads it).

    .venv/bin/python benchmarks/planner_test_profile.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch  # noqa: E402

PROFILE = launch.ROOT / "tests" / "integration" / "planner_vllm_profile.json"
# The planner test's engines: 0.25 GiB prefill KV, 0.01 GiB decode KV (just over max_model_len), one
# sequence at a time on the decode engine.
ENGINE_OVERRIDES = {
    "prefill_pool__engine__cpu__kv_cache_gib": 0.25,
    "decode_pool__engine__cpu__kv_cache_gib": 0.01,
    "decode_pool__engine__max_num_seqs": 1,
}
# Prompt lengths the test's steps use (400 and 2048) and around them; one sequence at a time.
GRID = [
    "--isl",
    "256,512,1024,2048",
    "--batch",
    "1",
    "--context",
    "256,512,1024",
    "--prefill-batch",
    "",
    "--mixed",
    "",
    "--repeats",
    "3",
]


def main() -> int:
    from tools.profile import add_arguments, profile

    p = launch.parser(__doc__)
    p.add_argument("--out", default=str(PROFILE))
    args = p.parse_args()
    launch.tiny_model()
    cfg = launch.app_args("disagg-cpu.yaml", **ENGINE_OVERRIDES)
    with launch.ours(cfg, PROFILE.with_suffix(".log")) as url:
        profiler = launch.parser(None)
        add_arguments(profiler)
        grid = profiler.parse_args(["--config", "-", "--out", args.out, "--url", url, *GRID])
        doc = asyncio.run(profile(cfg, "decode_pool", grid))
    doc["meta"]["measured_for"] = "tests/integration/test_zz_planner_vllm.py, through its app's server"
    doc["meta"]["app_overrides"] = ENGINE_OVERRIDES
    with open(args.out, "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({"profile": args.out, "prefill": doc["prefill"], "decode": doc["decode"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
