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


def _layout(mix: dict[str, Any], tp: int, pp: int, cp: int, ep: int, vp: int | None = None) -> None:
    """Megatron layout keys of the mix (only the ones that differ from 1)."""
    for key, degree in (("tensor_parallel", tp), ("pipeline_parallel", pp), ("context_parallel", cp),
                        ("expert_parallel", ep)):
        if degree > 1:
            mix[key] = degree
    if tp > 1:
        mix["sequence_parallel"] = True
    if pp > 1 and vp and vp > 1:
        mix["pipeline_schedule"] = "interleaved"
        mix["virtual_stages"] = vp


# ---- llm-foundry --------------------------------------------------------------------------------------------------

FOUNDRY_INTER_NODE_GBS = 25.0
"""1600 Gbps RoCE per 8-GPU node (the A100 tables' title) = 25 GB/s per GPU; the H100 tables do not say, and
get the same."""


def foundry(raw: Mapping[str, Any], src: Mapping[str, Any]) -> Mapped:
    r = raw["result"]
    notes = ["MPT as the falcon family's sequential layout (same matrices); C4 concatenated to seq_len: packed",
             "FSDP1 as fsdp (one all-gather per block and pass)"]
    needs = ("fp8",) if "fp8" in raw["precision"] else ()
    gpu, gnote = gpu_key(raw["gpu"])
    if raw["precision"] == "bf16":
        notes.append("FSDP 'PURE' mixed precision: fp32 sharded master weights, bf16 compute and communication")
    model = mpt_config(src["models"][raw["model"]], int(raw["seq_len"]))
    mix = {"method": "full", "precision": "bf16-mixed", "attention": "flash", "fsdp": raw["sharding"].split("-", 1)[1],
           "gradient_checkpointing": bool(raw["act_ckpt"]), "optimizer": "adamw"}
    if needs:
        mix["fp8"] = True
    scenario = {"model": model, "hardware": hardware(gpu, int(raw["n_gpus"]), inter_node_gbs=FOUNDRY_INTER_NODE_GBS),
                "mix": mix, "workload": {"micro_batch_size": int(raw["mbs"]), "seq_len": int(raw["seq_len"]),
                                         "padding": "packed", "gradient_accumulation": int(raw["ga"])}}
    measures = _some(_throughput(r["tokens_per_s_per_gpu"]),
                     Measure("mfu", r["mfu_pct"] / 100, "llm-foundry's MFU: 6N + attention, N with embeddings"))
    return Mapped(raw["id"], src["id"], "llm-foundry", scenario, measures, needs, notes=tuple(n for n in [*notes, gnote] if n))


# ---- NeMo / Megatron-Bridge ---------------------------------------------------------------------------------------

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
    return listed(raw, src["id"], framework, "activation recomputation of the recipe not stated (Megatron performance "
                  "recipes set it per model)", *measures)


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
