#!/usr/bin/env bash
# Step times without the layer timer's synchronizing hooks (see measure/runtime/profile.py), sized for ~3 min on one H200.
# The first characterization timed hooked steps; this re-measures the time points ftscope calibrates on:
# dense Llama 1B / 3B / 8B (LoRA, full, checkpointing, eager attention) and the 4-layer Mixtral (top-2 / top-8,
# grouped_mm / eager experts), 2 warm-up + 5 timed steps each, plus 2 hooked steps for layer times.
#
#   device run:  BUDGET_S=150 bash benchmarks/gpu/timing.sh      (writes $OUT/gpu-timing.sqlite + .json + .log)
#   dry run:     DRY_RUN=1 OUT=/tmp/timing bash benchmarks/gpu/timing.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
STORE=gpu-timing
source benchmarks/gpu/lib.sh
D=benchmarks/gpu/scenarios
T="--steps 5 --warmup 2"
run "llama-3.2-1b lora sdpa"      60 $D/dense.yaml model=llama-3.2-1b --batch-sizes 1,4,16 $T
run "llama-3.1-8b lora sdpa"      60 $D/dense.yaml model=llama-3.1-8b --batch-sizes 1,4,8 $T
run "mixtral-4L top2 grouped_mm"  60 $D/moe.yaml mix.experts_top_k=2 --batch-sizes 1,4,16 --shrink layers=4 $T
run "llama-3.2-1b full sdpa"      60 $D/dense.yaml model=llama-3.2-1b mix.method=full --batch-sizes 1,4,16 $T
run "mixtral-4L top8 grouped_mm"  60 $D/moe.yaml mix.experts_top_k=8 --batch-sizes 1,4,16 --shrink layers=4 $T
run "llama-3.2-3b lora sdpa +gc"  60 $D/dense.yaml model=llama-3.2-3b mix.gradient_checkpointing=true --batch-sizes 1,4,16 $T
run "llama-3.1-8b lora eager"     60 $D/dense.yaml model=llama-3.1-8b mix.attention=eager --batch-sizes 1,4 $T
run "mixtral-4L top2 eager"       60 $D/moe.yaml mix.experts_top_k=2 mix.experts_backend=eager --batch-sizes 1,4,16 --shrink layers=4 $T
run "llama-3.2-3b lora sdpa"      60 $D/dense.yaml model=llama-3.2-3b --batch-sizes 1,4,16 $T
export_store
