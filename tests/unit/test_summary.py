"""The headline tables in README.md and BENCHMARKS.md are what the committed JSON gives now."""

from __future__ import annotations

import pytest

from benchmarks.launch import RESULTS
from benchmarks.summary import headline, render
from benchmarks.summary.row import Row, Target


def test_the_committed_summaries_are_generated_from_the_committed_results() -> None:
    assert render.stale(headline.rows) == [], "run: python -m benchmarks.summary"


def test_every_row_names_committed_results_and_a_date() -> None:
    for row in headline.rows():
        assert row.sources, row.what
        for source in row.sources:
            assert (RESULTS / source).is_file(), source
        assert "(20" in row.cells()[2], row.cells()[2]


def test_a_hand_edit_inside_the_markers_is_caught(tmp_path) -> None:
    doc = tmp_path / "README.md"
    rows = [Row("x", "1.0 ms", ("soak.json",), (Target("≤ 2 ms", True),))]
    doc.write_text(f"# t\n{render.BEGIN}\nold\n{render.END}\ntail\n")
    assert render.stale(lambda: rows, [doc]) == [doc]
    assert render.write(lambda: rows, [doc]) == [doc]
    assert render.stale(lambda: rows, [doc]) == []
    text = doc.read_text()
    assert "| x | 1.0 ms | `soak.json` (" in text and "≤ 2 ms: met" in text and text.endswith(f"{render.END}\ntail\n")
    doc.write_text(text.replace("1.0 ms", "0.9 ms"))
    assert render.stale(lambda: rows, [doc]) == [doc]


def test_a_document_without_its_markers_is_an_error(tmp_path) -> None:
    doc = tmp_path / "README.md"
    doc.write_text("# no summary here\n")
    with pytest.raises(ValueError, match="markers"):
        render.stale(lambda: [], [doc])
