"""Framework recipes vs a fake-tensor trace of each framework's OWN training step, at full size.

For every framework that installs on CPU, one training step (forward, loss, backward, AdamW) runs under
FakeTensorMode through ftscope's storage recorder, with the model built, wrapped and prepared the framework's way:

  hf-trainer  transformers + PEFT get_peft_model, the model's own loss (ftscope's `trace`, the baseline)
  peft-kbit   the same after peft.prepare_model_for_kbit_training (the real function)
  trl-sft     TRL 1.16's add_fused_lm_head (its chunked log-prob autograd Function, torch tile path), the QLoRA
              adapter cast to bf16 and enable_input_require_grads from SFTTrainer.__init__, the loss of
              SFTTrainer.compute_loss (-log_probs.sum() / tokens)
  litgpt      litgpt 0.5.13's own GPT with LoRA, bf16-true, the LM head in 128-token chunks and chunked_cross_entropy
  torchtune   torchtune 0.6.1's own model builders (lora_/qlora_ llama3.1 8B, llama2 7B / llama3.2 1B), torchao NF4,
              set_activation_checkpointing (non-reentrant checkpoint_wrapper), set_num_output_chunks(8) and
              CEWithChunkedOutputLoss, pure bf16, the recipe's _loss_step

and the estimate of the same scenario with `framework: <name>` is compared on allocated bytes (peak).

Run in a side venv that has the frameworks (see README "Framework recipes"):
  /work/venvs/recipes-fw/bin/python benchmarks/recipes_vs_trace.py [--only SUBSTR] [--out benchmarks/results/recipes_vs_trace.json]
  /work/venvs/recipes-tt/bin/python benchmarks/recipes_vs_trace.py --only torchtune
Each run merges its rows into the results file (same framework x model x method replaced).
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
    from ftscope.measure.trace import tracer as tr
    from ftscope.measure.trace.fake_weights import fake_weights
    from ftscope.measure.trace.flops import flop_formulas
    from ftscope.measure.trace.kernels import unpacked_batch
    from ftscope.measure.trace.layers import GlobalOnly, LayerContext, make_tagger
    from ftscope.measure.trace.recorder import BalancedRouting, Recorder

    fake_mode, weights = prefake if prefake else (FakeTensorMode(allow_non_fake_inputs=True), None)
    if weights is None:
        weights = fake_weights(model, fake_mode)
    trainable = [p for p in model.parameters() if p.requires_grad]
    counter = FlopCounterMode(display=False, custom_mapping=flop_formulas())
    counter.mod_tracker = GlobalOnly()
    layers = LayerContext(model)
    routing = BalancedRouting(routing_experts, layers) if routing_experts else None
    rec = Recorder(counter, routing, layers)
    auto = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else nullcontext()
    with fake_mode:
        opt = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0, foreach=True)
        with counter, layers, rec:
            rec.register_weights(weights)
            rec.set_phase("forward")
            with unpacked_batch(), make_tagger(layers), auto:
                loss = run_loss()
            t_fwd = rec.t
            rec.set_phase("backward")
            with unpacked_batch(), make_tagger(layers):
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
    from ftscope.measure.runtime.build import build_model

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
    (chunked_logprob.py _forward_kernel / _backward_kernel), and the backward accumulates the hidden-state gradient
    with torch.addmm(..., out_dtype=float32, out=acc) (_addmm_fp32, CUDA with torch >= 2.8), while the torch fallback
    that CPU takes allocates several fp32 copies of every token x 32768 tile and an fp32 copy of the LM head's
    32768-row slice (`acc.addmm_(a.float(), b.float())`). The stand-ins write the same outputs in place."""
    from trl.kernels import chunked_logprob as cl

    def forward_tile(tile, tile_stride, targets, running_max, *rest, **kw):
        running_max.copy_(running_max)  # the kernel updates its per-token running statistics in place

    def backward_tile(tile, *rest, **kw):
        tile.copy_(tile)  # the kernel overwrites the tile with the logits' gradient

    def addmm_fp32(acc, a, b):
        acc.copy_(acc)  # CUDA: the fp32 product of the bf16 tile and weight slice accumulates into acc itself

    cl._forward_tile, cl._backward_tile, cl._addmm_fp32 = forward_tile, backward_tile, addmm_fp32


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
    _real_rope_init()
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


def _real_rope_init() -> None:
    """torchtune computes its RoPE tables with Python control flow on tensor values (Llama3ScaledRoPE.apply_scaling:
    `if wavelen < high_freq_wavelen`), which fake tensors cannot answer (aten._local_scalar_dense). The tables are
    small (max_seq_len x head_dim floats): compute them with real tensors, as a run does, and let the fake step
    read them as inputs."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE
    from torchtune.modules import RotaryPositionalEmbeddings

    for cls in (Llama3ScaledRoPE, RotaryPositionalEmbeddings):
        init = cls.rope_init
        if getattr(init, "_real", False):
            continue

        def rope_init(self, _init=init):
            with unset_fake_temporarily():
                return _init(self)

        rope_init._real = True
        cls.rope_init = rope_init


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


LITGPT_NAMES = {"llama-3.1-8b": "Llama-3.1-8B", "phi-2": "phi-2", "llama-2-7b": "Llama-2-7b-hf"}


def run_litgpt(scn):
    """litgpt finetune lora (0.5.13): its own GPT with LoRA on q, k, v, projection and MLP, bf16-true (every
    weight, adapter and AdamW state in bf16), no activation checkpointing on one device, the LM head in 128-token
    chunks and chunked_cross_entropy on them (finetune/lora.py fit(): model(input_ids, lm_head_chunk_size=128))."""
    import torch
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
    from litgpt.utils import chunked_cross_entropy

    cfg = Config.from_name(LITGPT_NAMES[scn.model_ref], lora_r=scn.mix.lora_rank, lora_alpha=2 * scn.mix.lora_rank,
                           lora_dropout=scn.mix.lora_dropout, lora_query=True, lora_key=True, lora_value=True,
                           lora_projection=True, lora_mlp=True, lora_head=False)
    with torch.device("meta"):
        model = GPT(cfg).to(torch.bfloat16)
    mark_only_lora_as_trainable(model)
    model.max_seq_length = SEQ

    def loss():
        x = torch.randint(0, cfg.padded_vocab_size, (BATCH, SEQ))
        logits = model(x, lm_head_chunk_size=128)
        logits[-1] = logits[-1][..., :-1, :]
        return chunked_cross_entropy(logits, x[..., 1:])

    return trace_step(scn, model, loss)


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
    if importlib.util.find_spec("litgpt") is not None:
        for model in LITGPT_NAMES:
            yield ("litgpt", model, "litgpt's own model", "lora", run_litgpt)
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
        # k-bit preparation casts transformers 5's fused expert stacks to fp32, which grouped_mm refuses (bf16
        # only): a peft-kbit MoE run takes the eager expert loop
        backend = "eager" if framework == "peft-kbit" and kind.startswith("MoE") else "grouped_mm"
        mix = {"gradient_checkpointing": True, "experts_backend": backend}
        if framework == "litgpt":  # its defaults: no checkpointing on one device, lora_dropout 0.05
            mix = {"gradient_checkpointing": False}
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
    versions = {}
    for mod in ("torch", "transformers", "peft", "bitsandbytes", "trl", "torchtune", "torchao"):
        try:
            versions[mod] = importlib.import_module(mod).__version__
        except Exception:  # noqa: BLE001
            versions[mod] = None
    doc = merge_results(Path(args.out), rows, versions)
    print(json.dumps(doc["summary"]))


def merge_results(out: Path, rows: list[dict], versions: dict) -> dict:
    """Write the rows into the results file, replacing the same framework x model x method and keeping the others:
    the frameworks need venvs of their own (torchtune's torchao pins against transformers 5), so each venv's run
    adds its rows, each with the library versions it ran."""
    old = json.loads(out.read_text()) if out.exists() else {}
    key = lambda r: (r["framework"], r["model"], r["method"])  # noqa: E731
    merged = {key(r): r for r in old.get("rows", [])}
    for r in rows:
        merged[key(r)] = {**r, "versions": {k: v for k, v in versions.items() if v}}
    all_rows = list(merged.values())
    ok = [r for r in all_rows if "error_pct" in r]
    summary = {"n": len(ok), "within_5pct": sum(abs(r["error_pct"]) <= 5 for r in ok),
               "max_abs_error_pct": max((abs(r["error_pct"]) for r in ok), default=None),
               "failed": len(all_rows) - len(ok)}
    doc = {"what": "estimate (allocated, framework recipe) vs fake-tensor trace of the framework's own step",
           "batch": BATCH, "seq": SEQ, "versions": {**old.get("versions", {}), **{k: v for k, v in versions.items() if v}},
           "python": platform.python_version(), "summary": summary, "rows": all_rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


if __name__ == "__main__":
    main()
