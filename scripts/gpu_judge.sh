#!/bin/bash
# Judges torch CUDA dumps (scripts/gpu_dump.py, run on a GPU machine) with `sharpcheck compare`,
# forward and backward of each SDPA backend, with no recipe named (the default verdict), and
# prints one line each: the verdict, the bound ratio and the recipe that fits (docs/verdicts.md).
# Usage: scripts/gpu_judge.sh build/sharpcheck DUMP_DIRECTORY [more compare options]
S=$1; D=$2; shift 2
for f in attn_bf16_full attn_bf16_causal attn_fp16_full attn_fp16_causal attn_bf16_causal_gqa; do
  fmt=${f:5:4}; causal=""; [[ $f == *causal* ]] && causal=--causal
  for b in flash efficient cudnn math; do
    z=$D/$f.npz
    python3 -c "import numpy as np,sys; z=np.load('$z'); sys.exit(0 if '${b}_out' in z.files else 1)" 2>/dev/null || continue
    lse=""; python3 -c "import numpy as np,sys; z=np.load('$z'); sys.exit(0 if '${b}_lse' in z.files else 1)" && lse="--lse $z:${b}_lse"
    fw=$($S compare --q $z:q --k $z:k --v $z:v --out $z:${b}_out $lse $causal --format $fmt "$@" 2>&1)
    bw=$($S compare --q $z:q --k $z:k --v $z:v --dout $z:dout --dq $z:${b}_dq --dk $z:${b}_dk --dv $z:${b}_dv $causal --format $fmt "$@" 2>&1)
    echo "$f $b forward: $(echo "$fw" | grep -E '^(pass|FAIL)' | tail -1) | $(echo "$fw" | head -1 | sed 's/.*bound ratio/ratio/;s/, max |sum.*//') | $(echo "$fw" | grep -E 'pass as|pass under|FAIL fits|FAIL fails' | head -1 | cut -c1-120)"
    echo "$f $b backward: $(echo "$bw" | grep -E '^(pass|FAIL)' | tail -1) | $(echo "$bw" | head -1 | sed 's/.*bound ratio/ratio/;s/, max |sum.*//') | $(echo "$bw" | grep -E 'pass as|pass under|FAIL fits|FAIL fails' | head -1 | cut -c1-140)"
  done
done
