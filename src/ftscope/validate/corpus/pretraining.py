"""Pre-training-style sources: llm-foundry's MPT tables, NeMo / Megatron-Bridge, FlagPerf, xtuner.

Each function maps one published point to a `Mapped` (see common.py); the interpretations it makes are in the
point's notes, what it cannot map is its reason.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from .common import Mapped, Measure, gpu_key, hardware, listed, memory_kind, number, peak
from .models import mpt_config, preset


def _throughput(value: Any, note: str = "") -> Measure | None:
    v = number(value)
    return Measure("tokens_per_s_per_gpu", v, note) if v else None


def _mfu(text: Any) -> Measure | None:
    if text is None or "-" in str(text):   # FlagPerf's FP8 rows give a range over two peak definitions
        return None
    v = number(text)
    return Measure("mfu", v / 100.0 if v and v > 1 else v, "as the source defines it") if v else None


def _some(*measures: Measure | None) -> tuple[Measure, ...]:
    return tuple(m for m in measures if m is not None)


def _parallel_needs(tp: int, pp: int, cp: int, ep: int) -> tuple[str, ...]:
    needs = []
    for degree, feature in ((tp, "tensor parallelism"), (pp, "pipeline parallelism"),
                            (cp, "context parallelism"), (ep, "expert parallelism")):
        if degree > 1:
            needs.append(feature)
    return tuple(needs)


def _layout(mix: dict[str, Any], tp: int, pp: int, cp: int, ep: int, vp: int | None = None,
            overlap: bool = False) -> None:
    """Megatron layout keys of the mix (only the ones that differ from 1)."""
    for key, degree in (("tensor_parallel", tp), ("pipeline_parallel", pp), ("context_parallel", cp),
                        ("expert_parallel", ep)):
        if degree > 1:
            mix[key] = degree
    if tp > 1:
        mix["sequence_parallel"] = True
        if overlap:
            mix["tp_comm_overlap"] = True
    if pp > 1 and vp and vp > 1:
        mix["pipeline_schedule"] = "interleaved"
        mix["virtual_stages"] = vp


# ---- llm-foundry --------------------------------------------------------------------------------------------------

FOUNDRY_INTER_NODE_GBS = 25.0
"""1600 Gbps RoCE per 8-GPU node (the A100 tables' title) = 25 GB/s per GPU; the H100 tables do not say, and
get the same."""


def foundry_attention(raw: Mapping[str, Any]) -> str:
    """The attention kernel a foundry table ran: its notes say attn_impl triton (the 2023 default) for the A100
    and H100 tables and flash-attn 1.0.7 for the FP8 one; the 2024 large-scale table used flash (FlashAttention-2
    by then) for 1b / 3b / 7b / 70b and triton for 13b / 30b."""
    if str(raw["table"]).startswith("H100 80GB BF16 (Large Scale") and raw["model"] in ("mpt-1b", "mpt-3b", "mpt-7b", "mpt-70b"):
        return "flash"
    return "flash1"


def foundry(raw: Mapping[str, Any], src: Mapping[str, Any]) -> Mapped:
    r = raw["result"]
    notes = ["MPT as the falcon family's sequential layout (same matrices); C4 concatenated to seq_len: packed",
             "FSDP1 as fsdp (one all-gather per block and pass)"]
    needs = ("fp8",) if "fp8" in raw["precision"] else ()
    gpu, gnote = gpu_key(raw["gpu"])
    if raw["precision"] == "bf16":
        notes.append("FSDP 'PURE' mixed precision: fp32 sharded master weights, bf16 compute and communication")
    model = mpt_config(src["models"][raw["model"]], int(raw["seq_len"]))
    attention = foundry_attention(raw)
    notes.append(f"attention kernel: {'FlashAttention-2' if attention == 'flash' else 'the 2022 Triton / v1 flash kernel'}")
    notes.append("loss: fused (ComposerMPTCausalLM's default loss_fn 'fused_crossentropy': flash-attn's cross-entropy kernel)")
    notes.append("fused_elementwise: MPT's blocks run one low-precision LayerNorm kernel per norm, ALiBi (no RoPE) and GELU")
    mix = {"method": "full", "precision": "bf16-mixed", "attention": attention, "fsdp": raw["sharding"].split("-", 1)[1],
           "gradient_checkpointing": bool(raw["act_ckpt"]), "optimizer": "adamw", "loss": "fused",
           "fused_elementwise": True}
    if needs:
        mix["fp8"] = True
    scenario = {"model": model, "hardware": hardware(gpu, int(raw["n_gpus"]), inter_node_gbs=FOUNDRY_INTER_NODE_GBS),
                "mix": mix, "workload": {"micro_batch_size": int(raw["mbs"]), "seq_len": int(raw["seq_len"]),
                                         "padding": "packed", "gradient_accumulation": int(raw["ga"])}}
    measures = _some(_throughput(r["tokens_per_s_per_gpu"]),
                     Measure("mfu", r["mfu_pct"] / 100, "llm-foundry's MFU: 6N + attention, N with embeddings"))
    return Mapped(raw["id"], src["id"], "llm-foundry", scenario, measures, needs, notes=tuple(n for n in [*notes, gnote] if n))


# ---- NeMo / Megatron-Bridge ---------------------------------------------------------------------------------------

NEMO_LORA = {"nemo": {"lora_rank": 32, "lora_targets": ["q_proj", "k_proj", "v_proj"]},
             "megatron-bridge": {"lora_rank": 32, "lora_targets": "all-linear"}}
"""The tables do not state LoRA's rank or targets: each framework's default then, NeMo 1.x's
lora_tuning (attention_qkv, adapter_dim 32) and Megatron-Bridge's LoRA (linear_qkv/proj/fc1/fc2, dim 32)."""
TE_FUSED = "Transformer Engine fuses norms, activations and RoPE into its GEMM and attention kernels: modelled " \
           "as compile's fused elementwise traffic"


def _nemo_mix(raw: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...]]:
    par = raw["parallel"]
    tp, pp, cp, ep = (int(par.get(k) or 1) for k in ("tp", "pp", "cp", "ep"))
    vp = int(par.get("vp") or 1)
    # Transformer Engine's fused attention on Hopper is cuDNN's Hopper-native flash kernel (FlashAttention-3 class)
    mix: dict[str, Any] = {"method": "full", "precision": "bf16-mixed", "attention": "flash3", "optimizer": "adamw",
                           "experts_backend": "grouped_mm"}
    task = str(raw.get("task"))
    if task == "lora":
        mix.update(method="lora", **NEMO_LORA["nemo" if raw["id"].startswith("nemo") else "megatron-bridge"])
    mix["compile"] = True   # TE_FUSED
    needs = list(_parallel_needs(tp, pp, cp, ep))
    if "fp8" in str(raw["precision"]):
        mix["fp8"] = True
        needs.append("fp8")
    if par.get("fsdp"):
        mix["fsdp"] = "full_shard"
    elif pp == 1:
        mix["zero_stage"] = 1      # Megatron's distributed optimizer shards the optimizer states over DP
    else:
        mix["zero_stage"] = 1
    _layout(mix, tp, pp, cp, ep, vp, overlap=True)   # the performance recipes overlap TP collectives
    return mix, tuple(needs)


def nemo(raw: Mapping[str, Any], src: Mapping[str, Any]) -> Mapped:
    r = raw["result"]
    framework = "nemo" if raw["id"].startswith("nemo") else "megatron-bridge"
    measures = _some(_throughput(r.get("tokens_per_s_per_gpu")))
    gpu, gnote = gpu_key(raw["gpu"])
    if gpu is None:
        return listed(raw, src["id"], framework, gnote, *measures)
    model, mnote = preset(raw["model"])
    if model is None:
        return listed(raw, src["id"], framework, f"no architecture for {raw['model']} (no preset, none in the source)", *measures)
    mix, needs = _nemo_mix(raw)
    par = raw["parallel"]
    n = int(raw["n_gpus"])
    dp = n // (int(par.get("tp") or 1) * int(par.get("pp") or 1) * int(par.get("cp") or 1))
    # Megatron's micro-batches per step and data-parallel rank: global batch / (micro-batch x DP); the tables'
    # GA column says the same for every row but gpt-oss-120b's (2 where 512 / (4 x 16) = 8)
    ga = max(int(raw["gbs"]) // (int(raw["mbs"]) * dp), 1)
    scenario = {"model": model, "hardware": hardware(gpu, n), "mix": mix,
                "workload": {"micro_batch_size": int(raw["mbs"]), "seq_len": int(raw["seq_len"]), "padding": "packed",
                             "gradient_accumulation": ga}}
    notes = tuple(x for x in (mnote, "activation recompute not stated: none assumed (Megatron's default; model "
                              "TFLOP/s near 40 % of the FP8 peak leave no room for a recomputed forward)",
                              "Megatron's distributed optimizer as ZeRO-1; sequence parallel and TP comm overlap with TP",
                              "Transformer Engine's cuDNN fused attention (Hopper-native) as flash3",
                              TE_FUSED,
                              "LoRA rank and targets not stated: the framework's default" if raw.get("task") == "lora" else "",
                              "MoE routing force-balanced (as ftscope assumes)" if "balanced" in str(raw.get("note")) else "")
                  if x)
    return Mapped(raw["id"], src["id"], framework, scenario, measures, needs, notes=notes)


# ---- FlagPerf ---------------------------------------------------------------------------------------------------

def _flagperf_layout(text: str) -> dict[str, int]:
    out = {k: 1 for k in ("tp", "pp", "dp", "ep")}
    for key, value in re.findall(r"\b(PP|DP|TP|EP)(\d+)", str(text)):
        out[key.lower()] = int(value)
    return out


def _flagperf_mix(raw: Mapping[str, Any]) -> tuple[dict[str, Any], tuple[str, ...], list[str]]:
    fw = str(raw.get("framework", "")).lower()
    prec = str(raw["precision"])
    notes: list[str] = []
    mix: dict[str, Any] = {"method": "full", "attention": "flash" if "fa2" in fw else "sdpa", "optimizer": "adamw"}
    mix["precision"] = {"fp32": "fp32", "fp16": "fp16-mixed"}.get(prec, "bf16-mixed")
    if prec == "amp":
        notes.append("'amp' read as bf16 mixed precision")
    needs: list[str] = ["fp8"] if "fp8" in prec else []
    if "fp8" in prec:
        mix["fp8"] = True
    if "recompute-activations" in fw:   # Megatron's --recompute-activations is its selective recompute
        mix["gradient_checkpointing"] = True
        mix["checkpointing"] = "selective"
        needs.append("selective checkpointing")
    elif "gradient checkpointing on" in fw or "recompute=true" in str(raw.get("note", "")).lower():
        mix["gradient_checkpointing"] = True
    if "zero-3" in fw or "zero3" in fw:
        mix["zero_stage"] = 3
    elif "zero-1" in fw:
        mix["zero_stage"] = 1
    return mix, tuple(needs), notes


def _framework(fw: str) -> str:
    fw = fw.lower()
    for key, name in (("megatron-deepspeed", "megatron-deepspeed"), ("flagscale", "flagscale"),
                      ("megatron", "megatron-core"), ("deepspeed", "deepspeed"), ("hf/pytorch", "llama-recipes")):
        if key in fw:
            return name
    return "unknown"


def flagperf(raw: Mapping[str, Any], src: Mapping[str, Any]) -> Mapped:
    r = raw["result"]
    fw = _framework(str(raw.get("framework", "")))
    mem = str(r.get("mem_used_of_total_gib", "")).split("/")[0] or None
    measures = _some(_throughput(r.get("tokens_per_s_per_gpu")), _mfu(r.get("mfu")),
                     peak(mem, memory_kind("used/total"), "FlagPerf's used/total GiB (nvidia-smi, whole GiB)"),
                     Measure("oom", 1.0, "the source reports OOM") if r.get("oom") else None)
    gpu, gnote = gpu_key(raw["gpu"])
    model, mnote = preset(raw["model"])
    if gpu is None:
        return listed(raw, src["id"], fw, gnote, *measures)
    if model is None:
        return listed(raw, src["id"], fw, f"no architecture for {raw['model']} (no preset, none in the source)", *measures)
    mix, needs, notes = _flagperf_mix(raw)
    lay = _flagperf_layout(raw["parallel"])
    n = int(raw["n_gpus"])
    if "lora" in str(raw.get("task", "")):
        lora = raw["lora"]
        mix.update(method="lora", lora_rank=int(lora["r"]), lora_targets=list(lora["targets"]))
        notes.append("llama-recipes LoRA: sequences packed to seq_len, no checkpointing, sdpa attention")
    elif mix.get("zero_stage") is None and lay["tp"] * lay["pp"] * lay["ep"] == 1 and n > 1:
        mix["zero_stage"] = 1
        notes.append("Megatron-style data parallelism (gradients all-reduced, distributed optimizer) as ZeRO-1")
    _layout(mix, lay["tp"], lay["pp"], 1, lay["ep"])
    if lay["pp"] > 1 or lay["tp"] > 1:
        mix.setdefault("zero_stage", 1)   # Megatron's distributed optimizer
        notes.append("Megatron: distributed optimizer as ZeRO-1, sequence parallel with TP")
    if fw in ("megatron-core", "flagscale"):
        mix["compile"] = True
        notes.append(TE_FUSED)
    needs = needs + _parallel_needs(lay["tp"], lay["pp"], 1, lay["ep"])
    ga = int(raw.get("ga") or max(int(raw.get("gbs", n)) // (int(raw["mbs"]) * lay["dp"]), 1))
    scenario = {"model": model, "hardware": hardware(gpu, n), "mix": mix,
                "workload": {"micro_batch_size": int(raw["mbs"]), "seq_len": int(raw["seq_len"]),
                             "padding": "packed", "gradient_accumulation": ga}}
    notes += [x for x in (mnote, "pre-training data packed to seq_len") if x]
    return Mapped(raw["id"], src["id"], fw, scenario, measures, needs, notes=tuple(notes))


# ---- xtuner -----------------------------------------------------------------------------------------------------

def xtuner(raw: Mapping[str, Any], src: Mapping[str, Any]) -> Mapped:
    r = raw["result"]
    measures = _some(_throughput(r["tokens_per_s_per_gpu"]))
    model, mnote = preset(raw["model"])
    if model is None:
        return listed(raw, src["id"], "xtuner", f"no architecture for {raw['model']} (no preset, none in the source)", *measures)
    gpu, _ = gpu_key(raw["gpu"])
    sp = int(raw["parallel"]["sequence_parallel"])
    mix: dict[str, Any] = {"method": "full", "precision": "bf16-mixed", "attention": "flash", "zero_stage": 3,
                           "gradient_checkpointing": True, "optimizer": "adamw"}
    if sp > 1:
        mix.update(context_parallel=sp, context_parallel_impl="all_to_all")
    scenario = {"model": model, "hardware": hardware(gpu, int(raw["n_gpus"])), "mix": mix,
                "workload": {"micro_batch_size": int(raw["mbs"]), "seq_len": int(raw["seq_len"]) // sp * sp,
                             "padding": "packed", "gradient_accumulation": int(raw["ga"])}}
    notes = tuple(x for x in (mnote, "ZeRO stage not recorded by the source: ZeRO-3 assumed",
                              "sequence parallelism is DeepSpeed-Ulysses (all-to-all over heads)" if sp > 1 else "") if x)
    return Mapped(raw["id"], src["id"], "xtuner", scenario, measures, ("context parallelism",) if sp > 1 else (), notes=notes)
