"""Markdown tables and PNG plots of benchmark results (one or several systems)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def markdown_table(doc: dict[str, Any]) -> str:
    """One row per sweep point of one result document."""
    slo = ", ".join(f"{k}={v:g}" for k, v in doc["slo"].items()) or "none"
    lines = [
        f"### {doc['system']['label']}: {doc['dataset'].get('kind', '')} ({doc['load'].get('mode', '')}), SLO {slo}",
        "",
        "| concurrency | req/s | out tok/s | goodput req/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | TPOT p50 ms | E2E p50 ms | ok / sent |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    knee = (doc.get("knee") or {}).get("concurrency")
    for p in doc["sweep"]:
        mark = " (knee)" if p["concurrency"] == knee else ""
        lines.append(
            f"| {_fmt(p['concurrency'], 0)}{mark} | {_fmt(p['request_throughput'], 2)} | {_fmt(p['output_token_throughput'])} "
            f"| {_fmt(p['goodput_requests'], 2)} | {_fmt(p['ttft_ms']['p50'])} / {_fmt(p['ttft_ms']['p99'])} "
            f"| {_fmt(p['itl_ms']['p50'], 2)} / {_fmt(p['itl_ms']['p99'], 2)} | {_fmt(p['tpot_ms']['p50'], 2)} "
            f"| {_fmt(p['e2e_ms']['p50'])} | {p['completed']} / {p['sent']} |"
        )
    return "\n".join(lines) + "\n"


def plot_sweep(docs: list[dict[str, Any]], path: str | Path) -> None:
    """Throughput and goodput vs concurrency, TTFT and ITL percentiles vs
    concurrency; one line per system."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for doc in docs:
        label = doc["system"]["label"]
        xs = [p["concurrency"] for p in doc["sweep"]]
        line = axes[0].plot(xs, [p["request_throughput"] for p in doc["sweep"]], marker="o", label=f"{label} throughput")
        color = line[0].get_color()
        axes[0].plot(xs, [p["goodput_requests"] for p in doc["sweep"]], marker="x", linestyle="--", color=color,
                     label=f"{label} goodput")
        for pct, style in (("p50", "-"), ("p99", ":")):
            axes[1].plot(xs, [p["ttft_ms"][pct] for p in doc["sweep"]], linestyle=style, marker=".", color=color,
                         label=f"{label} TTFT {pct}")
            axes[2].plot(xs, [p["itl_ms"][pct] for p in doc["sweep"]], linestyle=style, marker=".", color=color,
                         label=f"{label} ITL {pct}")
        knee = (doc.get("knee") or {}).get("concurrency")
        if knee is not None:
            axes[0].axvline(knee, color=color, alpha=0.3)
    for ax, title, unit in zip(axes, ("throughput / goodput", "time to first token", "inter-token latency"),
                               ("requests/s", "ms", "ms")):
        ax.set_title(title)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
