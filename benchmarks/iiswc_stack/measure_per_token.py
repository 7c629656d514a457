"""Activation bytes per token of the IISWC study's training step, under its 2024 stack and under today's.

    bash benchmarks/iiswc_stack/setup_venv.sh            # once: the 2024 venv (/work/venvs/iiswc-stack)
    python benchmarks/iiswc_stack/measure_per_token.py   # ~10 min on 2 busy cores; writes the data file

Any Python runs this orchestrator; it starts one worker in the 2024 venv (llmtuner's SFT workflow, see
stack2024.py) and one in the worktree's .venv (ftscope's build of the same model, see today.py). Each run is one
training step on CPU of a shrunk real Mixtral config (all 8 experts) with the study's LoRA targets, tracked at
the aten dispatcher (ftscope's TensorTracker): the bytes alive at the end of the forward, grouped by what made
them and by who holds them. The result goes to data/iiswc-stack/per-token-bytes.json.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DEFAULT_OUT = REPO / "data" / "iiswc-stack" / "per-token-bytes.json"
BATCH = 2

# (variant, layers, hidden, top_k, seq). "study": the study's path as it ran. The others change one setting.
GRID_2024 = [
    ("study", 2, 256, 2, 128),
    ("study", 3, 256, 2, 128),
    ("study", 2, 128, 2, 128),
    ("study", 2, 256, 8, 128),
    ("study", 2, 256, 2, 256),
    ("study-reentrant", 2, 256, 2, 128),
    ("study-bf16-lora", 2, 256, 2, 128),
    ("study-no-aux-loss", 2, 256, 2, 128),
]
GRID_TODAY = [
    ("today", 2, 256, 2, 128),
    ("today", 2, 256, 8, 128),
    ("today-bf16-lora", 2, 256, 2, 128),
]
VARIANTS = {  # variant -> (quantize, reentrant, router_aux_loss)
    "study": (True, False, True),
    "study-reentrant": (True, True, True),
    "study-bf16-lora": (False, False, True),
    "study-no-aux-loss": (True, False, False),
    "today": (True, False, True),
    "today-bf16-lora": (False, False, True),
}


def classify(group: dict[str, Any], hidden: int, vocab: int) -> str:
    """Which term of the per-token bytes a group of live storages belongs to."""
    if group["holder"].startswith("MatMul4Bit"):
        return "bnb_ctx_inputs"
    if ".lora_" in group["module"] and group["op"].startswith("aten._to_copy"):
        return "autocast_adapter_copies"  # bf16 copies of the fp32 LoRA weights: parameter-sized, not per token
    if group["last_dim"] == vocab:
        return "loss_logits"
    if group["last_dim"] == hidden and group["dtype"] == "bfloat16" and (
            group["module"].endswith("embed_tokens") or group["module"] == "model.layers.*"):
        return "checkpoint_layer_inputs"
    return "other"


def summarize(raw: dict[str, Any], stack: str, variant: str, layers: int, hidden: int, top_k: int,
              cfg: dict[str, Any]) -> dict[str, Any]:
    from tracking import breakdown

    tokens = raw["batch"] * raw["seq"]
    groups = breakdown(raw["live"], raw["ctx_held"], tokens)
    terms: dict[str, float] = {}
    for g in groups:
        g["term"] = classify(g, hidden, cfg["vocab_size"])
        terms[g["term"]] = terms.get(g["term"], 0) + g["bytes"]
    ffn = cfg["intermediate_size"]
    return {
        "stack": stack, "variant": variant, "layers": layers, "hidden": hidden, "intermediate": ffn,
        "experts": cfg["num_local_experts"], "top_k": top_k, "vocab": cfg["vocab_size"],
        "batch": raw["batch"], "seq": raw["seq"], "tokens": tokens,
        "forward_end_bytes_per_token": round(raw["forward_end_bytes"] / tokens, 1),
        "backward_peak_bytes_per_token": round(raw["backward_peak_bytes"] / tokens, 1),
        "terms_bytes_per_token": {k: round(v / tokens, 1) for k, v in sorted(terms.items())},
        "groups": [{k: g[k] for k in ("term", "holder", "module", "op", "dtype", "last_dim", "storages", "layers",
                                      "bytes_per_token")} for g in groups if g["bytes"] >= tokens],
    }


def worker(stack: str, grid: list[tuple], out_path: Path, scratch: Path) -> None:
    sys.path.insert(0, str(HERE))
    import fixtures

    records = []
    if stack == "2024":
        import stack2024 as impl
    else:
        import today as impl
    for i, (variant, layers, hidden, top_k, seq) in enumerate(grid):
        quantize, reentrant, aux = VARIANTS[variant]
        cfg = fixtures.mixtral_config(layers, hidden, top_k)
        t0 = time.time()
        if stack == "2024":
            model_dir = scratch / f"model-L{layers}-h{hidden}-k{top_k}"
            if not model_dir.exists():
                fixtures.make_model_dir(model_dir, layers, hidden, top_k)
            data_dir = fixtures.make_dataset(scratch / "data", samples=BATCH * 2, words=seq * 2)
            raw = impl.run_study_step(model_dir, data_dir, scratch / f"out-{i}", BATCH, seq, quantize=quantize,
                                      reentrant=reentrant, router_aux_loss=aux)
        else:
            raw = impl.run_today_step(layers, hidden, top_k, BATCH, seq, quantize=quantize, router_aux_loss=aux)
        rec = summarize(raw, stack, variant, layers, hidden, top_k, cfg)
        rec["step_wall_s"] = round(time.time() - t0, 1)
        records.append(rec)
        print(f"[{stack}] {variant} L{layers} h{hidden} k{top_k} S{rec['seq']}: "
              f"{rec['forward_end_bytes_per_token']:.0f} B/token at the end of forward "
              f"{rec['terms_bytes_per_token']} ({rec['step_wall_s']} s)", file=sys.stderr, flush=True)
    out_path.write_text(json.dumps({"versions": impl.versions(), "runs": records}))


def run_worker(python: str, stack: str, scratch: Path) -> dict[str, Any]:
    out = scratch / f"{stack}.json"
    cmd = [python, str(Path(__file__).resolve()), "--worker", stack, "--worker-out", str(out),
           "--scratch", str(scratch)]
    env = {**os.environ, "HF_DATASETS_CACHE": str(scratch / "hf-datasets"), "TRANSFORMERS_VERBOSITY": "error",
           "DATASETS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    tail: list[str] = []
    for line in proc.stderr:
        if line.startswith(f"[{stack}]"):
            print(line, end="", flush=True)
        tail = (tail + [line])[-40:]
    if proc.wait() != 0:
        raise SystemExit(f"the {stack} worker failed:\n" + "".join(tail))
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=os.environ.get("IISWC_STACK_VENV", "/work/venvs/iiswc-stack"),
                    help="the 2024 venv made by setup_venv.sh")
    ap.add_argument("--today-python", default=str(REPO / ".venv" / "bin" / "python"))
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--worker", choices=["2024", "today"], help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, GRID_2024 if a.worker == "2024" else GRID_TODAY, a.worker_out, a.scratch)
        return
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="iiswc-stack-") as tmp:
        scratch = Path(tmp)
        old = run_worker(str(Path(a.venv) / "bin" / "python"), "2024", scratch)
        new = run_worker(a.today_python, "today", scratch)
    doc = {
        "what": "activation bytes per token alive at the end of the forward of one training step (CPU, dispatch-"
                "level tensor tracker), IISWC 2024 Mixtral QLoRA path, shrunk real config, by stack and setting",
        "generated_by": "benchmarks/iiswc_stack/measure_per_token.py",
        "versions": {"2024": old["versions"], "today": new["versions"]},
        "wall_s": round(time.time() - t0),
        "runs": old["runs"] + new["runs"],
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out} ({len(doc['runs'])} runs, {doc['wall_s']} s)")


if __name__ == "__main__":
    main()
