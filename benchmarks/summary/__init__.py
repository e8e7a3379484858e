"""The headline results, generated from the committed JSON under benchmarks/results/.

One row per claim (`Row`); each row module reads its result files and computes every figure it prints,
and the target verdicts, from them. `python -m benchmarks.summary` writes the rows into README.md and
BENCHMARKS.md between the summary markers; `--check` exits non-zero where the committed text differs
(the unit test runs the same check).
"""
