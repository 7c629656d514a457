#!/usr/bin/env bash
# GEMM efficiency by shape and attention kernel throughput on one GPU, in one call under 8 minutes.
# Results: $OUT/data/gemm_attention.json (commit it under data/measurements/ with the GPU's name).
#
#   device run:  OUT=/tmp/ga bash benchmarks/gpu/gemm_attention.sh
#   dry run:     DRY_RUN=1 OUT=/tmp/ga bash benchmarks/gpu/gemm_attention.sh   (tiny shapes on CPU: checks the flow)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/ftscope-gemm-attention}"
mkdir -p "$OUT/data"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"
BUDGET="${BUDGET_S:-420}"   # stop starting measurements after this many seconds (the call limit is 8 min)
ARGS=(--out "$OUT" --budget-s "$BUDGET")
if [ "${DRY_RUN:-0}" = 1 ]; then ARGS+=(--dry-run); fi
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee "$OUT/gemm_attention.log"
timeout $((BUDGET + 60)) "$PY" benchmarks/gpu/gemm_attention.py "${ARGS[@]}" 2>&1 | tee -a "$OUT/gemm_attention.log"
exit "${PIPESTATUS[0]}"
