#!/usr/bin/env bash
# Resolves the GPU install of SGLang pools, '.[sglang]', together with the
# project's pins, using pip's resolver without installing anything (a dry
# run: about 30 s, most of it reading package metadata from the index), and
# writes the versions it chose to constraints/sglang.txt. Then tries
# '.[gpu,sglang]' and records in the same file why one environment cannot
# hold both. Exits non-zero if '.[sglang]' does not resolve.
#
#     bash scripts/resolve_sglang.sh        # needs the package index, not a GPU
#
# CI does not run this (it reads the full SGLang dependency tree); the unit
# test tests/unit/test_sglang_install.py checks, offline, that the pins and
# this file's output still agree with the SGLang release that is pinned.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
out=constraints/sglang.txt
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

resolve() {  # resolve EXTRAS REPORT LOG
  "$PYTHON" -m pip install --dry-run --ignore-installed --report "$2" ".[$1]" >"$3" 2>&1
}

if ! resolve sglang "$work/sglang.json" "$work/sglang.log"; then
  grep '^ERROR\|conflict\|depends on' "$work/sglang.log" >&2 || true
  echo "'.[sglang]' does not resolve" >&2
  exit 1
fi
if resolve gpu,sglang "$work/both.json" "$work/both.log"; then
  both="'.[gpu,sglang]' resolves too."
else
  cause=$(sed -n '/conflict is caused by/,/^$/p' "$work/both.log" | sed '1d;/^$/d;s/^ *//' | paste -sd ';' -)
  both="'.[gpu,sglang]' does not resolve: ${cause//;/; }"
fi

"$PYTHON" - "$work/sglang.json" "$both" "$out" <<'EOF'
import json
import platform
import sys

report, both, out = sys.argv[1], sys.argv[2], sys.argv[3]
items = sorted((i["metadata"]["name"], i["metadata"]["version"]) for i in json.load(open(report))["install"])
lines = [
    "# Exact versions '.[sglang]' resolves to with pip's resolver (a dry run:",
    "# nothing here was installed or run on a GPU), written by",
    f"# scripts/resolve_sglang.sh on {platform.system().lower()} {platform.machine()},"
    f" CPython {platform.python_version()}.",
    "# GPU install: pip install -c constraints/sglang.txt '.[sglang]'",
    f"# {both}",
]
lines += [f"{name}=={version}" for name, version in items if name != "ray-disagg-orchestrator"]
open(out, "w").write("\n".join(lines) + "\n")
print(f"wrote {out}: {len(lines) - 5} packages")
EOF
