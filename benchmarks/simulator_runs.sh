#!/usr/bin/env bash
# The cluster-simulator results quoted in BENCHMARKS.md (virtual time; CPU
# seconds of each run are recorded in its JSON as load.simulator_cpu_s).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
R=benchmarks/results/simulator
MOONCAKE=../shared/traces/mooncake_conversation.jsonl
mkdir -p $R
# One hour of the Mooncake conversation trace (12,031 requests, full-size prompts) on 16 simulated H100s,
# KV-aware routing vs round robin.
for routing in kv_aware round_robin; do
  orchestrator simulate --prefill 0 --decode 16 --routing $routing --workload mooncake --trace-path $MOONCAKE \
    --block-tokens 512 --mode trace --num-requests 12031 --out $R/mooncake_16_$routing.json
done
# 256 replicas (64 prefill + 192 decode) at 100 req/s.
orchestrator simulate --prefill 64 --decode 192 --workload synthetic --isl 2000 --isl-std 500 --osl 200 \
  --shared-prefix 0.5 --num-prefixes 64 --mode rate --rate 100 --num-requests 6000 --out $R/replicas_256.json
# Disaggregation on one 8-GPU node, Llama-3.1-70B at TP4: ISL 3000 / OSL 150 (long prompts) and
# ISL 200 / OSL 150 unique short prompts; 2 aggregated replicas vs 1 prefill + 1 decode.
for shape in "3000 150 long" "200 150 short"; do
  set -- $shape
  for layout in "0 2 agg" "1 1 disagg"; do
    set -- $shape $layout
    orchestrator simulate --prefill $4 --decode $5 --sim-model llama-3.1-70b --tp 4 --link nvlink \
      --local-prefill-max-tokens 0 --workload synthetic --isl $1 --osl $2 --mode concurrency \
      --concurrency 4,8,16,32,64,96 --requests-per-point 400 --slo ttft_p99_ms=2000 itl_p50_ms=50 \
      --out $R/llama70b_${3}_$6.json
  done
done
# Autoscaling: the Azure trace (8x its rate, 30 minutes) and sinusoidal phases (prefill- then decode-heavy);
# every policy decides each 10 s (replica start-up 30 s); --jobs runs the policies in parallel processes.
python -m benchmarks.autoscale --workload azure --minutes 30 --rate-scale 8 --interval-s 10 --jobs 4 \
  --out $R/autoscale_azure.json
python -m benchmarks.autoscale --workload phases --minutes 30 --rate 20 --interval-s 10 --jobs 4 \
  --out $R/autoscale_phases.json
