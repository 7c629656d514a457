"""One training step of the IISWC study's path on CPU, under the study's 2024 stack (run in setup_venv.sh's venv).

What runs is LLaMA-Factory's own SFT workflow (`llmtuner.train.tuner.run_exp`, llmtuner 0.5.0 = the code the
study vendored) with the arguments of the study's `mixtral_tp.sh`: `--stage sft --finetuning_type lora
--lora_target w1,w2,w3,gate --lora_rank 16 --quantization_bit 4 --cutoff_len ... --flash_attn --bf16`, and the one
line the study's own `workflow.py` adds after loading the model: `model.config.output_router_logits = True`
(router aux loss on, coefficient 0.02 from the Mixtral config). Its collator (DataCollatorForSeq2Seq, padding to
the longest sample, multiple of 8), HF Trainer 4.40, PEFT 0.7.1 and bitsandbytes 0.42's Linear4bit /
MatMul4Bit autograd code all run as released.

Two things cannot run on a CPU and are replaced, each as narrowly as possible:
- bitsandbytes 0.42's CUDA kernels: `functional.dequantize_4bit` becomes a pure-torch NF4 dequantizer and the
  weights are NF4-quantized here (blocks of 64, no double quantization: it changes constant weight bytes only).
  The Linear4bit module, Params4bit and the MatMul4Bit autograd Function are bitsandbytes' own code.
- transformers' `load_in_4bit` path refuses to run without CUDA, so the model is loaded in bf16 and every
  nn.Linear except lm_head is swapped for bitsandbytes' Linear4bit, as transformers' replace_with_bnb_linear does.
FlashAttention-2 is not installed (llmtuner warns and uses the default sdpa attention): attention is inside the
checkpointed layer, so its kernel does not change what stays alive between forward and backward.
"""
from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path
from typing import Any

import torch

from tracking import LabelledTracker, ctx_held_storages

NF4_BLOCK = 64


# ---- bitsandbytes 0.42 on CPU ------------------------------------------------------------------------------

def _nf4_code() -> torch.Tensor:
    import bitsandbytes.functional as F

    return F.get_4bit_type("nf4", device="cpu")


def _quantize_nf4(w: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """NF4 blockwise quantization as bitsandbytes does it (absmax per block of 64, two codes per byte)."""
    import bitsandbytes.functional as F

    code = _nf4_code()
    flat = w.detach().float().reshape(-1, NF4_BLOCK)
    absmax = flat.abs().amax(dim=1).clamp_min(1e-12)
    midpoints = (code[1:] + code[:-1]) / 2  # the NF4 code is sorted: nearest code = bucket between midpoints
    idx = torch.bucketize(flat / absmax[:, None], midpoints).to(torch.uint8).reshape(-1)
    packed = (idx[0::2] << 4 | idx[1::2]).reshape(-1, 1)
    state = F.QuantState(absmax=absmax, shape=w.shape, code=code, blocksize=NF4_BLOCK, quant_type="nf4",
                         dtype=w.dtype)
    state.cpu_dequantized = _nf4_decode(packed, state)
    return packed, state


def _nf4_decode(packed: torch.Tensor, state: Any) -> torch.Tensor:
    flat = packed.reshape(-1)
    idx = torch.stack([flat >> 4, flat & 15], dim=1).reshape(-1).long()
    vals = state.code[idx].reshape(-1, state.blocksize) * state.absmax[:, None]
    return vals.reshape(state.shape).to(state.dtype)


def _dequantize_4bit(A: torch.Tensor, quant_state: Any = None, *args: Any, **kwargs: Any) -> torch.Tensor:
    """CPU stand-in for bitsandbytes.functional.dequantize_4bit (NF4, no nested absmax). The NF4 decode was done
    once at quantization time (decoding on every call made the CPU step minutes long); each call still allocates
    a fresh dequantized weight, as the CUDA kernel does."""
    out = quant_state.cpu_dequantized.clone()
    return out.t() if A.shape[0] == 1 else out  # bitsandbytes returns the transpose for a transposed input


def _gemv_4bit(A: torch.Tensor, B: torch.Tensor, out: Any = None, *args: Any, state: Any = None,
               **kwargs: Any) -> torch.Tensor:
    """CPU stand-in for bitsandbytes.functional.gemv_4bit: the inference path matmul_4bit takes for a single row
    that needs no grad (an expert that got one token, under no_grad). Saves nothing, like the kernel."""
    return torch.nn.functional.linear(A, state.cpu_dequantized.to(A.dtype))


def install_bnb_cpu_shim() -> None:
    import bitsandbytes.functional as F
    import transformers.modeling_utils as modeling_utils

    F.dequantize_4bit = _dequantize_4bit
    F.gemv_4bit = _gemv_4bit
    # the Trainer's FLOP counter counts 4-bit parameters, and asks first whether bitsandbytes can run (CUDA)
    modeling_utils.is_bitsandbytes_available = lambda: True


def swap_linears_for_4bit(model: torch.nn.Module, compute_dtype: torch.dtype) -> list[str]:
    """Every nn.Linear but lm_head becomes bitsandbytes' Linear4bit with NF4 weights (replace_with_bnb_linear)."""
    import bitsandbytes as bnb

    swapped = []
    for name, mod in list(model.named_modules()):
        if type(mod) is not torch.nn.Linear or name.split(".")[-1] == "lm_head":
            continue
        new = bnb.nn.Linear4bit(mod.in_features, mod.out_features, bias=mod.bias is not None,
                                compute_dtype=compute_dtype, compress_statistics=True, quant_type="nf4")
        packed, state = _quantize_nf4(mod.weight)
        new.weight = bnb.nn.Params4bit(packed, requires_grad=False, quant_state=state, blocksize=NF4_BLOCK,
                                       compress_statistics=True, quant_type="nf4")
        new.requires_grad_(False)
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
        setattr(parent, name.rsplit(".", 1)[-1], new)
        swapped.append(name)
    model.is_loaded_in_4bit = True  # what PEFT checks to wrap Linear4bit with its bnb LoRA layer
    return swapped


# ---- llmtuner without its web UI ---------------------------------------------------------------------------

def import_llmtuner() -> Any:
    """llmtuner's training modules without running llmtuner/__init__.py (which imports gradio for the web UI)."""
    if "llmtuner" not in sys.modules:
        import importlib.util

        spec = importlib.util.find_spec("llmtuner")
        pkg = types.ModuleType("llmtuner")
        pkg.__path__ = list(spec.submodule_search_locations)
        sys.modules["llmtuner"] = pkg
    import llmtuner.train.tuner as tuner

    return tuner


class _Loader:
    """Stands in for transformers.AutoModelForCausalLM inside llmtuner's loader: loads bf16, then quantizes."""

    quantize = True

    @classmethod
    def from_pretrained(cls, *args: Any, **kwargs: Any) -> Any:
        from transformers import AutoModelForCausalLM

        qcfg = kwargs.pop("quantization_config", None)
        kwargs.pop("device_map", None)
        model = AutoModelForCausalLM.from_pretrained(*args, **kwargs)
        if qcfg is not None and getattr(qcfg, "load_in_4bit", False):
            swap_linears_for_4bit(model, qcfg.bnb_4bit_compute_dtype)
            model.hf_quantizer = types.SimpleNamespace(quantization_config=qcfg, is_trainable=True)
        return model


# ---- the probe -----------------------------------------------------------------------------------------------

def make_probe(result: dict[str, Any]) -> Any:
    from transformers import TrainerCallback

    class Probe(TrainerCallback):
        """Tracks the first step: live bytes at the end of the forward (the loss exists, backward has not
        started), who holds them, and the peak up to the optimizer step."""

        def on_step_begin(self, args, state, control, model=None, optimizer=None, **kw):  # type: ignore[no-untyped-def]
            if state.global_step > 0:
                return
            self.tracker = LabelledTracker(model, optimizer)
            self.base = self.tracker.live_bytes
            self.handles = [
                model.register_forward_pre_hook(self._inputs, with_kwargs=True),
                model.register_forward_hook(self._forward_end),
            ]
            inner = getattr(optimizer, "optimizer", optimizer)
            self.handles.append(inner.register_step_pre_hook(self._before_optimizer))
            self.tracker.__enter__()

        def _inputs(self, module, args, kwargs):  # type: ignore[no-untyped-def]
            ids = kwargs.get("input_ids", args[0] if args else None)
            result["batch"], result["seq"] = int(ids.shape[0]), int(ids.shape[1])

        def _forward_end(self, module, args, out):  # type: ignore[no-untyped-def]
            loss = out["loss"] if isinstance(out, dict) or hasattr(out, "keys") else out[0]
            result["forward_end_bytes"] = self.tracker.live_bytes - self.base
            result["live"] = self.tracker.live_created()
            result["ctx_held"] = ctx_held_storages(loss)

        def _before_optimizer(self, opt, args, kwargs):  # type: ignore[no-untyped-def]
            if "backward_peak_bytes" not in result:
                result["backward_peak_bytes"] = self.tracker.peak_bytes - self.base

        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            if not hasattr(self, "tracker"):
                return
            self.tracker.__exit__(None, None, None)
            self.tracker.close()
            for h in self.handles:
                h.remove()
            del self.tracker

    return Probe()


def run_study_step(model_dir: Path, data_dir: Path, out_dir: Path, batch: int, cutoff_len: int,
                   quantize: bool = True, reentrant: bool = False, router_aux_loss: bool = True) -> dict[str, Any]:
    """One step of llmtuner's SFT workflow with the study's arguments; returns the probe's measurements.

    reentrant=True replaces llmtuner's `use_reentrant=False` by transformers 4.40's default (reentrant) and adds
    `enable_input_require_grads()`, which reentrant checkpointing needs (PEFT's prepare_model_for_kbit_training
    and llmtuner 0.4.0 do exactly this)."""
    tuner = import_llmtuner()
    import llmtuner.model.loader as loader
    import llmtuner.train.sft.workflow as workflow
    import transformers

    install_bnb_cpu_shim()
    loader.AutoModelForCausalLM = _Loader
    study_load = getattr(workflow, "_study_original_load", workflow.load_model_and_tokenizer)
    workflow._study_original_load = study_load

    def load_like_the_study(*args: Any, **kwargs: Any) -> Any:
        model, tokenizer = study_load(*args, **kwargs)
        model.config.output_router_logits = router_aux_loss  # the study's workflow.py, right after loading
        if reentrant:
            model.enable_input_require_grads()
        return model, tokenizer

    workflow.load_model_and_tokenizer = load_like_the_study
    gc_enable = transformers.PreTrainedModel.gradient_checkpointing_enable

    def gc_reentrant(self: Any, gradient_checkpointing_kwargs: Any = None) -> Any:
        return gc_enable(self, gradient_checkpointing_kwargs={"use_reentrant": True})

    if reentrant:
        transformers.PreTrainedModel.gradient_checkpointing_enable = gc_reentrant
    result: dict[str, Any] = {}
    args = {
        "stage": "sft", "do_train": True, "model_name_or_path": str(model_dir), "dataset": "probe",
        "dataset_dir": str(data_dir), "template": "mistral", "finetuning_type": "lora",
        "lora_target": "w1,w2,w3,gate", "flash_attn": True, "output_dir": str(out_dir),
        "overwrite_output_dir": True, "per_device_train_batch_size": batch, "per_device_eval_batch_size": 32,
        "gradient_accumulation_steps": 1, "lr_scheduler_type": "cosine", "logging_steps": 10, "save_steps": 600,
        "learning_rate": 5e-5, "max_steps": 1, "cutoff_len": cutoff_len, "lora_rank": 16, "bf16": True,
        "report_to": "none", "seed": 42, "overwrite_cache": True, "use_cpu": True,
        "save_strategy": "no", "disable_tqdm": True,
    }
    if quantize:
        args["quantization_bit"] = 4
    os.environ.setdefault("HF_DATASETS_CACHE", str(out_dir / "hf-datasets"))
    try:
        tuner.run_exp(args, callbacks=[make_probe(result)])
    finally:
        transformers.PreTrainedModel.gradient_checkpointing_enable = gc_enable
    return result


def versions() -> dict[str, str]:
    import importlib.metadata as md

    names = ["torch", "transformers", "tokenizers", "peft", "trl", "accelerate", "datasets", "bitsandbytes",
             "llmtuner"]
    return {n: md.version(n) for n in names}


if __name__ == "__main__":
    print(json.dumps(versions(), indent=1))
