"""Framework recipes vs a fake-tensor trace of each framework's OWN training step, at full size.

For every framework that installs on CPU, one training step (forward, loss, backward, AdamW) runs under
FakeTensorMode through ftscope's storage recorder, with the model built, wrapped and prepared the framework's way:

  hf-trainer  transformers + PEFT get_peft_model, the model's own loss (ftscope's `trace`, the baseline)
  peft-kbit   the same after peft.prepare_model_for_kbit_training (the real function)
  trl-sft     TRL 1.16's add_fused_lm_head (its chunked log-prob autograd Function, torch tile path), the QLoRA
              adapter cast to bf16 and enable_input_require_grads from SFTTrainer.__init__, the loss of
              SFTTrainer.compute_loss (-log_probs.sum() / tokens)
  torchtune   torchtune 0.6.1's own model builders (lora_/qlora_ llama3.1 8B, llama2 7B / llama3.2 1B), torchao NF4,
              set_activation_checkpointing (non-reentrant checkpoint_wrapper), set_num_output_chunks(8) and
              CEWithChunkedOutputLoss, pure bf16, the recipe's _loss_step

and the estimate of the same scenario with `framework: <name>` is compared on allocated bytes (peak).

Run in a side venv that has the frameworks (see README "Framework recipes"):
  /work/venvs/recipes-fw/bin/python benchmarks/recipes_vs_trace.py [--only SUBSTR] [--out benchmarks/results/recipes_vs_trace.json]
"""
from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import platform
import sys
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import ftscope  # noqa: E402

GIB = 2**30
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "recipes_vs_trace.json"
HF_MODELS = (("llama-3.1-8b", "dense 8B"), ("phi-2", "small vocab 2.7B"), ("qwen1.5-moe-a2.7b", "MoE 14B"))
TT_MODELS = (("llama-3.1-8b", "dense 8B", "llama3_1", "8b"), ("llama-2-7b", "small vocab 7B", "llama2", "7b"),
             ("llama-3.2-1b", "1B", "llama3_2", "1b"))
BATCH, SEQ = 2, 1024


def scenario(model: str, framework: str, method: str, **mix) -> ftscope.Scenario:
    return ftscope.load_scenario({"model": model, "framework": framework, "hardware": {"gpu": "h100-80gb"},
                                  "mix": {"method": method, "lora_rank": 16, **mix},
                                  "workload": {"micro_batch_size": BATCH, "seq_len": SEQ}})


# ---- one traced step of an already built model -----------------------------------------------------------

def trace_step(scn, model, run_loss, autocast_dtype=None, routing_experts=0, prefake=None):
    """Fake every weight (unless `prefake` already holds them), run `run_loss()` forward, backward and a foreach
    AdamW step under the recorder; the peak allocated bytes and the bytes alive when forward ends."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.flop_counter import FlopCounterMode
    from ftscope.measure import trace as tr
    from ftscope.measure.trace_flops import flop_formulas
    from ftscope.measure.trace_layers import GlobalOnly, LayerContext, make_tagger
    from ftscope.measure.trace_recorder import BalancedRouting, make_recorder

    fake_mode, weights = prefake if prefake else (FakeTensorMode(allow_non_fake_inputs=True), None)
    if weights is None:
        weights = tr._fake_weights(model, fake_mode)
    trainable = [p for p in model.parameters() if p.requires_grad]
    counter = FlopCounterMode(display=False, custom_mapping=flop_formulas())
    counter.mod_tracker = GlobalOnly()
    layers = LayerContext(model)
    routing = BalancedRouting(routing_experts, layers) if routing_experts else None
    rec = make_recorder(counter, routing, layers)
    auto = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else nullcontext()
    with fake_mode:
        opt = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0, foreach=True)
        with counter, layers, rec:
            rec.register_weights(weights)
            rec.set_phase("forward")
            with tr._unpacked_batch(), make_tagger(layers), auto:
                loss = run_loss()
            t_fwd = rec.t
            rec.set_phase("backward")
            with tr._unpacked_batch(), make_tagger(layers):
                loss.backward()
            del loss
            for p in trainable:
                if p.grad is not None and rec.rec_of(p.grad) is not None:
                    rec.rec_of(p.grad).kind = "grad"
            rec.set_phase("optimizer")
            opt.step()
            for t in tr._state_tensors(opt):
                if rec.rec_of(t) is not None:
                    rec.rec_of(t).kind = "opt"
    phases = {p: rec.peaks.get(p, (0, 0))[0] for p in tr.PHASES}
    states = sum(r.nbytes for r in rec.recs if r.kind == "opt")
    for p in ("forward", "backward"):
        phases[p] += states  # steady state: optimizer states exist through forward and backward
    peak_phase = max(phases, key=phases.get)
    cats = tr._breakdown(rec.recs, rec.peaks[peak_phase][1])
    if peak_phase != "optimizer":
        cats["optimizer"] += states
    return {"peak": phases[peak_phase], "phase": peak_phase, "phases": phases, "t_fwd": t_fwd,
            "categories": {k: round(v / GIB, 3) for k, v in cats.items()}}


# ---- frameworks --------------------------------------------------------------------------------------------

def hf_build(scn, prepare_kbit: bool = False):
    """ftscope's build (transformers + PEFT, bitsandbytes NF4 swap) with peft.prepare_model_for_kbit_training
    run on the quantized model just before get_peft_model, as PEFT's QLoRA recipe does."""
    import peft
    from ftscope.measure.build import build_model

    if not prepare_kbit:
        return build_model(scn, device="meta")
    original = peft.get_peft_model

    def prepared(model, config, **kw):
        model.is_loaded_in_4bit = True  # what from_pretrained(quantization_config=...) sets
        model = peft.prepare_model_for_kbit_training(model, use_gradient_checkpointing=scn.mix.gradient_checkpointing)
        return original(model, config, **kw)

    peft.get_peft_model = prepared
    try:
        return build_model(scn, device="meta")
    finally:
        peft.get_peft_model = original


def run_hf(scn, prepare_kbit: bool = False):
    import torch

    model, info = hf_build(scn, prepare_kbit)
    ids = {}

    def loss():
        ids["x"] = torch.randint(0, model.config.vocab_size, (BATCH, SEQ))
        return model(input_ids=ids["x"], labels=ids["x"], use_cache=False).loss

    experts = _experts(info) if info.experts_implementation == "eager" else 0
    return trace_step(scn, model, loss, getattr(torch, info.autocast_dtype) if info.autocast_dtype else None, experts)


def run_trl(scn):
    """TRL 1.16 SFTTrainer's model preparation and compute_loss on ftscope's build of the same model."""
    import torch
    from peft import PeftModel
    from trl.trainer.utils import add_fused_lm_head

    _triton_tiles()
    model, info = hf_build(scn)
    add_fused_lm_head(model.get_base_model() if isinstance(model, PeftModel) else model,
                      outputs=("log_probs", "entropy", "is_top1"))          # sft_trainer.py 1142-1147
    if scn.mix.gradient_checkpointing:
        model.enable_input_require_grads()                                 # sft_trainer.py 899-900
    if scn.mix.method == "qlora":
        for p in model.parameters():                                       # sft_trainer.py 904-911
            if p.requires_grad:
                p.data = p.data.to(torch.bfloat16)

    def loss():
        x = torch.randint(0, model.config.vocab_size, (BATCH, SEQ))
        out = model(input_ids=x, labels=x, use_cache=False, fused_lm_head=True)  # compute_loss 1595-1600
        return -out.log_probs.sum() / out.label_mask.sum().clamp(min=1)

    return trace_step(scn, model, loss, torch.bfloat16)


def _triton_tiles() -> None:
    """Run TRL's fused head with the memory of its CUDA path: there Triton kernels fold each logits tile in place
    (chunked_logprob.py _forward_kernel / _backward_kernel), while the torch fallback that CPU takes allocates
    several fp32 copies of every token x 32768 tile. The stand-ins write the same outputs in place."""
    from trl.kernels import chunked_logprob as cl

    def forward_tile(tile, tile_stride, targets, running_max, *rest, **kw):
        running_max.copy_(running_max)  # the kernel updates its per-token running statistics in place

    def backward_tile(tile, *rest, **kw):
        tile.copy_(tile)  # the kernel overwrites the tile with the logits' gradient

    cl._forward_tile, cl._backward_tile = forward_tile, backward_tile


def _tt_import():
    """torchtune 0.6.1 imports torchao.dtypes.nf4tensor, which torchao 0.18 moved; alias the module."""
    try:
        importlib.import_module("torchao.dtypes.nf4tensor")
    except ImportError:
        nf4 = importlib.import_module("torchao.quantization.quantize_.workflows.nf4.nf4_tensor")
        sys.modules["torchao.dtypes.nf4tensor"] = nf4
    return importlib.import_module("torchtune")


def run_torchtune(scn, family: str, size: str):
    """lora_finetune_single_device's _setup_model and _loss_step, model built under FakeTensorMode."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    _tt_import()
    from torchtune import modules, training
    from torchtune.modules.loss import CEWithChunkedOutputLoss
    from torchtune.modules.peft import get_adapter_params, set_trainable_params

    builders = importlib.import_module(f"torchtune.models.{family}")
    prefix = "qlora" if scn.mix.method == "qlora" else "lora"
    build = getattr(builders, f"{prefix}_{family}_{size}")
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with fake_mode, training.set_default_dtype(torch.bfloat16), torch.device("cpu"):
        model = build(lora_attn_modules=["q_proj", "k_proj", "v_proj", "output_proj"], apply_lora_to_mlp=True,
                      apply_lora_to_output=False, lora_rank=scn.mix.lora_rank, lora_alpha=2 * scn.mix.lora_rank,
                      lora_dropout=0.0)
    set_trainable_params(model, get_adapter_params(model))
    if scn.mix.gradient_checkpointing:
        training.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
    loss_fn = CEWithChunkedOutputLoss()
    model.set_num_output_chunks(loss_fn.num_output_chunks)
    weights = _tt_weights(model)

    def loss():
        x = torch.randint(0, 32000, (BATCH, SEQ))
        logits = model(x)
        labels = torch.hstack((x[..., 1:], torch.full((BATCH, 1), -100, dtype=torch.long)))
        out = loss_fn(logits, labels)
        del logits
        return out

    return trace_step(scn, model, loss, None, prefake=(fake_mode, weights))


def _tt_weights(model):
    """Every tensor holding weight memory: plain parameters and buffers, and the inner tensors of NF4 weights."""
    out, seen = [], set()
    for t in list(model.parameters()) + list(model.buffers()):
        inner = [t]
        if hasattr(t, "__tensor_flatten__"):
            names, _ = t.__tensor_flatten__()
            inner = [getattr(t, n) for n in names]
        for x in inner:
            if id(x) not in seen:
                seen.add(id(x))
                out.append(x)
    return out


def _experts(info) -> int:
    return int(next(v for k, v in info.config.items()
                    if k in ("num_local_experts", "num_experts", "n_routed_experts") and v))


# ---- the grid ---------------------------------------------------------------------------------------------

def cases():
    for model, kind in HF_MODELS:
        for method in ("lora", "qlora"):
            yield ("hf-trainer", model, kind, method, lambda s: run_hf(s))
            if method == "qlora":
                yield ("peft-kbit", model, kind, method, lambda s: run_hf(s, prepare_kbit=True))
            yield ("trl-sft", model, kind, method, run_trl)
    if importlib.util.find_spec("torchtune") is None:
        return
    for model, kind, family, size in TT_MODELS:
        for method in ("lora", "qlora"):
            yield ("torchtune", model, kind, method,
                   lambda s, f=family, z=size: run_torchtune(s, f, z))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args()
    rows = []
    for framework, model, kind, method, run in cases():
        label = f"{framework} {model} {method}"
        if args.only and args.only not in label:
            continue
        mix = {"gradient_checkpointing": True, "experts_backend": "grouped_mm"}
        scn = scenario(model, framework, method, **mix)
        t0 = time.perf_counter()
        try:
            tr = run(scn)
        except Exception as exc:  # noqa: BLE001 - a framework that cannot trace is reported, not hidden
            print(f"{label:55s} TRACE FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:150]}", flush=True)
            rows.append({"framework": framework, "model": model, "kind": kind, "method": method, "error": str(exc)[:300]})
            continue
        est = ftscope.estimate(scn, strict=False, with_time=False)
        err = 100.0 * (est.memory.allocated_bytes - tr["peak"]) / tr["peak"]
        row = {"framework": framework, "model": model, "kind": kind, "method": method, "batch": BATCH, "seq": SEQ,
               "trace_peak_gib": round(tr["peak"] / GIB, 3), "trace_phase": tr["phase"],
               "estimate_gib": round(est.memory.allocated_bytes / GIB, 3), "estimate_phase": est.memory.phase,
               "error_pct": round(err, 2), "trace_s": round(time.perf_counter() - t0, 1),
               "trace_gib": tr["categories"],
               "estimate_breakdown_gib": {k: round(v / GIB, 3) for k, v in est.memory.categories.items()}}
        rows.append(row)
        print(f"{label:55s} trace {row['trace_peak_gib']:7.2f} ({row['trace_phase'][:3]})  estimate "
              f"{row['estimate_gib']:7.2f} ({row['estimate_phase'][:3]})  {err:+6.2f} %  {row['trace_s']:5.1f} s", flush=True)
        if args.only:
            print("   trace   ", row["trace_gib"], "\n   estimate", row["estimate_breakdown_gib"])
        gc.collect()
    ok = [r for r in rows if "error_pct" in r]
    versions = {}
    for mod in ("torch", "transformers", "peft", "bitsandbytes", "trl", "torchtune", "torchao"):
        try:
            versions[mod] = importlib.import_module(mod).__version__
        except Exception:  # noqa: BLE001
            versions[mod] = None
    summary = {"n": len(ok), "within_5pct": sum(abs(r["error_pct"]) <= 5 for r in ok),
               "max_abs_error_pct": max((abs(r["error_pct"]) for r in ok), default=None),
               "failed": len(rows) - len(ok)}
    doc = {"what": "estimate (allocated, framework recipe) vs fake-tensor trace of the framework's own step",
           "batch": BATCH, "seq": SEQ, "versions": versions, "python": platform.python_version(),
           "summary": summary, "rows": rows}
    if not args.only:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
