"""Every headline row, in the order the summary lists them."""

from __future__ import annotations

from benchmarks.summary import lora_rows, planner_rows, routing_rows, serving_rows, simulator_rows, slo_rows
from benchmarks.summary.row import Row


def rows() -> list[Row]:
    return [
        *serving_rows.rows(),
        *routing_rows.rows(),
        *simulator_rows.rows(),
        *planner_rows.rows(),
        *lora_rows.rows(),
        *slo_rows.rows(),
    ]
