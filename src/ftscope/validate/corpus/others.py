"""Sources with headline settings only: LLaMA-Factory's wiki, the HF 4-bit blog's T4 table, PEFT's docs,
ms-swift's Megatron table, the HF FSDP 70B blog, single points (GaLore, accelerate)."""
from __future__ import annotations

from typing import Any, Mapping

from .common import Mapped, Measure, gpu_key, listed, lora_targets, memory_kind, number, peak
from .models import preset


def _no_model(raw: Mapping[str, Any]) -> str:
    return f"no architecture for {raw['model']} (no preset, none in the source)"


# ---- LLaMA-Factory wiki -----------------------------------------------------------------------------------------

def llamafactory(raw: Mapping[str, Any], src: Mapping[str, Any]) -> Mapped:
    r = raw["result"]
    system = str(raw["system"])
    framework = "unsloth" if "unsloth" in system else "llamafactory"
    measures = (Measure("tokens_per_s_per_gpu", float(r["tokens_per_s_per_gpu"]), "TGS"),
                Measure(f"peak_gib:{memory_kind(r.get('mem_kind'))}", float(r["gram_gb"]), "GRAM, GB rounded"))
    if framework == "unsloth":
        return listed(raw, src["id"], framework, "needs Unsloth's hand-written Triton kernels", *measures)
    # ftscope's bundled cases compare the HF row with lengths at the cutoff; the 16-bit and 4-bit rows' equal
    # speed (2392 vs 2415 tokens/s) says the steps were far from full 1024-token batches
    return listed(raw, src["id"], framework, "dataset not stated: with dynamic padding to the batch's longest "
                  "sample (cutoff 1024) the padded lengths, hence the work per step and the peak, are unknown",
                  *measures)


# ---- HF blog: 4-bit on a T4 -------------------------------------------------------------------------------------

def hf_4bit(raw: Mapping[str, Any], src: Mapping[str, Any]) -> Mapped:
    oom = Measure("oom", 1.0 if raw["result"]["oom"] else 0.0, "fit / OOM on a 16 GB T4")
    if raw["method"] == "lora-on-int8":
        return listed(raw, src["id"], "hf-trainer", "needs 8-bit (LLM.int8) frozen weights", oom)
    if raw.get("n_gpus", 1) > 1:
        return listed(raw, src["id"], "hf-trainer", "needs naive model parallelism (device_map over 2 GPUs)", oom)
    model, mnote = preset(raw["model"])
    quant = str(raw["quant"])
    mix = {"method": "qlora", "lora_rank": 8, "lora_targets": ["q_proj", "v_proj"],
           "gradient_checkpointing": bool(raw["act_ckpt"]), "attention": "eager", "precision": "fp16-mixed",
           "optimizer": "adamw", "nested_quant": "nested" in quant}
    scenario = {"model": model, "framework": "trl-sft-0.4", "hardware": {"gpu": "t4"}, "mix": mix,
                "workload": {"micro_batch_size": int(raw["mbs"]), "seq_len": int(raw["seq_len"]),
                             "padding": "max_length", "gradient_accumulation": int(raw["ga"])}}
    notes = (mnote, "LoRA not stated (a gist): PEFT's Llama default, r8 on q_proj and v_proj",
             f"compute dtype {raw['compute_dtype']} on a T4 (no bf16 units) holds the same bytes as fp16",
             "2023-05 transformers: eager attention", _quant_note(quant)) + UNEXPLAINED.get(raw["id"], ())
    return Mapped(raw["id"], src["id"], "hf-trainer", scenario, (oom,), notes=notes)


UNEXPLAINED = {"hfblog-bnb4-llama-13b-4bit-nf4-gc1-fp16-s1024-g1": (
    "OOM on the T4 unexplained: one step of the real transformers 4.30.2 Llama with bitsandbytes 0.39 / PEFT "
    "2023-05 stand-ins, traced on fake tensors (benchmarks/hf2023_qlora_step_trace.py), peaks at 9.69 GiB "
    "allocated, 10.35 GiB reserved through the caching-allocator model (9.91 / 10.60 with the gist's later r64 "
    "and dropout 0.1), 4 GiB under the card",)}
"""Rows whose outcome the estimate and the traced step of that stack both miss, with what was checked."""


def _quant_note(quant: str) -> str:
    if "nested" in quant:
        return f"{quant}: nested (double) quantization, 0.516 B per 4-bit weight (mix.nested_quant)"
    # bitsandbytes keeps one fp32 absmax per 64 weights unless the absmax are quantized again (nested); fp4 packs
    # and scales as nf4 does
    return (f"{quant} without nested quantization: 0.5625 B per 4-bit weight, an fp32 absmax per 64 "
            "(mix.nested_quant false)")


# ---- PEFT docs ----------------------------------------------------------------------------------------------------

PEFT_SFT_DROPOUT = 0.1
"""lora_dropout of every run_peft_*.sh script behind the docs (aa2ca83c, 6008f272)."""


def _peft_memory(raw: Mapping[str, Any]) -> tuple[Measure, ...]:
    r = raw["result"]
    if r.get("oom"):
        return (Measure("oom", 1.0, "the source reports OOM"),)
    value = r.get("mem_per_gpu_gb", r.get("gpu_mem_gb"))
    m = peak(value, memory_kind(r.get("mem_kind")), f"{value} GB as {memory_kind(r.get('mem_kind'))}")
    return (m,) if m else ()


def peft(raw: Mapping[str, Any], src: Mapping[str, Any]) -> Mapped:
    measures = _peft_memory(raw)
    model, _ = preset(raw["model"])
    if model is None:
        return listed(raw, src["id"], "hf-trainer", _no_model(raw) + "; sequence lengths not stated", *measures)
    if raw["method"] == "qlora" and raw.get("offload"):
        return listed(raw, src["id"], "hf-trainer", "needs QLoRA with FSDP CPU parameter offload (ftscope refuses "
                      "the combination)", *measures)
    gpu, gnote = gpu_key(raw["gpu"])
    n = int(raw["n_gpus"])
    sharding = str(raw["sharding"])
    # the scripts pass --bf16 True (the Trainer's autocast) and --lora_dropout 0.1 (run_peft_*.sh)
    mix: dict[str, Any] = {"method": raw["method"], "lora_rank": int(raw["lora"]["r"]),
                           "lora_targets": lora_targets(raw["lora"]["targets"]), "gradient_checkpointing": True,
                           "attention": "flash", "precision": "bf16-mixed",
                           "lora_dropout": float(raw["lora"].get("dropout", PEFT_SFT_DROPOUT))}
    if raw["method"] == "qlora" and "double quant" in str(raw.get("quant", "")):
        mix["nested_quant"] = True  # the docs' --use_nested_quant True (the recipe's default too)
    if "zero3" in sharding:
        mix["zero_stage"] = 3
    else:
        mix["fsdp"] = "full_shard"
    scenario = {"model": model, "framework": "peft-sft-2024", "hardware": {"gpu": gpu, "gpus_per_node": n}, "mix": mix,
                "workload": {"micro_batch_size": int(raw["mbs"]), "gradient_accumulation": int(raw["ga"]),
                             "seq_len": int(raw["seq_len"]), "padding": "packed"}}
    notes = tuple(x for x in (gnote, "PEFT's examples/sft/train.py of the docs' date: LoRA base loaded in fp32 (no "
                              "torch_dtype), QLoRA's non-4-bit weights in bf16 (quant storage)") if x)
    return Mapped(raw["id"], src["id"], "peft-sft-2024", scenario, measures, notes=notes)


# ---- headline-only sources ----------------------------------------------------------------------------------------

def ms_swift(raw: Mapping[str, Any], src: Mapping[str, Any]) -> Mapped:
    r = raw["result"]
    framework = "megatron-swift" if "megatron" in str(raw.get("framework")) else "ms-swift"
    kept = [Measure("oom", 1.0, "the source reports OOM")] if r.get("oom") else []
    if r.get("s_per_it"):
        kept.append(Measure("step_s", float(r["s_per_it"]), "seconds per iteration"))
    if r.get("mem"):
        kept.append(Measure("peak_gib:unknown", number(r["mem"]) or 0.0, str(r["mem"])))
    return listed(raw, src["id"], framework, "batch size, packing, parallel layout and recompute not stated "
                  "(headline table only)", *kept)


def hf_fsdp_70b(raw: Mapping[str, Any], src: Mapping[str, Any]) -> Mapped:
    return listed(raw, src["id"], "hf-trainer", "one wall time including evaluation every 100 steps and two checkpoint "
                  "saves (the source's own caveat: a ceiling, not a step time)")


def misc(raw: Mapping[str, Any], src: Mapping[str, Any]) -> Mapped:
    if str(raw["id"]).startswith("galore"):
        return listed(raw, src["id"], "galore", "needs GaLore's projected 8-bit optimizer with per-layer updates",
                      Measure("peak_gib:unknown", 22.8, "22.8G"))
    r = raw["result"]
    m = Measure("oom", 1.0, "the source reports OOM") if r.get("oom") else Measure("peak_gib:unknown", number(r["mem"]) or 0.0, str(r["mem"]))
    return listed(raw, src["id"], "accelerate", "batch size and sequence length not stated", m)
