"""Routing and the token path under load: KV-aware routing against SGLang's gateway, where TPOT goes, the
frontend's per-token CPU, the scheduler's cost, and shape routing."""

from __future__ import annotations

import statistics

from benchmarks.summary.row import Row, Target, load, ratio, span

SERVING = ("frontend", "replicas", "ray", "haproxy")  # our serving processes
PEER_SERVING = ("api_server", "router")  # vLLM's API servers and SGLang's router


def _serving_cpu(cpu: dict[str, float], kinds: tuple[str, ...]) -> float:
    return sum(cpu.get(k, 0.0) for k in kinds)


def _routing_row(what: str, source: str) -> Row:
    """compare_routing's issue-33 targets: KV-aware vs SGLang's gateway (TTFT p50 and p99 ≤ 1.0×, TPOT p50
    ≤ 1.05×, hit rate ≥ SGLang's) and vs our round robin (≤ 1.0× at p50 and p99)."""
    (workload,) = load(source)["workloads"].values()
    r = workload["results"]
    kv, rr, sg = r["ours-kv-events"], r["ours-round-robin"], r["sglang-cache-aware"]

    def figures(name: str, x: dict) -> str:
        return (
            f"{name} {x['ttft_ms']['p50']:.0f}/{x['ttft_ms']['p99']:.0f} ms, TPOT {x['tpot_ms']['p50']:.1f}, "
            f"hits {100 * x['prefix_hit_rate']:.1f}%"
        )

    p50, p99 = kv["ttft_ms"]["p50"] / sg["ttft_ms"]["p50"], kv["ttft_ms"]["p99"] / sg["ttft_ms"]["p99"]
    tpot = kv["tpot_ms"]["p50"] / sg["tpot_ms"]["p50"]
    rr50, rr99 = kv["ttft_ms"]["p50"] / rr["ttft_ms"]["p50"], kv["ttft_ms"]["p99"] / rr["ttft_ms"]["p99"]
    ours_cpu = _serving_cpu(kv["cpu_ms_per_output_token"], SERVING)
    peer_cpu = _serving_cpu(sg["cpu_ms_per_output_token"], PEER_SERVING)
    result = (
        f"TTFT p50/p99: {figures('KV-aware', kv)}; {figures('round robin', rr)}; "
        f"{figures('SGLang gateway + vLLM', sg)}. KV-aware vs SGLang: p50 ×{p50:.2f}, p99 ×{p99:.2f}, "
        f"TPOT ×{tpot:.2f}; vs round robin ×{rr50:.2f} / ×{rr99:.2f}. Serving processes' CPU per output "
        f"token {ours_cpu:.2f} ms vs vLLM's API servers + router {peer_cpu:.2f}"
    )
    return Row(
        what,
        result,
        (source,),
        (
            Target("TTFT p50 and p99 ≤ 1.0× SGLang's", p50 <= 1.0 and p99 <= 1.0),
            Target("TPOT p50 ≤ 1.05× SGLang's", tpot <= 1.05),
            Target("hit rate ≥ SGLang's", kv["prefix_hit_rate"] >= sg["prefix_hit_rate"]),
            Target("KV-aware ≤ round robin at p50 and p99", rr50 <= 1.0 and rr99 <= 1.0),
        ),
    )


def _tpot_mooncake() -> Row:
    source = "tpot_attribution.json"
    r = load(source)["results"]
    ours = {k: v for k, v in r.items() if k.startswith("ours")}
    sg = r["sglang-vllm"]
    result = (
        "engine-side decode time per output token: ours "
        f"{span(x['engine_decode_ms_per_token'] for x in ours.values())} ms vs "
        f"{sg['engine_decode_ms_per_token']:.2f} for the same engines behind SGLang's gateway (TPOT p50 "
        f"{span(x['tpot_p50_ms'] for x in ours.values())} vs {sg['tpot_p50_ms']:.1f}); client − engine "
        f"{span((x['client_decode_ms_per_token'] - x['engine_decode_ms_per_token'] for x in r.values()), '{:.2f}')} "
        f"ms in every row (the hops after the engine core add nothing measurable). Serving processes + Ray: "
        f"{span((_serving_cpu(x['cpu_cores'], SERVING) for x in ours.values()), '{:.2f}')} cores vs "
        f"{_serving_cpu(sg['cpu_cores'], PEER_SERVING):.2f}"
    )
    return Row("where TPOT goes, Mooncake 300 requests, 4 replicas, 2 rounds", result, (source,))


def _tpot_saturated() -> Row:
    source = "tpot_attribution_saturated.json"
    doc = load(source)
    r = doc["results"]

    def rate(x: dict) -> float:
        return statistics.median(y["output_tokens"] / y["duration_s"] for y in x["rounds"])

    def cpu(x: dict, kinds: tuple[str, ...]) -> float:
        return _serving_cpu(x["cpu_ms_per_output_token"], kinds)

    rr, sg, sg_rr = r["ours-round-robin"], r["sglang-vllm"], r["sglang-vllm-round-robin"]
    result = (
        f"{doc['workload']['concurrency']} in flight, every core busy, medians of the rounds: output tokens/s ours "
        f"round robin {rate(rr):.0f} vs SGLang's gateway round robin {rate(sg_rr):.0f} "
        f"({ratio(rate(rr), rate(sg_rr))}) and cache-aware {rate(sg):.0f}. CPU ms per output token: our serving "
        f"processes {cpu(rr, SERVING):.2f} "
        f"(replicas {cpu(rr, ('replicas',)):.2f}, frontend {cpu(rr, ('frontend',)):.2f}, Ray "
        f"{cpu(rr, ('ray',)):.2f}) vs vLLM's API servers + router {cpu(sg_rr, PEER_SERVING):.2f}; engine cores "
        f"{cpu(rr, ('engine_core',)):.2f} vs {cpu(sg_rr, ('engine_core',)):.2f}; engine workers "
        f"{cpu(rr, ('engine_worker',)):.2f} vs {cpu(sg_rr, ('engine_worker',)):.2f}"
    )
    return Row("where TPOT goes, saturated (closed loop), 4 replicas, 2 rounds", result, (source,))


def _rate(x: dict) -> float:
    """Output tokens/s, the median of a tpot_attribution row's rounds."""
    return statistics.median(y["output_tokens"] / y["duration_s"] for y in x["rounds"])


def _tpot_poll() -> Row:
    source = "tpot_attribution_poll.json"
    r = load(source)["results"]
    ours, sg = r["ours-round-robin"], r["sglang-vllm-round-robin"]
    ours_fixed, sg_fixed = r["ours-round-robin-fixed-poll"], r["sglang-vllm-round-robin-fixed-poll"]

    def engines(x: dict) -> float:
        return _serving_cpu(x["cpu_ms_per_output_token"], ("engine_core", "engine_worker"))

    result = (
        f"output tokens/s, engines' queue poll backing off to 1 ms vs a fixed 50 µs poll: ours round robin "
        f"{_rate(ours):.0f} vs {_rate(ours_fixed):.0f} ({ratio(_rate(ours), _rate(ours_fixed))}), SGLang's gateway "
        f"round robin {_rate(sg):.0f} vs {_rate(sg_fixed):.0f} ({ratio(_rate(sg), _rate(sg_fixed))}). Ours vs "
        f"SGLang's: {ratio(_rate(ours), _rate(sg))} backing off, {ratio(_rate(ours_fixed), _rate(sg_fixed))} fixed. "
        f"Engine CPU ms per output token: ours {engines(ours):.2f} vs {engines(ours_fixed):.2f} fixed, SGLang's "
        f"{engines(sg):.2f} vs {engines(sg_fixed):.2f}; TPOT p50 ours {ours['tpot_p50_ms']:.1f} ms vs SGLang's "
        f"{sg['tpot_p50_ms']:.1f}, TTFT p99 {ours['ttft_p99_ms']:.0f} vs {sg['ttft_p99_ms']:.0f}"
    )
    return Row("the engines' queue poll at saturation (16 in flight), 4 replicas, 2 rounds", result, (source,))


def _longest_answer() -> Row:
    source = "longest_answer.json"
    runs = load(source)["runs"]
    after, before = runs["after"]["median"], runs["before"]["median"]
    result = (
        f"frontend CPU per token, last 500 tokens / first 500 of a 4,000-token chat answer (reasoning + 'auto' "
        f"tool calls): ×{after['last_over_first']:.2f} ({after['first_us']:.1f} → {after['last_us']:.1f} µs); "
        f"before the streaming readers ×{before['last_over_first']:.2f} ({before['first_us']:.1f} → "
        f"{before['last_us']:.1f} µs)"
    )
    return Row(
        "frontend CPU over a long answer",
        result,
        (source,),
        (Target("last 500 within 10% of the first 500", abs(after["last_over_first"] - 1) <= 0.10),),
    )


def _scheduler_cost() -> Row:
    source = "scheduler_cost.json"
    doc = load(source)
    by_replicas = {d["replicas"]: d for d in doc["decisions"]}
    stored = {i["blocks_per_event"]: i["stored_blocks_per_s"] for i in doc["ingestion"]}
    targets = doc["targets"]
    p99_64 = by_replicas[64]["decision_us"]["p99"]
    result = (
        "decision for a 4k-token prompt over ~1M indexed blocks, p99: "
        + ", ".join(f"{d['decision_us']['p99']:.0f} µs at {n} replicas" for n, d in sorted(by_replicas.items()))
        + "; KV events ingested: "
        + ", ".join(f"{v / 1e3:.0f}k stored blocks/s with {n} blocks an event" for n, v in sorted(stored.items()))
    )
    return Row(
        "scheduler cost (one core)",
        result,
        (source,),
        (
            Target(
                f"decision p99 ≤ {targets['decision_p99_us_at_64']} µs at 64 replicas",
                p99_64 <= targets["decision_p99_us_at_64"],
            ),
            Target(
                f"ingestion ≥ {targets['ingestion_blocks_per_s'] / 1e6:.0f}M blocks/s",
                min(stored.values()) >= targets["ingestion_blocks_per_s"],
            ),
        ),
    )


def _shape_routing() -> Row:
    source = "shape_routing.json"
    r = load(source)["results"]

    def p50(policy: str, cls: str) -> float:
        return r[policy][cls]["ttft_ms"]["p50"]

    decisions = r["shape"]["shape_decisions"]
    prefix_sent = load(source)["workload"]["prefix"]["requests"]
    result = (
        "TTFT p50, shape routing vs round robin vs all to the vLLM group: overall "
        f"{p50('shape', 'overall'):.0f} / {p50('round_robin', 'overall'):.0f} / {p50('off', 'overall'):.0f} ms; "
        f"prefix-heavy class {p50('shape', 'prefix'):.0f} / {p50('round_robin', 'prefix'):.0f} / "
        f"{p50('off', 'prefix'):.0f}; unique class {p50('shape', 'unique'):.0f} / {p50('round_robin', 'unique'):.0f} "
        f"/ {p50('off', 'unique'):.0f}. Routing: {decisions.get('sim/prefix_heavy', 0):.0f}/{prefix_sent} "
        "prefix-heavy to the prefix group (the first of each prefix reads as unique)"
    )
    return Row("mixed engine groups, shape routing (vllm-cpu + simulated group)", result, (source,))


def _idle_cpu() -> Row:
    """The routing comparison's systems with nothing sent, and what that fixed cost is of the Mooncake test run's
    serving CPU per output token."""
    source, run = "idle_cpu.json", "compare_routing_test_mooncake_poll.json"
    idle = load(source)["cores_by_process"]
    ours, sg = idle["ours-round-robin"], idle["sglang-cache-aware"]
    (workload,) = load(run)["workloads"].values()
    rr = workload["results"]["ours-round-robin"]
    fixed_ms = statistics.median(
        1e3 * _serving_cpu(ours, SERVING) * r["duration_s"] / r["output_tokens"] for r in rr["rounds"]
    )
    result = (
        f"cores busy with no request in flight: our serving processes {_serving_cpu(ours, SERVING):.3f} (Ray's own "
        f"{ours.get('ray', 0):.3f}, 4 replica actors {ours.get('replicas', 0):.3f}, frontend "
        f"{ours.get('frontend', 0):.3f}) vs vLLM's 4 API servers + SGLang's router "
        f"{_serving_cpu(sg, PEER_SERVING):.3f}; engine workers "
        f"{ours.get('engine_worker', 0):.3f} vs {sg.get('engine_worker', 0):.3f}. Over the Mooncake test run that "
        f"fixed cost is {fixed_ms:.2f} of our round robin's {_serving_cpu(rr['cpu_ms_per_output_token'], SERVING):.2f} "
        "ms of serving CPU per output token"
    )
    return Row(
        "serving CPU with nothing sent (4 aggregated replicas; SGLang's gateway + 4 vLLM)", result, (source, run)
    )


def rows() -> list[Row]:
    return [
        _routing_row(
            "KV-aware routing, prefix-heavy load, 4 replicas, 2 rounds (training set; every engine's queue poll "
            "backing off; the run before it in BENCHMARKS.md)",
            "compare_routing_training_prefix_poll.json",
        ),
        _routing_row(
            "KV-aware routing, Mooncake trace, 600 requests, 4 replicas, 2 rounds (test set; every engine's queue "
            "poll backing off; the runs before it in BENCHMARKS.md)",
            "compare_routing_test_mooncake_poll.json",
        ),
        _idle_cpu(),
        _tpot_mooncake(),
        _tpot_saturated(),
        _tpot_poll(),
        _longest_answer(),
        _scheduler_cost(),
        _shape_routing(),
    ]
