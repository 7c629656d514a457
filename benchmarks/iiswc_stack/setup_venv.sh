#!/usr/bin/env bash
# Builds the IISWC 2024 study's software stack in a venv of its own, outside the repository, for
# measure_per_token.py. Versions are the study's (README of github.com/stsxxx/finetune, commit 728a01b), except:
#   - torch: the local CPU wheel 2.13.0 (the study ran 2.1.0+cu118; older torch wheels on PyPI are multi-GB CUDA
#     builds). Only autograd / checkpoint semantics matter here, and measure_per_token.py checks them.
#   - Python: this machine's 3.11 (the study ran 3.8); numpy < 2 and pyarrow < 16 keep datasets 2.18 importable.
#   - flash-attn, deepspeed, mamba-ssm: not installed (CUDA-only; attention is checkpointed and recomputed, so its
#     kernel does not change what is held per token between forward and backward).
#   - accelerate 0.29.3, not 0.25.0: the study overwrote transformers 4.40's trainer.py with an older copy (from
#     the 4.36 line, plus timing prints) that still ran on accelerate 0.25; 4.40's own Trainer needs >= 0.26
#     (Accelerator(use_seedable_sampler=...)). 0.29.3 is the release of the same weeks as transformers 4.40.0.
#     Accelerate only wraps autocast and backward here.
#   - bitsandbytes 0.42.0 is installed for its Python autograd code (MatMul4Bit, Linear4bit, Params4bit); its
#     CUDA kernels cannot run here, so measure_per_token.py supplies CPU NF4 quantize/dequantize functions.
#   - LLaMA-Factory: the study vendored a development snapshot whose __init__ still says 0.4.0, but whose code is
#     that of the 0.5.0 release (use_unsloth, lora_bf16_mode, data/formatter.py, and the same
#     _prepare_model_for_training: gradient_checkpointing_enable(use_reentrant=False), no
#     enable_input_require_grads). PyPI's llmtuner 0.4.0 differs exactly there (reentrant checkpointing with
#     enable_input_require_grads), so 0.5.0 is installed. Without its dependencies (gradio, fastapi, ... serve
#     the web UI / API only); measure_per_token.py imports its training modules without the package __init__.
# Usage: bash benchmarks/iiswc_stack/setup_venv.sh [VENV_DIR]   (default: $IISWC_STACK_VENV or /work/venvs/iiswc-stack)
set -euo pipefail
VENV="${1:-${IISWC_STACK_VENV:-/work/venvs/iiswc-stack}}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip
# torch first, pinned: every later requirement ("torch>=1.13") is then satisfied by it and pulls no CUDA build.
"$PIP" install -q torch==2.13.0
"$PIP" install -q \
  "numpy<2" "pyarrow>=12,<16" \
  transformers==4.40.0 tokenizers==0.19.1 \
  peft==0.7.1 trl==0.8.6 accelerate==0.29.3 datasets==2.18.0 \
  bitsandbytes==0.42.0 \
  sentencepiece protobuf matplotlib rich "pydantic<3" pyyaml
"$PIP" install -q --no-deps llmtuner==0.5.0
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ["torch", "transformers", "tokenizers", "peft", "trl", "accelerate", "datasets", "bitsandbytes", "llmtuner"]:
    print(f"{name}=={md.version(name)}")
PY
