"""Summary rows for the serving layer: overhead, capacity, goodput, the CPU engine's queues, faults, overload and
the AIPerf cross-check, each figure computed from the committed JSON."""

from __future__ import annotations

import re
import statistics
from typing import Any

from benchmarks.summary.row import Row, Target, load, ratio, span

OVERHEAD = "frontend_overhead.json"
OVERHEAD_RSLLM_AGG = "frontend_overhead_rsllm_agg.json"
OVERHEAD_RSLLM_PD = "frontend_overhead_rsllm_pd.json"
CAPACITY = "frontend_capacity.json"
SERVING = "compare_serving.json"
SERVING_CPU = "compare_serving_agg.json"
SERVING_POLL = "compare_serving_agg_poll.json"
POLLING = "cpu_engine_polling.json"
FAULTS = "faults.json"
FAULTS_INGRESS = "faults_ingress.json"
HOST_LOSS = "host_loss.json"
STALLED = "stalled_readers.json"
SOAK = "soak.json"
AIPERF = "aiperf_crosscheck.json"

# Issue 33's targets (thresholds, not results).
AGG_TTFT_TARGET = 1.10  # ours aggregated, c=1, TTFT p50 × vLLM's server
AGG_ITL_TARGET = 1.05  # the same for ITL p50
C8_TPOT_TARGET = 1.10  # c=8 TPOT p50 × vLLM's own server (aggregated) or its P/D pair (disaggregated)
CAPACITY_TARGETS = {16: 1.5, 64: 1.0, 256: 1.0}  # ours' CPU per streamed token, whole path, × Dynamo's
GOODPUT_TARGET = 0.95  # ours aggregated, goodput at the knee × plain vLLM DP2
SERVING_CPU_TARGET = 1.3  # ours' serving processes' CPU per request × vLLM's API server


def percent(r: float) -> str:
    """A ratio as a signed change: 0.985 → "−1.5%"."""
    return f"{(r - 1) * 100:+.1f}%".replace("-", "−")


def times(values: list[float]) -> str:
    """Ratios as "×lo–hi", two decimals."""
    return "×" + span(values, "{:.2f}")


# Serving-layer overhead (frontend_overhead*.json)


def p50(doc: dict[str, Any], c: int, system: str, metric: str) -> float:
    return doc["results"][str(c)][system][f"{metric}_ms"]["p50"]


def vs_baseline(doc: dict[str, Any], c: int, system: str, metrics: tuple[str, str]) -> str:
    """`system`'s p50s over its baseline's (the bare server of the same run), as "×a / ×b"."""
    base = doc["baseline_of"][system]
    return " / ".join(ratio(p50(doc, c, system, m), p50(doc, c, base, m)) for m in metrics)


def overhead_row() -> Row:
    doc, agg, pd = load(OVERHEAD), load(OVERHEAD_RSLLM_AGG), load(OVERHEAD_RSLLM_PD)
    at_c1, at_c8 = ("ttft", "itl"), ("ttft", "tpot")  # one request at a time: ITL; under load: TPOT
    bare, bare_pd, kv = p50(doc, 1, "bare", "ttft"), p50(doc, 1, "bare-pd", "ttft"), doc["kv_transfer_ms_mean"]
    budget, disagg = doc["disagg_ttft_budget_ms"]["1"], p50(doc, 1, "disagg", "ttft")
    result = (
        f"TTFT / ITL p50 at c=1: ours aggregated {vs_baseline(doc, 1, 'agg', at_c1)} of vLLM's server, via Serve "
        f"handles {vs_baseline(doc, 1, 'agg-serve', at_c1)}; ours disaggregated {vs_baseline(doc, 1, 'disagg', at_c1)} "
        f"of vLLM's own P/D servers (client as proxy; their TTFT {bare_pd:.0f} ms vs {bare:.0f} for one vLLM server). "
        f"TTFT / TPOT at c=8: aggregated {vs_baseline(doc, 8, 'agg', at_c8)}, disaggregated "
        f"{vs_baseline(doc, 8, 'disagg', at_c8)}, Serve handles {vs_baseline(doc, 8, 'agg-serve', at_c8)}. Ray Serve "
        f"LLM vs the bare servers of its own runs, c=1 then c=8: aggregated {vs_baseline(agg, 1, 'rsllm-agg', at_c1)}, "
        f"{vs_baseline(agg, 8, 'rsllm-agg', at_c8)}; P/D {vs_baseline(pd, 1, 'rsllm-pd', at_c1)}, "
        f"{vs_baseline(pd, 8, 'rsllm-pd', at_c8)}"
    )
    agg_ttft = p50(doc, 1, "agg", "ttft") / bare
    agg_itl = p50(doc, 1, "agg", "itl") / p50(doc, 1, "bare", "itl")
    slack = budget - bare - kv
    c8_tpot = {
        system: p50(doc, 8, system, "tpot") / p50(doc, 8, doc["baseline_of"][system], "tpot")
        for system in ("agg", "disagg")
    }
    return Row(
        what=f"serving-layer overhead vs vLLM's own server (ISL {doc['workload']['isl']}, direct data plane, HAProxy)",
        result=result,
        sources=(OVERHEAD, OVERHEAD_RSLLM_AGG, OVERHEAD_RSLLM_PD),
        targets=(
            Target(f"aggregated c=1 TTFT p50 ≤ ×{AGG_TTFT_TARGET:.2f}", agg_ttft <= AGG_TTFT_TARGET),
            Target(f"aggregated c=1 ITL p50 ≤ ×{AGG_ITL_TARGET:.2f}", agg_itl <= AGG_ITL_TARGET),
            Target(
                f"disaggregated c=1 TTFT p50 ≤ bare + KV transfer + {slack:.0f} ms = {budget:.1f} ms "
                f"(is {disagg:.1f} ms)",
                disagg <= budget,
            ),
            *(
                Target(f"{name} c=8 TPOT p50 ≤ ×{C8_TPOT_TARGET:.2f}", c8_tpot[system] <= C8_TPOT_TARGET)
                for name, system in (("aggregated", "agg"), ("disaggregated", "disagg"))
            ),
        ),
    )


# Serving-layer capacity (frontend_capacity.json)


def capacity_points(system: str, c: int) -> list[dict[str, Any]]:
    """`system`'s measurements at concurrency `c`, by round."""
    rows = [r for r in load(CAPACITY)["rows"] if r["system"] == system and r["concurrency"] == c]
    return sorted(rows, key=lambda r: r["round"])


def cpu_us_per_token(system: str, c: int) -> list[float]:
    return [r["cpu_us_per_token_total"] for r in capacity_points(system, c)]


def tokens_per_s(system: str, c: int) -> list[float]:
    return [r["tokens_per_s"] for r in capacity_points(system, c)]


def ours_over_dynamo(c: int) -> list[float]:
    """Ours' CPU per token over Dynamo's, round by round."""
    return [o / d for o, d in zip(cpu_us_per_token("ours-direct", c), cpu_us_per_token("dynamo", c))]


def capacity_row() -> Row:
    doc = load(CAPACITY)
    levels = sorted({r["concurrency"] for r in doc["rows"]})
    top = levels[-1]
    us = "{:.0f}"
    per_level = ", ".join(
        f"{span(cpu_us_per_token('ours-direct', c), us)} vs {span(cpu_us_per_token('dynamo', c), us)} at c={c} "
        f"({times(ours_over_dynamo(c))})"
        for c in levels
    )
    everywhere = [v for c in levels for v in cpu_us_per_token("ours-serve", c)]
    ingress = [v for c in levels for v in cpu_us_per_token("ray-serve-llm", c)]
    merged = [r["events_per_token"] for r in capacity_points("ours-direct", top)]
    throughput = ", ".join(
        f"{name} {span(tokens_per_s(system, top), '{:,.0f}')}"
        for name, system in (
            ("Dynamo", "dynamo"),
            ("ours", "ours-direct"),
            ("Ray Serve LLM", "ray-serve-llm"),
            ("ours through Serve handles", "ours-serve"),
        )
    )
    result = (
        f"CPU µs a streamed token, whole path, ours vs Dynamo: {per_level}; at c={top} ours merges lagging tokens "
        f"({span(merged, '{:.2f}')} events a token). Ours through Serve handles {span(everywhere, us)} and Ray Serve "
        f"LLM's ingress {span(ingress, us)} at every c. Tokens/s at c={top}: {throughput}"
    )
    return Row(
        what=f"serving-layer capacity (simulated engines, {doc['setup']['frontends']} frontend), vs Dynamo's "
        "frontend + mocker and Ray Serve LLM's ingress",
        result=result,
        sources=(CAPACITY,),
        targets=tuple(
            Target(f"CPU per token ≤ ×{limit:.1f} Dynamo's at c={c}", max(ours_over_dynamo(c)) <= limit)
            for c, limit in CAPACITY_TARGETS.items()
        ),
    )


# Serving, ISL 1024 / OSL 64 (compare_serving.json, compare_serving_agg.json)


def by_round(source: str) -> dict[str, list[dict[str, Any]]]:
    """The systems of a compare_serving run, by label ("x (round 2)" is round 2 of "x"), in round order."""
    rounds: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for system in load(source)["systems"]:
        m = re.fullmatch(r"(.*?)(?: \(round (\d+)\))?", system["system"]["label"])
        rounds.setdefault(m[1], []).append((int(m[2] or 1), system))
    return {label: [s for _, s in sorted(runs, key=lambda r: r[0])] for label, runs in rounds.items()}


def knee_goodput(source: str, label: str) -> list[float]:
    return [s["knee"]["goodput_requests"] for s in by_round(source)[label]]


def goodput_ratios(source: str, ours: str, peer: str) -> list[float]:
    """Ours' goodput at the knee over the peer's, round by round."""
    return [o / p for o, p in zip(knee_goodput(source, ours), knee_goodput(source, peer))]


def cpu_ms_per_request(system: dict[str, Any], serving_only: bool = False) -> float:
    """CPU per request over the sweep; `serving_only` leaves out the engine processes."""
    cpu = system["cpu_ms_per_request_by_process"]
    engines = cpu["engine_core"] + cpu["engine_worker"]
    return sum(cpu.values()) - (engines if serving_only else 0)


def serving_row() -> Row:
    doc, cpu = load(SERVING), by_round(SERVING_CPU)
    dataset = doc["systems"][0]["dataset"]
    n_rounds = len(by_round(SERVING)["ours-agg"])

    def goodputs(label: str) -> str:
        return " / ".join(f"{g:.2f}" for g in knee_goodput(SERVING, label))

    def ratios(source: str, ours: str, peer: str) -> str:
        return " / ".join(f"×{r:.2f}" for r in goodput_ratios(source, ours, peer))

    ours_cpu = [s for label in ("ours-agg", "ours-agg-rr") for s in cpu[label]]
    vllm_rounds = cpu["vllm-dp2"]
    cpu_ratio = [
        cpu_ms_per_request(s) / cpu_ms_per_request(v)
        for label in ("ours-agg", "ours-agg-rr")
        for s, v in zip(cpu[label], vllm_rounds)
    ]
    result = (
        f"goodput at the knee, req/s, round by round: ours disaggregated {goodputs('ours-disagg')} vs Ray Serve "
        f"LLM's P/D app configured alike {goodputs('ray-serve-llm-pd')} "
        f"({ratios(SERVING, 'ours-disagg', 'ray-serve-llm-pd')}); ours aggregated {goodputs('ours-agg')} vs plain "
        f"vLLM DP2 {goodputs('vllm-dp2')} ({ratios(SERVING, 'ours-agg', 'vllm-dp2')}). Rerun with CPU by process: "
        f"{ratios(SERVING_CPU, 'ours-agg', 'vllm-dp2')} KV-aware, {ratios(SERVING_CPU, 'ours-agg-rr', 'vllm-dp2')} "
        f"round robin; ours spends {times(cpu_ratio)} vLLM DP2's CPU per request (serving processes "
        f"{span((cpu_ms_per_request(s, serving_only=True) for s in ours_cpu), '{:.0f}')} ms vs its API server "
        f"{span((v['cpu_ms_per_request_by_process']['api_server'] for v in vllm_rounds), '{:.0f}')})"
    )
    return Row(
        what=f"serving, ISL {dataset['isl']['mean']} / OSL {dataset['osl']['mean']}, CPU engines ({n_rounds} rounds; "
        "the engines' fixed 50 µs queue poll, rerun below)",
        result=result,
        sources=(SERVING, SERVING_CPU),
    )


def serving_poll_row() -> Row:
    """Ours aggregated vs plain vLLM DP2 again, every engine's queue poll backing off."""
    rounds = by_round(SERVING_POLL)
    ours, vllm = rounds["ours-agg"], rounds["vllm-dp2"]
    agg = goodput_ratios(SERVING_POLL, "ours-agg", "vllm-dp2")
    serving = [cpu_ms_per_request(s, serving_only=True) for s in ours]
    api = [v["cpu_ms_per_request_by_process"]["api_server"] for v in vllm]
    cpu_ratio = [o / a for o, a in zip(serving, api)]
    result = (
        "goodput at the knee, req/s, round by round: ours aggregated "
        f"{' / '.join(f'{g:.2f}' for g in knee_goodput(SERVING_POLL, 'ours-agg'))} vs plain vLLM DP2 "
        f"{' / '.join(f'{g:.2f}' for g in knee_goodput(SERVING_POLL, 'vllm-dp2'))} "
        f"({' / '.join(f'×{r:.2f}' for r in agg)}). CPU ms per request: our serving processes "
        f"{span(serving, '{:.0f}')} vs vLLM's API server {span(api, '{:.0f}')} ({times(cpu_ratio)}); engines "
        f"{span((cpu_ms_per_request(s) - cpu_ms_per_request(s, serving_only=True) for s in ours), '{:.0f}')} vs "
        f"{span((cpu_ms_per_request(v) - v['cpu_ms_per_request_by_process']['api_server'] for v in vllm), '{:.0f}')}"
    )
    return Row(
        what="the same, aggregated, rerun with every engine's queue poll backing off (2 rounds)",
        result=result,
        sources=(SERVING_POLL,),
        targets=(
            Target(
                f"ours aggregated goodput at the knee ≥ ×{GOODPUT_TARGET:.2f} plain vLLM DP2",
                min(agg) >= GOODPUT_TARGET,
            ),
            Target(
                f"serving-process CPU per request ≤ ×{SERVING_CPU_TARGET:.1f} vLLM's API server",
                max(cpu_ratio) <= SERVING_CPU_TARGET,
            ),
        ),
    )


# vLLM's CPU engine, queues polled vs spun (cpu_engine_polling.json)


def polling_mean(mode: str, level: str, metric: str) -> float:
    """`metric` at concurrency `level`, `mode` "spin" or "poll", mean over rounds."""
    return statistics.fmean(run["levels"][level][metric] for run in load(POLLING)["runs"][mode])


def polling_losses() -> list[str]:
    """Where polling came out worse than spinning: latency up or throughput down (the JSON's poll / spin)."""
    worse = []
    for level, r in load(POLLING)["ratio"].items():
        for metric, name in (("ttft_ms_p50", "TTFT p50"), ("tpot_ms_p50", "TPOT p50")):
            if r[metric] > 1:
                worse.append(f"{name} ×{r[metric]:.2f} at c={level}")
        if r["request_throughput"] < 1:
            worse.append(f"throughput ×{r['request_throughput']:.2f} at c={level}")
    return worse


def polling_row() -> Row:
    doc = load(POLLING)
    levels = list(doc["ratio"])
    low, high = levels[0], levels[-1]
    idle = [statistics.fmean(run["idle_engine_cores"] for run in doc["runs"][mode]) for mode in ("spin", "poll")]
    polled_cores = [polling_mean("poll", level, "engine_cores") for level in levels]
    throughput = [doc["ratio"][level]["request_throughput"] for level in levels]
    result = (
        f"vLLM's OpenAI server, one engine, {doc['rounds']} alternating rounds, spun → polled: engine "
        f"{polling_mean('spin', low, 'engine_cores'):.2f} → {polling_mean('poll', low, 'engine_cores'):.2f} cores "
        f"at c={low} ({span(polled_cores, '{:.2f}')} polled at every load; idle {idle[0]:.2f} → {idle[1]:.2f}); "
        f"throughput {times(throughput)} (c={low}–{high}); TTFT p50 at c={high} "
        f"{polling_mean('spin', high, 'ttft_ms_p50'):.0f} → {polling_mean('poll', high, 'ttft_ms_p50'):.0f} ms. "
        f"Worse polled: {', '.join(polling_losses()) or 'nothing'}"
    )
    return Row(
        what=f"vLLM CPU engine, queues polled ({doc['poll_us']} µs) vs spun (`engine.cpu.shm_poll_us`)",
        result=result,
        sources=(POLLING,),
    )


# Faults under load (faults.json)


def fault_scenarios() -> dict[str, dict[str, Any]]:
    """Every scenario of the run, the shipped config's last."""
    doc = load(FAULTS)
    return {**doc["scenarios"], **doc["shipped_scenarios"]}


def counter(scenario: dict[str, Any], prefix: str, needle: str = "") -> float:
    """The sum of the frontend counters named `prefix`… that contain `needle`."""
    counters = scenario["frontend_counters"]
    return sum(v for k, v in counters.items() if k.startswith(prefix) and needle in k)


def faults_row() -> Row:
    scenarios = fault_scenarios()
    faulted = {name: s for name, s in scenarios.items() if s["injected"] != "-"}
    baseline = [s for s in scenarios.values() if s["injected"] == "-"]
    shipped_name, shipped = list(load(FAULTS)["shipped_scenarios"].items())[-1]
    lost = sum(s["lost"] for s in scenarios.values())
    hung = sum(s["hung"] for s in scenarios.values())
    answered = sum(s["answered"] for s in scenarios.values())
    sent = sum(s["sent"] for s in scenarios.values())
    local = {n: counter(s, "orchestrator_route_decisions_total", "kind=local_prefill") for n, s in faulted.items()}
    migrations = " / ".join(f"{counter(s, 'orchestrator_decode_migrations_total'):.0f}" for s in faulted.values())
    in_flight = span((s["in_flight_at_injection"] for s in faulted.values()), "{}")
    parts = [
        f"{lost} lost, {hung} hung, {answered} of {sent} answered: {sum(s['sent'] for s in faulted.values())} "
        f"requests sent under {len(faulted)} faults ({', '.join(faulted)}), {sum(s['sent'] for s in baseline)} in "
        "the no-fault baseline",
        f"{in_flight} streams in flight at each fault",
        f"migrations {migrations}",
        *(f"{n}: {v:.0f} prefilled locally" for n, v in local.items() if v),
        f"{shipped_name} (shipped config): E2E p99 {shipped['e2e_ms']['p99'] / 1000:.1f} s vs "
        f"{baseline[0]['e2e_ms']['p99'] / 1000:.1f} without a fault",
    ]
    return Row(
        what="faults under load (decode killed, engine crash, prefill killed; the shipped config losing its only "
        "decode replica)",
        result="; ".join(parts),
        sources=(FAULTS,),
    )


def ingress_faults_row() -> Row:
    """faults.py's ingress scenarios: a frontend replica killed (every request started after it must be
    answered) and HAProxy killed (what is lost, measured)."""
    doc = load(FAULTS_INGRESS)
    killed = doc["ingress_scenarios"]["frontend-replica-killed"]
    proxy = doc["ingress_scenarios"]["haproxy-restarted"]

    def lost(s: dict[str, Any]) -> str:
        return (
            f"{s['lost']} of {s['sent']} lost ({s['in_flight_at_injection']} in flight at the fault; "
            f"{s['failed_after']} of the {s['started_after']} started after it failed)"
        )

    back = proxy["answering_again_after_s"]
    recovery = (
        f"answering again within {back:.0f} s (Ray's HAProxy manager restarts it)"
        if back is not None
        else "not answering again within the run"
    )
    result = (
        f"2 frontend replicas behind HAProxy. One frontend killed: {lost(killed)}. HAProxy SIGKILLed: "
        f"{lost(proxy)}; {recovery}"
    )
    return Row(
        what="faults at the ingress (frontend replica killed; HAProxy killed)",
        result=result,
        sources=(FAULTS_INGRESS,),
        targets=(Target("every request started after a frontend is killed answered", not killed["failed_after"]),),
    )


def host_loss_row() -> Row:
    doc = load(HOST_LOSS)
    load_ = doc["load"]
    migrations = doc["frontend_counters"].get("orchestrator_decode_migrations_total", 0)
    result = (
        f"two-host network-namespace cluster, the worker host (1 of 2 decode replicas) lost under a closed loop "
        f"of {doc['concurrency']} streams (link down, every process SIGKILLed): {load_['answered']} of "
        f"{load_['sent']} answered in full, {load_['lost']} lost, {load_['hung']} hung, {migrations:.0f} "
        f"migrations; E2E max {load_['e2e_max_ms'] / 1000:.1f} s (the data plane finds a silent peer dead in "
        f"11 s); Serve ran 2 decode replicas again after {doc['rescheduled_after_s']} s"
    )
    met = not (load_["lost"] or load_["hung"]) and doc["rescheduled_after_s"] is not None
    return Row(
        what="a whole host lost under load",
        result=result,
        sources=(HOST_LOSS,),
        targets=(Target("nothing lost; Serve reschedules", met),),
    )


def stalled_readers_row() -> Row:
    doc = load(STALLED)
    parts, met = [], True
    for mode, run in doc["modes"].items():
        for loaded in run["loads"].values():
            growth, stall = loaded["memory_growth"], loaded["stall"]
            whole = stall["outcomes"].get("done", 0)
            parts.append(
                f"{mode}, {loaded['streams']} streams of {loaded['choices']} x {loaded['max_tokens']} tokens: frontend "
                f"{growth['frontend']:+.1%}, decode replica {growth['decode_replica']:+.1%}, engines "
                f"{growth['engine']:+.1%}; engine streams parked and continued {stall['parked_streams']:.0f} of "
                f"{loaded['streams'] * loaded['choices']}; "
                f"whole {whole}, same text as read {stall['same_text_as_read']}"
            )
            if mode == "park":
                met = met and max(growth["frontend"], growth["decode_replica"]) <= 0.05
    stall_s = {loaded["stall_s"] for run in doc["modes"].values() for loaded in run["loads"].values()}
    result = (
        f"streams ({doc['config']['logprobs']} top logprobs a token) unread for {max(stall_s):.0f} s; resident "
        "memory, the largest sample against the same load read as it came: " + "; ".join(parts)
    )
    return Row(
        what="stalled readers (parked: the engine request aborted, continued when the client reads)",
        result=result,
        sources=(STALLED,),
        targets=(Target("frontend and replica memory within 5%, parking on", met),),
    )


# Overload at 2× and 5× the knee (soak.json)


def check_name(key: str) -> str:
    """A soak check's key as words: "rejection_p99_le_100ms" → "rejection p99 ≤ 100 ms"."""
    words = {"le": "≤", "ttft": "TTFT"}
    text = re.sub(r"(\d+)pct", r"\1%", re.sub(r"(\d+)ms", r"\1 ms", re.sub(r"(\d+)x", r"\1×", key)))
    return " ".join(words.get(w, w) for w in text.replace("_", " ").split())


def factor(phase: dict[str, Any]) -> str:
    return f"{phase['factor']:g}×"


def largest_memory_growth(phase: dict[str, Any]) -> tuple[str, float]:
    """The process whose resident memory grew most over the phase, and by how many MiB."""
    growth = {name: m["end"] - m["after_warmup"] for name, m in phase["memory_by_process_mib"].items()}
    name = max(growth, key=growth.__getitem__)
    return name, growth[name]


def soak_row() -> Row:
    doc = load(SOAK)
    phases = doc["phases"]
    checks = list(phases[0]["checks"])
    failed = [f"{check_name(c)} at {factor(p)}" for p in phases for c in checks if not p["checks"][c]]
    grown = max(phases, key=lambda p: p["memory_mib"]["growth"])
    process, mib = largest_memory_growth(grown)
    memory = grown["memory_mib"]

    def each(fmt: str, value: Any) -> str:
        return " / ".join(fmt.format(value(p)) for p in phases)

    result = (
        f"soak.json pass: {str(doc['pass']).lower()}"
        + (f" (failed: {', '.join(failed)})" if failed else "")
        + f". {each('{}', factor)} ({each('{:.1f}', lambda p: p['offered_rps'])} req/s offered): "
        f"{sum(p['lost'] for p in phases)} of {sum(p['outcomes']['sent'] for p in phases):,} lost; "
        f"429 + Retry-After p99 {each('{:.1f}', lambda p: p['rejection_ms']['p99'])} ms; client in flight max "
        f"{each('{}', lambda p: p['in_flight_client_max'])} vs a limit of {doc['max_in_flight']}; answered TTFT p99 "
        f"{each('{:.0f}', lambda p: p['answered_ttft_ms']['p99'])} ms vs {doc['knee_ttft_p99_ms']:.0f} at the knee; "
        f"memory {each('{:+.1%}', lambda p: p['memory_mib']['growth'])} ({factor(grown)}: {process} "
        f"{mib:+.0f} of {memory['end'] - memory['after_warmup']:+.0f} MiB)"
    )
    minutes = f"{doc['minutes_per_phase']:g}"
    return Row(
        what=f"overload at {' and '.join(factor(p) for p in phases)} the knee, {minutes} min each (HAProxy, direct "
        "data plane, admission limit = the knee's concurrency)",
        result=result,
        sources=(SOAK,),
        targets=tuple(Target(check_name(c), all(p["checks"][c] for p in phases)) for c in checks),
    )


# Harness vs AIPerf (aiperf_crosscheck.json)

THREE_METRICS = {"ttft_ms_p50": "TTFT p50", "tpot_ms_p50": "TPOT p50", "request_throughput": "req/s"}
QUOTED = "real-fair-pinned-text-quiet"  # the configuration the hand-typed row quoted
AS_SHIPPED = "real-as-shipped"


def within_key(config: dict[str, Any]) -> str:
    """The key of the configuration's agreement verdicts ("within_5_percent")."""
    return next(k for k in config if k.startswith("within_"))


def tolerance(config: dict[str, Any]) -> str:
    """The agreement the verdicts hold to, as the key names it: "within_5_percent" → "5%"."""
    return re.search(r"\d+", within_key(config))[0] + "%"


def within_on_all_three(config: dict[str, Any]) -> bool:
    return all(config[within_key(config)][m] for m in THREE_METRICS)


def round_ratios(config: dict[str, Any]) -> list[float]:
    """Ours / AIPerf of the three metrics in each single round."""
    return [r["ours"][m] / r["aiperf"][m] for r in config["rounds"] for m in THREE_METRICS]


def aiperf_row() -> Row:
    configs = load(AIPERF)["results"]
    agreeing = [name for name, c in configs.items() if within_on_all_three(c)]
    quoted = configs[QUOTED]
    shipped = configs[AS_SHIPPED]["mean"]
    shipped_ttft = ratio(shipped["aiperf"]["ttft_ms_p50"], shipped["ours"]["ttft_ms_p50"])
    figures = ", ".join(f"{name} {percent(quoted['ratio_ours_over_aiperf'][m])}" for m, name in THREE_METRICS.items())
    result = (
        f"within {tolerance(quoted)} on all three ({', '.join(THREE_METRICS.values())}) in {len(agreeing)} of "
        f"{len(configs)} configurations ({', '.join(agreeing) or 'none'}). {QUOTED} (server and load generators on "
        f"separate cores, text prompts, quiet machine), ours vs AIPerf, mean of {len(quoted['rounds'])} alternating "
        f"rounds: {figures}; single rounds {times(round_ratios(quoted))}. AIPerf as shipped busy-polls a core, "
        f"slowing the server: AIPerf's TTFT p50 {shipped_ttft} ours"
    )
    return Row(what="harness vs AIPerf, same server and workload", result=result, sources=(AIPERF,))


def rows() -> list[Row]:
    return [
        overhead_row(),
        capacity_row(),
        serving_row(),
        serving_poll_row(),
        polling_row(),
        faults_row(),
        ingress_faults_row(),
        host_loss_row(),
        stalled_readers_row(),
        soak_row(),
        aiperf_row(),
    ]
