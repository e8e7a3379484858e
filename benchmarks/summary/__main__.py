"""python -m benchmarks.summary [--check]: write the headline rows into README.md and BENCHMARKS.md, or
(--check) exit 1 naming the documents whose summary differs from the committed JSON."""

from __future__ import annotations

import argparse
import sys

from benchmarks.summary import headline, render


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--check", action="store_true", help="change nothing; fail if a document's summary is stale")
    args = p.parse_args()
    if args.check:
        stale = render.stale(headline.rows)
        if stale:
            sys.exit("stale summary in " + ", ".join(str(p) for p in stale) + ": run python -m benchmarks.summary")
        return
    for path in render.write(headline.rows):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
