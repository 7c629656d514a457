"""Fine-tuning sources with full configurations: Answer.AI's fsdp_qlora benchmarks and torchtune's tables."""
from __future__ import annotations

import re
from typing import Any, Mapping

from .common import Mapped, Measure, exact_gpu, gpu_key, listed, lora_targets, memory_kind, number, peak
from .models import preset

# ---- Answer.AI fsdp_qlora ---------------------------------------------------------------------------------------

ANSWERAI_SAMPLES = 1024
"""Every row times one run over 1,024 dummy samples of exactly seq_len tokens."""
OLDER_PCIE_GBS = 16.0
"""The 3090 rig's "older PCIe board" read as PCIe 3.0 x16 (the 4090 rig is stated as full PCIe 4.0 x16)."""


def answerai(raw: Mapping[str, Any], src: Mapping[str, Any]) -> Mapped:
    r = raw["result"]
    n, seq, mbs = int(raw["n_gpus"]), int(raw["seq_len"]), int(raw["mbs"])
    measures = [Measure("tokens_per_s_per_gpu", ANSWERAI_SAMPLES * seq / r["total_time_s_1024_samples"] / n,
                        "1,024 samples x seq_len / total time / GPUs")]
    if r.get("peak_reserved_gib"):
        measures.append(Measure("peak_gib:reserved", float(r["peak_reserved_gib"]), "torch max_memory_reserved"))
    allocated = re.search(r"peak allocated (\d+(?:\.\d+)?) GiB", str(raw.get("note", "")))
    if allocated:  # the post gives max_memory_allocated for two rows
        measures.append(Measure("peak_gib:allocated", float(allocated.group(1)), "torch max_memory_allocated (the post)"))
    model, mnote = preset(raw["model"])
    gpu, gnote = gpu_key(raw["gpu"])
    if model is None or gpu is None:
        why = gnote if gpu is None else f"no architecture for {raw['model']} (no preset, none in the source)"
        return listed(raw, src["id"], "fsdp_qlora", why, *measures)
    ddp = "NO_SHARD" in str(raw["sharding"])
    mix: dict[str, Any] = {"method": raw["method"], "lora_rank": 64, "lora_targets": "all-linear",
                           "gradient_checkpointing": True, "attention": "sdpa", "precision": "bf16", "optimizer": "adamw"}
    mix["fsdp"] = "none" if ddp else "full_shard"
    needs: list[str] = []
    if raw.get("cpu_offload"):
        mix["offload"] = "optimizer+params"
        if raw["method"] == "qlora":
            needs.append("qlora param offload")
    if raw.get("act_cpu_offload"):
        mix["activation_offload"] = True
        needs.append("activation offload")
    notes = ["fsdp_qlora train.py defaults: LoRA r64 on q,k,v,o,gate,up,down, pure bf16, checkpointing, sdpa",
             "FSDP1 NO_SHARD ('ddp') as plain data parallelism" if ddp else "FSDP1 full_shard as fsdp full_shard"]
    ga = 1
    if "effective batch" in str(raw.get("ga", "")):
        ga = max(1, round(32 / (mbs * n)))
        notes.append(f"gradient accumulation not listed per row; {ga} gives the stated effective batch of ~32")
    hw_gpu: Any = gpu
    if "older PCIe board" in str(raw["gpu"]):
        hw_gpu = {"base": gpu, "intra_node_gbs": OLDER_PCIE_GBS}
        notes.append(f"'older PCIe board': PCIe 3.0 x16, {OLDER_PCIE_GBS:g} GB/s per direction between the GPUs")
    scenario = {"model": model, "framework": "fsdp-qlora", "hardware": {"gpu": hw_gpu, "gpus_per_node": n}, "mix": mix,
                "workload": {"micro_batch_size": mbs, "seq_len": seq, "padding": "max_length",
                             "gradient_accumulation": ga}}
    notes += [x for x in (mnote, gnote) if x]
    return Mapped(raw["id"], src["id"], "fsdp_qlora", scenario, tuple(measures), tuple(needs), notes=tuple(notes))


# ---- torchtune --------------------------------------------------------------------------------------------------

TORCHTUNE_LORA_TARGETS = ["q_proj", "v_proj", "output_proj"]
"""torchtune's Llama 3.1 LoRA single-device recipes: lora_attn_modules q, v, output (as ftscope's copy of the
bundled cases reads them), for a row that names no config below."""

TORCHTUNE_CONFIG_LORA = {
    "llama3_1/8B_lora_single_device": (8, ["q_proj", "v_proj"]),
    "llama3_1/8B_qlora_single_device": (8, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "llama3_1/70B_lora": (16, ["q_proj", "k_proj", "v_proj"]),
    "llama3_1/405B_qlora": (16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    "llama2/7B_lora_single_device": (8, ["q_proj", "v_proj"]),
    "llama2/7B_qlora_single_device": (8, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
}
"""lora_rank and lora_attn_modules (+ apply_lora_to_mlp) of the named configs (recipes/configs/<name>.yaml at
30b8519e; the llama2 ones at 0914d5cf), for rows that do not repeat them."""


TORCHTUNE_GIB_FROM = "2024-08-15"
"""torchtune's get_memory_stats divided by 1e9 (GB) until d0b89e20 (#1348, 2024-08-15) and by 1024**3 (GiB) after
(torchtune/utils/memory.py at fef3ed10 and 0217d44c, torchtune/training/memory.py at 30b8519e): a figure's unit
follows its date, whatever its table's label."""


TORCHTUNE_FIGURE_DATES = {
    "docs/source/tutorials/lora_finetune.rst": "2024-04-15",   # ff594c23 (#702) wrote its peak-memory table
    "docs/source/tutorials/qlora_finetune.rst": "2024-04-15",  # 0914d5cf (#693) wrote its reserved-memory table
}
"""When the figures of a doc the corpus cites at a later HEAD were written (`git log -S` on the figure): the recipe,
unit and dataset defaults of that date apply, not HEAD's."""

TORCHTUNE_COPIED_FIGURES = {
    "torchtune-2404-llama2-7b-lora-1x4090": "2024-03-21",   # a95c6b93 (#551) wrote 17.18 GB; fef3ed10 (#775) kept it
    "torchtune-2404-llama2-7b-qlora-1x4090": "2024-03-22",  # 412a4ecd (#478) wrote 9.29 GB; fef3ed10 (#775) kept it
}
"""README rows whose figure an earlier table wrote (`git log -S` on the figure): the date it was measured."""


def _doc_date(raw: Mapping[str, Any]) -> str:
    copied = TORCHTUNE_COPIED_FIGURES.get(str(raw.get("id")))
    if copied:
        return copied
    doc = str(raw.get("doc", ""))
    date = re.search(r"\((\d{4}-\d{2}-\d{2})\)", doc)
    if date:
        return date.group(1)
    return next((d for path, d in TORCHTUNE_FIGURE_DATES.items() if doc.startswith(path)), "")


def _torchtune_memory(raw: Mapping[str, Any]) -> Measure | None:
    r = raw["result"]
    for key in ("peak_mem_gib", "peak_mem_per_gpu", "peak_mem_gb", "peak_reserved_training_gb"):
        if r.get(key) is not None:
            kind = memory_kind(r.get("mem_kind"))
            why = ""
            date = _doc_date(raw)
            if kind == "unknown":  # its recipes log torch's counters (active, allocated, reserved), never nvidia-smi
                kind, why = _unstated_counter(date)
            value = float(r[key])
            if date and date < TORCHTUNE_GIB_FROM:
                return peak(value * 1e9 / 2**30, kind, f"{key} {value:g} GB (torchtune logged 1e9 bytes until "
                            f"{TORCHTUNE_GIB_FROM}) as {kind} GiB{why}")
            unit = "GiB" if date else r.get("unit", "GiB" if key.endswith("gib") else "GB")
            return peak(value, kind, f"{key} as {kind} (source unit: {unit}, compared as GiB){why}")
    return None


TORCHTUNE_ACTIVE_NAMED = "2024-11-18"
"""The README's "Optimization flags" table (1814feb1, 2024-11-18) names its counter: "Peak Memory Active (GiB)"; the
2024-02/04 tables named reserved ("GPU peak memory reserved", README at e802c057; max_memory_reserved at eef59f7a^)
and so does the QLoRA tutorial (0914d5cf). torch's peak active bytes are what max_memory_allocated reports."""


def _unstated_counter(date: str) -> tuple[str, str]:
    """(counter, note) for a torchtune figure that names none: the counter its tables of the same logging era name.
    Until TORCHTUNE_GIB_FROM (GB tables) reserved; after it (GiB tables) peak active, read as allocated."""
    if date and date >= TORCHTUNE_GIB_FROM:
        return "allocated", (f"; counter unstated: peak active, the one the GiB-era table of {TORCHTUNE_ACTIVE_NAMED} "
                             "names")
    return "reserved", "; counter unstated: reserved, the one the GB-era tables name"


def _torchtune_throughput(raw: Mapping[str, Any]) -> Measure | None:
    r = raw["result"]
    if r.get("tokens_per_s") is None:
        return None
    n = int(raw.get("n_gpus") or 1)
    scope = str(r.get("tokens_per_s_scope", ""))
    if n > 1:
        return Measure("tokens_per_s_per_gpu", float(r["tokens_per_s"]) / n, "per job / GPUs",
                       reason="tokens/s of a multi-GPU run without saying per GPU or per job")
    return Measure("tokens_per_s_per_gpu", float(r["tokens_per_s"]), scope or "one GPU")


def torchtune_version(raw: Mapping[str, Any]) -> str:
    """The recipe of a torchtune point's vintage: its README tables before the chunked loss (2024-08) ran 0.1."""
    date = _doc_date(raw)
    return "torchtune-0.1" if date and date[:7] < "2024-08" else "torchtune"


TORCHTUNE_CONFIGS = {
    "llama3_1/8B_full_single_device": "bitsandbytes.optim.PagedAdamW8bit optimizer_in_bwd",
    "llama3_1/405B_qlora": "torch.nn.CrossEntropyLoss",
}
"""What a named config sets that its README row does not repeat (recipes/configs/<name>.yaml at 30b8519e)."""


TORCHTUNE_UNSTATED_CONFIG = {
    ("30b8519e", "a6000"): "config not stated: the 2024-09 table names none (only batch 2, packed 2,048, compile), "
    "and the same stated settings measure 1.9x the 4090 row's peak (30.3 vs 16.2, 37.4 vs 18.9 GiB); nothing in "
    "that README or its configs says what differs on the A6000",
}
"""Rows whose figure cannot be tied to a config: (README commit, GPU word) -> why their peak is not compared."""


TORCHTUNE_OFF_SETUP = {
    "torchtune-2404-llama2-7b-lora-2x4090": "20.95 GB is 6.8 GB above what the same recipe and config measured three "
    "weeks earlier, 14.17 GB (README at a95c6b93: lora_finetune_distributed on 2 GPUs, q,v r8, batch 2, no "
    "checkpointing, alpaca-cleaned then untruncated, so longer batches); lora_finetune_distributed.py changed in "
    "between only by gradient accumulation and cleanup_before_training (which empties the cache): the table "
    "contradicts its own earlier figure, by about the other rank's half of the bf16 weights (6.28 GiB)",
    "torchtune-2409-llama31-8b-lora-rtx4090-24gbx1": "16.2 GiB is less than the stated setup (batch 2 packed to 2,048, "
    "checkpointing, the chunked loss) keeps at the end of forward, whatever the counter: bf16 weights 14.96 GiB + 32 "
    "checkpointed layer inputs 1.00 GiB + the 8 chunks' bf16 logits the loss saves 0.98 GiB = 16.94 GiB (the table's "
    "QLoRA and full rows sit above theirs)",
    "torchtune-2409-llama31-405b-qlora-a100x8": "44.8 GB is less than the stated setup (batch 2 packed to 2,048) holds: "
    "NF4 shards 25.2 GiB + 126 checkpointed layer inputs 15.75 GiB + CrossEntropyLoss's fp32 logits and log-softmax "
    "3.9 GiB + FSDP2's root (embeddings, LM head), which lora_finetune_distributed leaves unwrapped and FSDP2 keeps "
    "gathered from forward to the end of backward, 6.9 GiB more = 51.8 GiB; its config (405B_qlora.yaml at 30b8519e) "
    "runs batch_size 1, and the row alone is labelled GB",
}
"""Rows whose figure their stated setup cannot produce: below what it must hold (its irreducible tensors, read from the
recipe at the table's commit), or contradicted by the same project's earlier figure of the same recipe and config.
Their peak is listed, their throughput still compared."""


def _unstated_config(raw: Mapping[str, Any]) -> str | None:
    off = TORCHTUNE_OFF_SETUP.get(str(raw.get("id")))
    if off:
        return off
    doc, gpu = str(raw.get("doc", "")), str(raw.get("gpu", "")).lower()
    return next((why for (ref, card), why in TORCHTUNE_UNSTATED_CONFIG.items() if ref in doc and card in gpu), None)


def _torchtune_text(raw: Mapping[str, Any]) -> str:
    text = f"{raw.get('optimizer', '')} {raw.get('note', '')} {raw.get('config', '')}"
    return " ".join([text, *(facts for name, facts in TORCHTUNE_CONFIGS.items() if name in text)]).lower()


def _torchtune_mix(raw: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    method = str(raw["method"])
    text = _torchtune_text(raw)
    # #1390 (4fba6cd4, 2024-08-28) moved the configs to CEWithChunkedOutputLoss; 405B_qlora kept CrossEntropyLoss
    chunked = torchtune_version(raw) == "torchtune" and "crossentropyloss" not in text
    if "chunked_ce" in raw:
        chunked = bool(raw["chunked_ce"])
    mix: dict[str, Any] = {"method": method, "precision": "bf16", "attention": "sdpa", "optimizer": "adamw",
                           "loss": "chunked" if chunked else "standard"}
    needs: list[str] = []
    if method in ("lora", "qlora"):
        lora = raw.get("lora") or {}
        rank, targets = next((v for name, v in TORCHTUNE_CONFIG_LORA.items() if name.lower() in text),
                             (8, TORCHTUNE_LORA_TARGETS))
        mix["lora_rank"] = int(lora.get("r", rank))
        mix["lora_targets"] = lora_targets(lora["targets"]) if lora.get("targets") else targets
    if raw.get("optimizer_in_bwd") or "optimizer_in_bwd" in text:
        needs.append("optimizer in backward")
        mix["optimizer_in_backward"] = True
    if "8bit" in text:
        mix["optimizer"] = "paged_adamw_8bit" if "paged" in text else "adamw_8bit"
    elif "paged" in text:
        needs.append("paged 32-bit optimizer")
    if raw.get("compile"):
        needs.append("torch.compile")
        mix["compile"] = True
    if raw.get("act_offload"):
        needs.append("activation offload")
        mix["activation_offload"] = True
    gc = raw.get("act_ckpt")
    mix["gradient_checkpointing"] = bool(gc) if gc is not None else "gc off" not in text
    n = int(raw.get("n_gpus") or 1)
    if n > 1:
        mix["fsdp"] = "full_shard"
        if "cpu offload" in text:
            mix["offload"] = "optimizer+params"
    return mix, needs


TORCHTUNE_ALPACA_512_FROM, TORCHTUNE_ALPACA_512_UNTIL = "2024-03-30", "2024-08-15"
"""torchtune's alpaca_dataset and alpaca_cleaned_dataset truncated at max_seq_len=512 by default
(torchtune/datasets/_alpaca.py lines 15, 66 at ff594c23) from 73647e26 (#620, 2024-03-30: InstructDataset gained
max_seq_len; before it nothing truncated, datasets/_instruct.py at a95c6b93) until 8295cc35 (#1284, 2024-08-15)."""

TORCHTUNE_CONFIG_DATASETS = {"llama2/7B_lora_single_device": "alpaca_cleaned", "llama2/7B_qlora_single_device": "alpaca_cleaned"}
"""The dataset of configs a point names without its dataset (recipes/configs/llama2/*.yaml at ff594c23: alpaca_cleaned_dataset,
its defaults)."""

TORCHTUNE_SAME_FIGURE = {
    "torchtune-tut-lora-llama2-7b-reserved": "torchtune-tut-lora-llama2-7b-r8-qv (15.57 GB: the two tutorials quote one run)",
}
"""Points whose training figure is another point's (the same run quoted twice): listed, so one run counts once."""


def _torchtune_seq(raw: Mapping[str, Any]) -> tuple[int | None, str, str]:
    """(seq_len, padding, note) or (None, '', why) when the padded lengths are not known."""
    seq = raw.get("seq_len")
    dataset = str(raw.get("dataset") or TORCHTUNE_CONFIG_DATASETS.get(str(raw.get("config", "")), ""))
    if raw.get("packing"):
        return int(number(seq)), "packed", "packed to seq_len"
    date = _doc_date(raw)
    if "alpaca" in dataset and date and date < TORCHTUNE_ALPACA_512_FROM:
        return None, "", (f"figure measured {date}, before torchtune's alpaca builders truncated ({TORCHTUNE_ALPACA_512_FROM}): "
                          "padded to the longest alpaca sample the logged steps drew, not stated")
    if "max_seq_len 512" in dataset or (seq is None and "alpaca" in dataset and date and date < TORCHTUNE_ALPACA_512_UNTIL):
        return 512, "max_length", "alpaca has samples past 512 tokens: the longest batch is padded to 512"
    return None, "", "needs the dataset's token-length distribution (alpaca, unpacked; not stated)"


def torchtune(raw: Mapping[str, Any], src: Mapping[str, Any]) -> Mapped:
    measures = tuple(m for m in (_torchtune_throughput(raw), _torchtune_memory(raw)) if m is not None)
    if raw.get("result", {}).get("micro_batches_per_s") is not None:
        return listed(raw, src["id"], "torchtune", "GPU not stated (it/s of the QLoRA tutorial)")
    model, mnote = preset(raw["model"])
    gpu, gnote = gpu_key(raw["gpu"])
    if model is None:
        return listed(raw, src["id"], "torchtune", f"no architecture for {raw['model']} (no preset, none in the source)", *measures)
    seq, padding, snote = _torchtune_seq(raw)
    if seq is None:
        return listed(raw, src["id"], "torchtune", snote, *measures)
    same = TORCHTUNE_SAME_FIGURE.get(str(raw["id"]))
    if same:
        return listed(raw, src["id"], "torchtune", f"the same run's figure as {same}", *measures)
    unstated = _unstated_config(raw)
    if unstated:
        measures = tuple(Measure(m.metric, m.value, m.note, unstated) if m.metric.startswith("peak") else m
                         for m in measures)
    if not exact_gpu(raw["gpu"]):
        measures = tuple(m if m.metric.startswith("peak") else Measure(m.metric, m.value, m.note, "GPU size not stated")
                         for m in measures)
    if unstated and all(m.reason for m in measures):  # nothing left to compare: the point is listed
        return listed(raw, src["id"], "torchtune", unstated, *measures)
    mix, needs = _torchtune_mix(raw)
    n = int(raw.get("n_gpus") or 1)
    scenario = {"model": model, "framework": torchtune_version(raw), "hardware": {"gpu": gpu, "gpus_per_node": n},
                "mix": mix, "workload": {"micro_batch_size": int(raw["mbs"]), "seq_len": seq, "padding": padding,
                             "gradient_accumulation": int(raw.get("ga") or 1)}}
    notes = tuple(x for x in (mnote, gnote, snote, "pure bf16 (torchtune)") if x)
    return Mapped(raw["id"], src["id"], "torchtune", scenario, measures, tuple(needs), notes=notes)
