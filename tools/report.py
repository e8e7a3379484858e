"""Markdown tables and PNG plots of benchmark results (one or several systems)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


def _fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table: the header, its rule, then one line a row (cells as given, through str; an empty
    one as `| |`); ends with a newline."""

    def line(cells: Sequence[Any]) -> str:
        return "|" + "".join(f" {c} |" if str(c) else " |" for c in cells)

    return "\n".join([line(header), "|" + "---|" * len(header), *map(line, rows)]) + "\n"


def markdown_table(doc: dict[str, Any]) -> str:
    """One row per sweep point of one result document."""
    slo = ", ".join(f"{k}={v:g}" for k, v in doc["slo"].items()) or "none"
    knee = (doc.get("knee") or {}).get("concurrency")
    header = (
        "concurrency",
        "req/s",
        "out tok/s",
        "goodput req/s",
        "TTFT p50 / p99 ms",
        "ITL p50 / p99 ms",
        "TPOT p50 ms",
        "E2E p50 ms",
        "ok / sent",
    )
    rows = [
        (
            f"{_fmt(p['concurrency'], 0)}{' (knee)' if p['concurrency'] == knee else ''}",
            _fmt(p["request_throughput"], 2),
            _fmt(p["output_token_throughput"]),
            _fmt(p["goodput_requests"], 2),
            f"{_fmt(p['ttft_ms']['p50'])} / {_fmt(p['ttft_ms']['p99'])}",
            f"{_fmt(p['itl_ms']['p50'], 2)} / {_fmt(p['itl_ms']['p99'], 2)}",
            _fmt(p["tpot_ms"]["p50"], 2),
            _fmt(p["e2e_ms"]["p50"]),
            f"{p['completed']} / {p['sent']}",
        )
        for p in doc["sweep"]
    ]
    title = f"### {doc['system']['label']}: {doc['dataset'].get('kind', '')} ({doc['load'].get('mode', '')}), SLO {slo}"
    return f"{title}\n\n" + table(header, rows)


def pyplot():
    """matplotlib's pyplot, drawing to files only (the Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, dpi: int = 110) -> None:
    """Lay `fig` out, write it to `path` and close it."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def plot_sweep(docs: list[dict[str, Any]], path: str | Path) -> None:
    """Throughput and goodput vs concurrency, TTFT and ITL percentiles vs
    concurrency; one line per system."""
    fig, axes = pyplot().subplots(1, 3, figsize=(16, 4.5))
    for doc in docs:
        label = doc["system"]["label"]
        xs = [p["concurrency"] for p in doc["sweep"]]
        line = axes[0].plot(
            xs, [p["request_throughput"] for p in doc["sweep"]], marker="o", label=f"{label} throughput"
        )
        color = line[0].get_color()
        axes[0].plot(
            xs,
            [p["goodput_requests"] for p in doc["sweep"]],
            marker="x",
            linestyle="--",
            color=color,
            label=f"{label} goodput",
        )
        for pct, style in (("p50", "-"), ("p99", ":")):
            for ax, key, name in ((axes[1], "ttft_ms", "TTFT"), (axes[2], "itl_ms", "ITL")):
                values = [p[key][pct] for p in doc["sweep"]]
                ax.plot(xs, values, linestyle=style, marker=".", color=color, label=f"{label} {name} {pct}")
        knee = (doc.get("knee") or {}).get("concurrency")
        if knee is not None:
            axes[0].axvline(knee, color=color, alpha=0.3)
    for ax, title, unit in zip(
        axes, ("throughput / goodput", "time to first token", "inter-token latency"), ("requests/s", "ms", "ms")
    ):
        ax.set_title(title)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    save_figure(fig, path)
