#!/bin/bash
# The trained-operator matrix of docs/escapes_trained.md (issue 19): every operator of
# experiments/max_retrieval/operators.hpp trained in the head with each training seed, read at
# 16..16,384 items, then summarised. Runs JOBS trainings at once (each on one torch thread).
#   scripts/escapes_trained.sh [OUT_DIR] [STEPS] [TRAINING_SEEDS] [JOBS] [SAMPLES]
set -euo pipefail
out=${1:-docs/escapes_trained}
steps=${2:-5000}
seeds=${3:-3}
jobs=${4:-2}
samples=${5:-64}
binary=${MAX_RETRIEVAL:-build/max_retrieval}
mkdir -p "$out/logs"
operators="softmax adaptive ssmax length_scaled sigmoid stick_breaking selective differential qk_norm softcap entmax15"
start=$(date +%s)
for seed in $(seq 1 "$seeds"); do
  for op in $operators; do
    [ -f "$out/operator_${op}_seed${seed}.csv" ] || echo "$op $seed"
  done
done | xargs -P "$jobs" -n 2 sh -c \
  "'$binary' --operator \"\$0\" --training-seed \"\$1\" --steps $steps --seeds 10 --samples $samples --out '$out' > '$out/logs/'\"\$0\"_seed\"\$1\".log 2>&1"
"$binary" --summarise "$out"
echo "matrix done in $(( $(date +%s) - start )) s"
