"""Routing by LoRA adapter in the cluster simulator (issue 37, benchmark 2).

64 simulated H100 replicas serving Llama-3.1-8B aggregated (the cluster simulator's roofline engines), each
with vLLM's adapter limits (`max_loras` adapters a batch, `max_cpu_loras` in its host cache, an adapter not
cached read in `lora_load_s`); 1,000 adapters with Zipf(1.0) popularity; each request an adapter's own
system prompt (its prefix, shared by that adapter's requests) and a user part of its own. Poisson arrivals
at each rate of a sweep; the same requests, in the same order, for each policy:

    ours          the KV-aware scheduler with adapter slots (routing/adapter_slots.py)
    round_robin   replicas in turn, adapter- and cache-blind

Recorded per request: its adapter, the replica that ran it, TTFT, mean ITL and cached prompt tokens; the run
fails if a request did not finish or ran anywhere but on one replica of the pool. Reported per rate and
policy: TTFT p50/p99, adapter reads per 100 requests (the engines' loads from source; at least each adapter's
first, `first_loads_per_100`, which no routing avoids in a run this long), prefix hit rate
(cached / prompt tokens), goodput (requests within the SLO a second), and how long each routing decision
took on this machine's clock (`route_request`, wall time, p50/p99).

    python -m benchmarks.lora_routing_sim --rates 200,300,400 --requests 8000 \\
        --out benchmarks/results/simulator/lora_routing.json
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass
from typing import Any

from benchmarks import report
from orchestrator.config import LoraConfig, RoutingConfig, SimEngineConfig
from orchestrator.engines.sim_engine import kv_capacity_blocks, perf_model
from orchestrator.sim.cluster import ClusterSim, ClusterSpec
from orchestrator.sim.link import LINKS

POLICIES = ("ours", "round_robin")


@dataclass(frozen=True)
class LoraArrival:
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    arrival_s: float
    lora: str


def zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (k**s) for k in range(1, n + 1)]


def workload(args: argparse.Namespace, rate: float) -> list[LoraArrival]:
    """The same adapters and prompts at every rate (seeded), arrivals Poisson at `rate`."""
    rng = random.Random(args.seed)
    names = [f"adapter-{i:04d}" for i in range(args.adapters)]
    weights = zipf_weights(args.adapters, args.zipf)
    systems: dict[str, tuple[int, ...]] = {}
    arrivals, t = [], 0.0
    for _ in range(args.requests):
        name = rng.choices(names, weights)[0]
        if name not in systems:
            srng = random.Random(f"{args.seed}-{name}")
            systems[name] = tuple(srng.randrange(100, 32000) for _ in range(args.system_tokens))
        user = tuple(rng.randrange(100, 32000) for _ in range(args.user_tokens))
        t += rng.expovariate(rate)
        arrivals.append(LoraArrival(systems[name] + user, args.output_tokens, t, name))
    return arrivals


class TimedScheduler:
    """The simulator's scheduler, each `route_request` timed on the wall clock."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.route_ns: list[int] = []

    def route_request(self, request, prefill_replicas, decode_replicas, blocks=None):
        start = time.perf_counter_ns()
        decision = self.inner.route_request(request, prefill_replicas, decode_replicas, blocks)
        self.route_ns.append(time.perf_counter_ns() - start)
        return decision

    def on_prefill_done(self, request_id: str) -> None:
        self.inner.on_prefill_done(request_id)

    def on_request_finished(self, request_id: str) -> None:
        self.inner.on_request_finished(request_id)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_policy(args: argparse.Namespace, policy: str, arrivals: list[LoraArrival]) -> dict[str, Any]:
    engine = SimEngineConfig(kind="sim", gpu="H100", model="llama-3.1-8b", lora_load_s=args.lora_load_s)
    perf = perf_model(engine)
    lora = LoraConfig(max_loras=args.max_loras, max_cpu_loras=args.max_cpu_loras)
    costs = {"lora_load_blocks": args.lora_load_blocks, "lora_slot_wait_blocks": args.lora_slot_wait_blocks}
    routing = RoutingConfig(policy="round_robin", **costs) if policy == "round_robin" else RoutingConfig(**costs)
    spec = ClusterSpec(
        0,
        args.replicas,
        kv_capacity_blocks(engine, perf, 16),
        routing=routing,
        lora=lora,
        lora_load_s=args.lora_load_s,
    )
    sim = ClusterSim(spec, perf, LINKS[engine.link], seed=args.seed)
    timed = TimedScheduler(sim.scheduler)
    sim.scheduler = timed
    started = time.process_time()
    outcomes = sorted(sim.run(arrivals), key=lambda o: int(o.request_id[1:]))
    cpu_s = time.process_time() - started
    if len(outcomes) != len(arrivals) or not all(o.finished for o in outcomes):
        raise SystemExit(f"{policy}: {sum(not o.finished for o in outcomes)} requests did not finish")
    replicas = {r.replica_id for r in sim.decode}
    if any(o.route is None or o.route.remote_prefill or o.route.decode_replica not in replicas for o in outcomes):
        raise SystemExit(f"{policy}: a request ran off the aggregated pool")
    ttft = [o.ttft_s * 1000 for o in outcomes]
    itl = [statistics.fmean(o.itl_s) * 1000 if o.itl_s else 0.0 for o in outcomes]
    good = [t <= args.slo_ttft_ms and i <= args.slo_itl_ms for t, i in zip(ttft, itl)]
    span = max(o.token_times[-1] for o in outcomes) - min(o.arrival_s for o in outcomes)
    loads = sum(r.core.loras.loads for r in sim.replicas.values())
    cached, prompt = sum(o.cached_tokens for o in outcomes), sum(o.prompt_tokens for o in outcomes)
    route_us = [ns / 1000 for ns in timed.route_ns]
    return {
        "ttft_ms": {"p50": _pct(ttft, 0.5), "p99": _pct(ttft, 0.99)},
        "itl_mean_ms": {"p50": _pct(itl, 0.5), "p99": _pct(itl, 0.99)},
        "adapter_loads_per_100": 100 * loads / len(outcomes),
        "prefix_hit_rate": cached / prompt,
        "goodput_rps": sum(good) / span,
        "within_slo": sum(good) / len(good),
        "throughput_rps": len(outcomes) / span,
        "route_us": {"p50": _pct(route_us, 0.5), "p99": _pct(route_us, 0.99), "max": max(route_us)},
        "sim_cpu_s": cpu_s,
        "requests": {
            "adapter": [a.lora for a in arrivals],
            "replica": [o.route.decode_replica for o in outcomes],
            "ttft_ms": [round(t, 2) for t in ttft],
            "itl_mean_ms": [round(i, 3) for i in itl],
            "cached_tokens": [o.cached_tokens for o in outcomes],
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="200,300,400", help="Poisson arrival rates, requests/s, comma-separated")
    p.add_argument("--requests", type=int, default=8000)
    p.add_argument("--replicas", type=int, default=64)
    p.add_argument("--adapters", type=int, default=1000)
    p.add_argument("--zipf", type=float, default=1.0)
    p.add_argument("--max-loras", type=int, default=4)
    p.add_argument("--max-cpu-loras", type=int, default=16)
    p.add_argument("--lora-load-s", type=float, default=0.05)
    p.add_argument("--system-tokens", type=int, default=1024)
    p.add_argument("--user-tokens", type=int, default=256)
    p.add_argument("--output-tokens", type=int, default=128)
    defaults = RoutingConfig()
    p.add_argument("--lora-load-blocks", type=float, default=defaults.lora_load_blocks)
    p.add_argument("--lora-slot-wait-blocks", type=float, default=defaults.lora_slot_wait_blocks)
    p.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    p.add_argument("--slo-itl-ms", type=float, default=50.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="benchmarks/results/simulator/lora_routing.json")
    args = p.parse_args(argv)
    points = []
    for rate in (float(r) for r in args.rates.split(",")):
        arrivals = workload(args, rate)
        # Each adapter is read at least once somewhere: the loads no routing avoids, in this run's length.
        cold = 100 * len({a.lora for a in arrivals}) / len(arrivals)
        point: dict[str, Any] = {"rate_rps": rate, "first_loads_per_100": cold}
        for policy in POLICIES:
            point[policy] = run_policy(args, policy, arrivals)
            r = point[policy]
            print(
                f"rate {rate:g} {policy}: TTFT p50 {r['ttft_ms']['p50']:.1f} p99 {r['ttft_ms']['p99']:.1f} ms, "
                f"loads/100 {r['adapter_loads_per_100']:.2f}, hit {100 * r['prefix_hit_rate']:.1f}%, "
                f"goodput {r['goodput_rps']:.1f}/s ({100 * r['within_slo']:.1f}%), "
                f"route p99 {r['route_us']['p99']:.0f} us, sim {r['sim_cpu_s']:.0f} s CPU",
                flush=True,
            )
        points.append(point)
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "rates")}
    doc = report.document("lora_routing_sim", 1, settings=settings, points=points)
    report.write_json(args.out, doc, indent=None)  # a record per request: compact
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
