#!/usr/bin/env bash
# One prepared GPU characterization for ftscope's calibration (issue 4), sized for a single H200 in < 8 min.
#
#   device run:  bash benchmarks/gpu/characterize.sh            (writes the store + JSON export under $OUT)
#   dry run:     DRY_RUN=1 OUT=/tmp/char bash benchmarks/gpu/characterize.sh   (tiny shapes on CPU: checks the flow)
#
# Matrix (random weights, real transformers + PEFT): Llama-shaped dense models at 1B / 3B / 8B (llama-3.2-1b,
# llama-3.2-3b, llama-3.1-8b) x full / LoRA x checkpointing on/off x sdpa/eager, batch sweeps at seq 1024;
# a Mixtral-shaped MoE with 4 of its 32 layers (hidden 4096, 8 experts) at top-2 vs top-8 and eager vs
# grouped_mm experts; one max-batch search under a 40 GiB cap (an A100-40GB-sized budget).
# QLoRA is not in the matrix: the device image has no bitsandbytes (a wheel is too large to carry).
# After the run, commit $OUT/gpu-runs.sqlite and $OUT/gpu-runs.json under data/measurements/.
set -uo pipefail
cd "$(dirname "$0")/../.."
source benchmarks/gpu/lib.sh
D=benchmarks/gpu/scenarios
# dense: sizes x method x checkpointing x attention
for model in llama-3.2-1b llama-3.2-3b llama-3.1-8b; do
  run "$model lora sdpa"        90 $D/dense.yaml model=$model mix.method=lora --batch-sizes 1,2,4,8,16
  run "$model lora sdpa +gc"    90 $D/dense.yaml model=$model mix.method=lora mix.gradient_checkpointing=true --batch-sizes 1,4,16
  run "$model lora eager"       60 $D/dense.yaml model=$model mix.method=lora mix.attention=eager --batch-sizes 1,4
done
run "llama-3.2-1b full sdpa"      90 $D/dense.yaml model=llama-3.2-1b mix.method=full --batch-sizes 1,2,4,8,16
run "llama-3.2-3b full sdpa +gc"  90 $D/dense.yaml model=llama-3.2-3b mix.method=full mix.gradient_checkpointing=true --batch-sizes 1,4,8
# MoE: sparse vs dense routing, expert backends (4 of Mixtral's 32 layers, full width)
for backend in grouped_mm eager; do
  for k in 2 8; do
    run "mixtral-4L top$k $backend" 90 $D/moe.yaml mix.experts_top_k=$k mix.experts_backend=$backend --batch-sizes 1,4,16 --shrink layers=4
  done
done
# max batch under a 40 GiB budget (CUDA: per-process memory fraction)
run "llama-3.2-1b full max-batch @40GiB" 120 $D/dense.yaml model=llama-3.2-1b mix.method=full --find-max-batch --memory-cap-gib 40

export_store
