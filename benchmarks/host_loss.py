"""A whole host lost under load (issue 35), in the two-host network-namespace cluster (netns_cluster.py).

The head host runs Ray's head, Serve, HAProxy, the frontend, the prefill replica and one decode replica;
the worker host runs the other decode replica (the pools pinned by Ray custom resources; the worker has
no CPUs for Ray to place the frontend on). The disaggregated app (configs/disagg-cpu.yaml, UCX over TCP,
each replica advertising its own host's address) serves a closed-loop load of prompts past the local
prefill limit (prefilled on the head, KV pulled by the decode replica over the hosts' link). Some seconds
in, the worker host is lost: its link goes down, then every process in it is SIGKILLed
(`NetnsCluster.lose`), so nothing it held says goodbye.

Measured, and checked (the run fails otherwise): every request answered in full (the streams the lost
replica held migrate to the head's decode replica once the frontend finds the peer dead,
wire/liveness.py), none lost or hung; the frontend's counters around the loss (migrations, route
decisions); how long until Serve runs 2 decode replicas again, both on the head; a request answered
after that. Before the loss, the worker's decode replica must have streams in flight (else the run
proves nothing and fails). Writes benchmarks/results/host_loss.json.

    .venv/bin/python benchmarks/host_loss.py
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import faults, launch, netns_cluster, report  # noqa: E402
from benchmarks.netns_cluster import HostSpec, NetnsCluster  # noqa: E402
from orchestrator.config import load_serve_config  # noqa: E402
from tools.runner import Target, run_concurrency  # noqa: E402
from tools.workloads import LengthDist, SyntheticWorkload, TokenPool  # noqa: E402

APP = "orchestrator"
HTTP_PORT = 8000
HOSTS = [
    HostSpec("head", {"decode_host": 2, "prefill_host": 1}, num_cpus=2),
    HostSpec("worker", {"decode_host": 1}, num_cpus=0),
]


def serve_config(path: Path) -> Path:
    config = launch.app_args(
        "disagg-cpu.yaml",
        network__advertise_host=None,  # each replica: its own host's address
        network__transport_env={"UCX_TLS": "tcp"},
        network__kv_handshake_timeout_s=3,
        prefill_pool__resources={"prefill_host": 1},
        decode_pool__resources={"decode_host": 1},
        decode_pool__replicas=2,
        decode_pool__num_cpus=0,
        prefill_pool__engine__cpu__kv_cache_gib=0.25,
        decode_pool__engine__cpu__kv_cache_gib=0.25,
        frontend__prefill_timeout_s=10,
        # HTTP on 0.0.0.0, reached at the head's address on the namespaces' private bridge: this network is
        # the machine's own.
        frontend__auth__allow_unauthenticated=True,
    )
    doc = load_serve_config(launch.CONFIGS / "disagg-cpu.yaml")
    doc["http_options"] = {"host": "0.0.0.0", "port": HTTP_PORT}
    doc["applications"][0] |= {"name": APP, "route_prefix": "/", "args": config.model_dump(mode="json")}
    path.write_text(yaml.safe_dump(doc))
    return path


def decode_hosts(url: str) -> list[str]:
    pools = httpx.get(f"{url}/pools", timeout=10).json()["pools"]
    return sorted(r["info"]["host"] for r in pools["decode_pool"])


def running_on(url: str) -> dict[str, float]:
    """Requests each decode replica's engine runs now, by host."""
    pools = httpx.get(f"{url}/pools", timeout=10).json()["pools"]
    return {r["info"]["host"]: (r.get("stats") or {}).get("num_running", 0) for r in pools["decode_pool"]}


async def under_load(url: str, cluster: NetnsCluster, specs, args) -> tuple[list, float, float, dict]:
    target = Target(url, "tiny-llama")
    load = asyncio.create_task(run_concurrency(target, specs, args.concurrency, timeout_s=args.hang_s))
    await asyncio.sleep(args.lose_after_s)
    running = await asyncio.to_thread(running_on, url)
    lost_at = time.perf_counter()
    await asyncio.to_thread(cluster.lose, cluster.host("worker"))
    records, duration = await load
    return records, duration, lost_at, running


def wait_rescheduled(url: str, head: str, timeout_s: float) -> float | None:
    """Seconds until both decode replicas run on the head host (None: not within `timeout_s`)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            if decode_hosts(url) == [head, head]:
                return time.monotonic() - started
        except (httpx.HTTPError, KeyError, ValueError):
            pass
        time.sleep(2)
    return None


def problems(doc: dict) -> list[str]:
    wrong = []
    if doc["decode_hosts_before"] != sorted([doc["head"], doc["worker"]]):
        wrong.append(f"decode replicas were not one per host before the loss: {doc['decode_hosts_before']}")
    if not doc["running_at_loss"].get(doc["worker"]):
        wrong.append(f"the worker's decode replica ran nothing when it was lost: {doc['running_at_loss']}")
    load = doc["load"]
    if load["lost"] or load["hung"] or load["answered"] != load["sent"]:
        wrong.append(f"{load['lost']} lost, {load['hung']} hung of {load['sent']}: {load['errors']}")
    if doc["rescheduled_after_s"] is None:
        wrong.append("Serve did not run 2 decode replicas on the head again")
    if not doc["answers_after"]:
        wrong.append("no answer to a new request after the loss")
    return wrong


def markdown(doc: dict) -> str:
    load, counters = doc["load"], doc["frontend_counters"]
    migrations = counters.get("orchestrator_decode_migrations_total", 0)
    lines = [
        f"Worker host (one of 2 decode replicas) lost {doc['lost_after_s']} s into a closed loop of "
        f"{doc['concurrency']} streams; engine requests running at the loss: {doc['running_at_loss']}.",
        "",
        "| sent | answered in full | lost | hung | migrations | e2e p50 / max ms | Serve back to 2 decode replicas |",
        "|---|---|---|---|---|---|---|",
        f"| {load['sent']} | {load['answered']} | {load['lost']} | {load['hung']} | {migrations:.0f} | "
        f"{load['e2e_ms']['p50']:.0f} / {load['e2e_max_ms']:.0f} | {doc['rescheduled_after_s']} s |",
    ]
    if doc["problems"]:
        lines += ["", "Problems: " + "; ".join(doc["problems"])]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--concurrency", type=int, default=6)
    p.add_argument("--lose-after-s", type=float, default=8.0)
    p.add_argument("--hang-s", type=float, default=300.0, help="a request silent this long counts as hung")
    p.add_argument("--out", default=str(launch.RESULTS / "host_loss.json"))
    args = p.parse_args()
    unavailable = netns_cluster.available()
    if unavailable is not None:
        sys.exit(f"needs network namespaces: {unavailable}")
    pool = TokenPool.vocabulary(len(launch.tiny_model()))
    # Prompts past the local-prefill threshold: prefilled on the head, decoded on either host.
    specs = SyntheticWorkload(LengthDist(700), LengthDist(160), pool, seed=33).requests(args.requests + 4)
    warmups, specs = specs[:4], specs[4:]
    out = Path(args.out)
    with NetnsCluster(HOSTS) as cluster:
        head, worker = cluster.host("head").address, cluster.host("worker").address
        cluster.serve_run(serve_config(Path(tempfile.mkdtemp(prefix="host-loss-")) / "serve.yaml"))
        url = f"http://{head}:{HTTP_PORT}"
        launch.wait_healthy(f"{url}/health", 900)
        asyncio.run(run_concurrency(Target(url, "tiny-llama"), warmups, 2, timeout_s=args.hang_s))
        hosts_before = decode_hosts(url)
        before = launch.counters(url, faults.COUNTERS)
        records, duration, lost_at, running = asyncio.run(under_load(url, cluster, specs, args))
        counters = launch.increments(before, launch.counters(url, faults.COUNTERS))
        rescheduled = wait_rescheduled(url, head, timeout_s=300)
        answer = httpx.post(f"{url}/v1/completions", json={"model": "tiny-llama", "prompt": "after", "max_tokens": 4})
    doc = report.document(
        "host_loss",
        1,
        head=head,
        worker=worker,
        concurrency=args.concurrency,
        lost_after_s=args.lose_after_s,
        decode_hosts_before=hosts_before,
        running_at_loss=running,
        load={
            "duration_s": duration,
            **faults.tally(records, specs),
            **faults.after_injection(records, specs, lost_at),
        },
        frontend_counters=counters,
        rescheduled_after_s=None if rescheduled is None else round(rescheduled, 1),
        answers_after=answer.status_code == 200,
    )
    doc["problems"] = problems(doc)
    report.write(out, doc, markdown)
    print(json.dumps({k: doc[k] for k in ("running_at_loss", "rescheduled_after_s", "problems")}))
    if doc["problems"]:
        sys.exit("host loss: " + "; ".join(doc["problems"]))


if __name__ == "__main__":
    main()
