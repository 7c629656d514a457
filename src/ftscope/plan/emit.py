"""Launchable configs for a recommended scenario: DeepSpeed JSON, accelerate YAML, PEFT + Trainer arguments.

Every file says what it holds (mix, engine, GPUs, micro-batch, why it was chosen): a # header in YAML and Python,
a README.txt per folder for the JSON, which cannot hold a comment. No file names an absolute path."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import yaml

from ..spec.scenario import Scenario
from .recommend import differences, signed_percent, signed_usd

if TYPE_CHECKING:
    from .recommend import Candidate, Recommendation


def deepspeed_config(scn: Scenario, micro_batch: int, force: bool = False) -> dict[str, Any] | None:
    """The DeepSpeed JSON for a ZeRO scenario (None when the mix does not use DeepSpeed; `force` writes stage 0,
    DeepSpeed's plain data parallelism, for a mix without sharding)."""
    mix = scn.mix
    if mix.fsdp is not None or (mix.zero_stage == 0 and mix.offload == "none" and not force):
        return None
    h = scn.model.arch.hidden_size
    # the values transformers' "auto" would fill in, written out so plain DeepSpeed accepts the file too
    zero: dict[str, Any] = {"stage": mix.zero_stage, "overlap_comm": True, "contiguous_gradients": True,
                            "reduce_bucket_size": h * h}
    if mix.zero_stage == 3:
        zero.update({"stage3_prefetch_bucket_size": int(0.9 * h * h), "stage3_param_persistence_threshold": 10 * h,
                     "stage3_gather_16bit_weights_on_model_save": True})
    if mix.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if mix.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": scn.workload.gradient_accumulation,
        "gradient_clipping": 1.0,
        "zero_optimization": zero,
        "bf16": {"enabled": mix.precision.startswith("bf16")},
        "fp16": {"enabled": mix.precision.startswith("fp16")},
    }
    if mix.optimizer not in ("adamw",) and mix.offload == "none":
        cfg["zero_allow_untested_optimizer"] = True  # bitsandbytes 8-bit AdamW is a client optimizer
    return cfg


def accelerate_config(scn: Scenario, ds_file: str | None) -> dict[str, Any]:
    """An accelerate config (the YAML `accelerate launch --config_file` reads)."""
    mix, cl = scn.mix, scn.cluster
    precision = "bf16" if mix.precision.startswith("bf16") else ("fp16" if mix.precision.startswith("fp16") else "no")
    cfg: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE", "machine_rank": 0, "main_training_function": "main",
        "num_machines": cl.nodes, "num_processes": cl.world_size, "mixed_precision": precision,
        "rdzv_backend": "static", "same_network": True, "use_cpu": False, "downcast_bf16": "no",
    }
    if ds_file is not None:
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = {"deepspeed_config_file": ds_file, "zero3_init_flag": mix.zero_stage == 3}
    elif mix.fsdp is not None:
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = {
            "fsdp_version": 2, "fsdp_reshard_after_forward": mix.fsdp == "full_shard",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_offload_params": mix.offload == "optimizer+params", "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_activation_checkpointing": mix.gradient_checkpointing,
        }
    else:
        cfg["distributed_type"] = "MULTI_GPU" if cl.world_size > 1 else "NO"
    return cfg


def training_snippet(scn: Scenario, micro_batch: int) -> str:
    """Python: the PEFT / bitsandbytes / TrainingArguments settings of the scenario."""
    mix, wl = scn.mix, scn.workload
    lines = ["# Settings for transformers.Trainer + PEFT.",
             "import torch", "from transformers import TrainingArguments"]
    if mix.trains_lora:
        targets = mix.lora_targets if isinstance(mix.lora_targets, str) else list(mix.lora_targets)
        lines += ["from peft import LoraConfig", "",
                  f"lora = LoraConfig(r={mix.lora_rank}, lora_alpha={2 * mix.lora_rank}, lora_dropout=0.0, "
                  f"target_modules={targets!r}, task_type='CAUSAL_LM')"]
        if scn.model.is_moe and (targets == "all-linear" or "experts" in targets):
            lines.append("# MoE experts are fused 3-D parameters in transformers 5: add "
                         "target_parameters=['mlp.experts.gate_up_proj', 'mlp.experts.down_proj'] to LoraConfig")
    if mix.method == "qlora":
        lines += ["from transformers import BitsAndBytesConfig",
                  "quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type='nf4', "
                  f"bnb_4bit_use_double_quant={mix.nested_quant}, bnb_4bit_compute_dtype=torch.bfloat16"
                  + (", bnb_4bit_quant_storage=torch.bfloat16" if mix.shard_stage == 3 else "") + ")"]
    attn = {"flash": "flash_attention_2", "sdpa": "sdpa", "eager": "eager"}[mix.attention]
    lines += ["", f"model_kwargs = dict(attn_implementation={attn!r}, torch_dtype=torch.bfloat16)", "",
              "args = TrainingArguments(", "    output_dir='out',",
              f"    per_device_train_batch_size={micro_batch},",
              f"    gradient_accumulation_steps={wl.gradient_accumulation},",
              f"    num_train_epochs={wl.epochs:g},",
              f"    gradient_checkpointing={mix.gradient_checkpointing},",
              f"    bf16={mix.precision.startswith('bf16')}, fp16={mix.precision.startswith('fp16')},",
              f"    optim={ {'adamw': 'adamw_torch', 'adamw_8bit': 'adamw_bnb_8bit', 'paged_adamw_8bit': 'paged_adamw_8bit', 'sgd': 'sgd'}[mix.optimizer]!r},",
              f"    group_by_length={wl.padding == 'dynamic'},", ")"]
    return "\n".join(lines) + "\n"


FILE_ROLES = {
    "ds_config.json": "the DeepSpeed config (accelerate.yaml names it; or `deepspeed --deepspeed ds_config.json`)",
    "accelerate.yaml": "`accelerate launch --config_file accelerate.yaml YOUR_TRAIN_SCRIPT.py`",
    "train_args.py": "LoraConfig / BitsAndBytesConfig / TrainingArguments settings for transformers.Trainer",
}
"""What README.txt says each launch file is (a framework config is described by its own header)."""


def uses_deepspeed(scn: Scenario, engine: str | None = None) -> bool:
    """Whether the launch files run the mix under DeepSpeed: every ZeRO stage above 0, and ZeRO-0 (plain data
    parallelism) too when the search was restricted to DeepSpeed (`--engine deepspeed`)."""
    return scn.mix.fsdp is None and (scn.mix.zero_stage > 0 or engine == "deepspeed")


def engine_words(scn: Scenario, deepspeed: bool | None = None) -> str:
    """Which engine runs the mix, in words: DeepSpeed ZeRO-n, FSDP <strategy>, DDP or a single GPU."""
    mix, n = scn.mix, scn.cluster.world_size
    offload = {"none": "", "optimizer": ", optimizer state offloaded to CPU",
               "optimizer+params": ", optimizer state and parameters offloaded to CPU"}[mix.offload]
    if uses_deepspeed(scn) if deepspeed is None else deepspeed:
        return f"DeepSpeed ZeRO-{mix.zero_stage}" + (" (plain data parallelism)" if mix.zero_stage == 0 else "") + offload
    if mix.fsdp is not None:
        return f"FSDP {mix.fsdp} (torch FSDP2 through accelerate)" + offload
    return f"DDP on {n} GPUs (no sharding)" if n > 1 else "a single GPU (no data parallelism, no sharding)"


def label_lines(scn: Scenario, micro_batch: int, why: str | None = None, deepspeed: bool | None = None) -> list[str]:
    """What a folder of launch files holds, as every file written into it says it (a comment in YAML and
    Python, README.txt for the JSON that cannot hold one). No absolute path: the folder can be moved."""
    wl = scn.workload
    lines = ["Written by ftscope.",
             f"mix: {scn.mix.label()}",
             f"engine: {engine_words(scn, deepspeed)}",
             f"run: {scn.model.name} on {scn.cluster.world_size}x {scn.cluster.gpu.key}, micro-batch {micro_batch} x "
             f"grad-accum {wl.gradient_accumulation}, seq {wl.seq_len}"]
    if why:
        lines.append(f"why: {why}")
    lines.append("Paths in these files are relative to their folder: launch from it.")
    return lines


def commented(lines: list[str], text: str) -> str:
    """`text` under `lines` as # comments (YAML and Python both read them as comments)."""
    return "".join(f"# {line}\n" for line in lines) + text


def _launch_files(scn: Scenario, micro_batch: int, out: Path, label: list[str], deepspeed: bool) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    ds = deepspeed_config(scn, micro_batch, force=deepspeed)
    if ds is not None:
        written.append(out / "ds_config.json")
        written[-1].write_text(json.dumps(ds, indent=2) + "\n")
    acc = out / "accelerate.yaml"
    # named relative to the folder (accelerate resolves it against the working directory: launch from the folder)
    acc.write_text(commented(label, yaml.safe_dump(accelerate_config(scn, "ds_config.json" if ds else None),
                                                   sort_keys=False)))
    snip = out / "train_args.py"
    snip.write_text(commented(label, training_snippet(scn, micro_batch)))
    return written + [acc, snip]


def write_readme(out: Path, label: list[str], files: list[Path], more: Sequence[str] = ()) -> Path:
    """README.txt: the label and what each file in the folder is (JSON files cannot say it themselves)."""
    lines = [*label, "", "Files:"]
    for p in files:
        role = FILE_ROLES.get(p.name, "a framework config; its first lines say how to launch it")
        lines.append(f"  {p.relative_to(out)}: {role}")
    path = out / "README.txt"
    path.write_text("\n".join([*lines, *more]) + "\n")
    return path


def emit(scn: Scenario, micro_batch: int, out_dir: str | Path, why: str | None = None,
         engine: str | None = None) -> list[Path]:
    """Write ds_config.json (when the mix runs under DeepSpeed), accelerate.yaml, train_args.py and README.txt,
    each saying what it holds; return the paths."""
    out = Path(out_dir)
    deepspeed = uses_deepspeed(scn, engine)
    label = label_lines(scn, micro_batch, why, deepspeed)
    files = _launch_files(scn, micro_batch, out, label, deepspeed)
    return files + [write_readme(out, label, files)]


AlsoWrite = Callable[[Scenario, int, Path, list[str], bool], "Path | None"]
"""A writer of one more file per emitted folder (a framework config): scenario, micro-batch, folder, label lines,
whether the folder runs under DeepSpeed."""


def emit_recommendation(rec: "Recommendation", out_dir: str | Path, also: AlsoWrite | None = None) -> list[Path]:
    """What `recommend --emit DIR` writes: the winner's launch files in DIR and, when the search was not restricted
    to one engine and the winner does not run under DeepSpeed, the best DeepSpeed candidate's in DIR/deepspeed
    (for users who launch with deepspeed), each folder labelled with what it holds and why."""
    if rec.best is None:
        return []
    folders = [(Path(out_dir), rec.best, winner_why(rec))]
    ds = rec.best_deepspeed
    if rec.engine is None and ds is not None and ds is not rec.best:
        folders.append((Path(out_dir) / "deepspeed", ds, alternative_why(rec, ds)))
    written: list[Path] = []
    for i, (out, cand, why) in enumerate(folders):
        micro, deepspeed = cand.estimate.micro_batch_size, uses_deepspeed(cand.scenario, rec.engine)
        label = label_lines(cand.scenario, micro, why, deepspeed)
        files = _launch_files(cand.scenario, micro, out, label, deepspeed)
        extra = also(cand.scenario, micro, out, label, deepspeed) if also is not None else None
        files += [extra] if extra is not None else []
        more = ["  deepspeed/: the best DeepSpeed alternative, a different configuration (see deepspeed/README.txt)"
                ] if i == 0 and len(folders) > 1 else []
        written += files + [write_readme(out, label, files, more)]
    return written


ENGINE_SCOPE = {"deepspeed": "under DeepSpeed (--engine deepspeed)", "fsdp": "under FSDP (--engine fsdp)"}


def winner_why(rec: "Recommendation") -> str:
    """Why the winner's folder holds it: ranked first, of how many, under which restriction."""
    w = rec.best.estimate
    cost = f", ${w.run.usd:,.2f}" if w.run.usd is not None else ""
    scope = f" {ENGINE_SCOPE[rec.engine]}" if rec.engine else ""
    return (f"the winner by {rec.by} ({w.run.hours:,.2f} h{cost}) of {rec.summary.feasible:,} configurations that "
            f"run{scope}")


def alternative_why(rec: "Recommendation", alt: "Candidate") -> str:
    """Why a DeepSpeed folder holds a configuration other than the winner, and how it differs."""
    w, e = rec.best.estimate, alt.estimate
    diff = ", ".join(differences(rec.best.scenario, alt.scenario))
    cost = f", {signed_usd(e.run.usd - w.run.usd)}" if e.run.usd is not None and w.run.usd is not None else ""
    return (f"best DeepSpeed alternative: {alt.scenario.mix.label()}, differs from the winner "
            f"({rec.best.scenario.mix.label()} on {rec.best.scenario.cluster.world_size}x "
            f"{rec.best.scenario.cluster.gpu.key}) in {diff}; {signed_percent((e.run.hours / w.run.hours - 1) * 100)} "
            f"time{cost}")
