"""The bad-input cases: every verb, every file or path argument, and each class of bad value or file.

`build(d)` writes the fixtures under folder `d` and returns the cases. A case is an argv for `ftscope` and the
exit codes a correct ftscope may end with: 2 (bad input, one line on stderr) for nearly all; 0 for odd but valid
input, whose output is then checked for NaN, inf and negative figures.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bad_input_fixtures as fx


@dataclass(frozen=True)
class Case:
    name: str
    """'<verb> <argument>: <what is wrong>'."""
    argv: tuple[str, ...]
    exits: tuple[int, ...] = (2,)


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _cases(prefix: str, variants: dict[str, Any], make) -> list[Case]:
    return [Case(f"{prefix}: {cls}", tuple(str(a) for a in make(value))) for cls, value in variants.items()]


def input_paths(d: Path, ok: str, tiny: str, data: str, tok: str) -> list[Case]:
    """Each file argument of each verb, given each bad path."""
    html, new_db = str(d / "r.html"), str(d / "new.sqlite")
    prof = ["--device", "cpu", "--db", new_db]
    moe = ["--data", data, "--eval", data, "--tokenizer", tok]
    by_arg = {
        "estimate SCENARIO": (".yaml", lambda p: ["estimate", p]),
        "plan SCENARIO": (".yaml", lambda p: ["plan", p, "--gpus", "a100-80gb"]),
        "recommend SCENARIO": (".yaml", lambda p: ["recommend", p]),
        "profile SCENARIO": (".yaml", lambda p: ["profile", p, *prof]),
        "trace SCENARIO": (".yaml", lambda p: ["trace", p]),
        "study moe SCENARIO": (".yaml", lambda p: ["study", "moe", p, *moe]),
        "estimate --calibration": (".json", lambda p: ["estimate", ok, "--calibration", p]),
        "plan --calibration": (".json", lambda p: ["plan", ok, "--calibration", p]),
        "recommend --calibration": (".json", lambda p: ["recommend", ok, "--calibration", p]),
        "validate --calibration": (".json", lambda p: ["validate", "--calibration", p]),
        "validate --cases": (".yaml", lambda p: ["validate", "--cases", p]),
        "calibrate --cases": (".yaml", lambda p: ["calibrate", "--cases", p]),
        "report --cases": (".yaml", lambda p: ["report", "--cases", p, "--out", html]),
        "report --plan": (".json", lambda p: ["report", "--plan", p, "--no-cases", "--out", html]),
        "validate --db": (".sqlite", lambda p: ["validate", "--db", p]),
        "calibrate --db": (".sqlite", lambda p: ["calibrate", "--db", p]),
        "report --db": (".sqlite", lambda p: ["report", "--db", p, "--no-cases", "--out", html]),
        "profile --data": (".jsonl", lambda p: ["profile", tiny, *prof, "--data", p, "--tokenizer", tok]),
        "profile --tokenizer": (".json", lambda p: ["profile", tiny, *prof, "--data", data, "--tokenizer", p]),
        "profile --weights": ("", lambda p: ["profile", tiny, *prof, "--weights", p]),
        "study moe --data": (".jsonl", lambda p: ["study", "moe", tiny, "--data", p, "--eval", data, "--tokenizer", tok]),
        "study moe --eval": (".jsonl", lambda p: ["study", "moe", tiny, "--data", data, "--eval", p, "--tokenizer", tok]),
        "study moe --tokenizer": (".json", lambda p: ["study", "moe", tiny, "--data", data, "--eval", data, "--tokenizer", p]),
        "study moe --weights": ("", lambda p: ["study", "moe", tiny, *moe, "--weights", p]),
        "show MODEL": (".json", lambda p: ["show", p]),
        "scenario model:": (".json", lambda p: ["estimate", str(fx.write(d / "model-at" / f"{_digest(p)}.yaml",
                                                                         fx.scenario(model=p)))]),
    }
    out = []
    for arg, (ext, make) in by_arg.items():
        classes = fx.path_classes(d, ext)
        if arg.endswith("--db") or arg == "profile --weights":
            classes.pop("empty")  # an empty file is a new SQLite database / not a folder: covered elsewhere
        out += _cases(arg, classes, make)
    return out


def output_paths(d: Path, ok: str, tiny: str, data: str, tok: str) -> list[Case]:
    """Each output argument, given a place nothing can be written."""
    moe = ["study", "moe", tiny, "--data", data, "--eval", data, "--tokenizer", tok]
    files = {
        "plan --plot": (".png", lambda p: ["plan", ok, "--gpus", "a100-80gb", "--plot", p]),
        "recommend --plot": (".png", lambda p: ["recommend", ok, "--plot", p]),
        "profile --plot": (".svg", lambda p: ["profile", tiny, "--device", "cpu", "--db", str(d / "n.sqlite"), "--plot", p]),
        "study optimizations --plot": (".png", lambda p: ["study", "optimizations", "phi-2", "--seq-lens", "512", "--plot", p]),
        "report --out": (".html", lambda p: ["report", "--out", p, "--no-cases", "--plan", str(d / "missing.json")]),
        "calibrate --out": (".json", lambda p: ["calibrate", "--out", p]),
    }
    dirs = {
        "recommend --emit": lambda p: ["recommend", ok, "--emit", p],
        "profile --emit": lambda p: ["profile", tiny, "--device", "cpu", "--nproc", "2", "--db", str(d / "n.sqlite"), "--emit", p],
        "report --png": lambda p: ["report", "--no-cases", "--png", p, "--out", str(d / "r.html")],
        "study moe --out": lambda p: [*moe, "--out", p],
        "profile --db": lambda p: ["profile", tiny, "--device", "cpu", "--db", p],
    }
    out = []
    for arg, (ext, make) in files.items():
        out += _cases(arg, fx.output_classes(d, ext), make)
    for arg, make in dirs.items():
        out += _cases(arg, fx.dir_output_classes(d), make)
    return out


BAD_VALUES = {
    "mix.method a number": {"mix__method": 7}, "mix.method unknown": {"mix__method": "prefix"},
    "mix.lora_rank 1e9": {"mix__lora_rank": 10**9}, "mix.lora_rank NaN": {"mix__lora_rank": float("nan")},
    "mix.lora_rank a string": {"mix__lora_rank": "16"}, "mix.zero_stage true": {"mix__zero_stage": True},
    "mix.zero_stage 9": {"mix__zero_stage": 9}, "mix.gradient_checkpointing 'yes'": {"mix__gradient_checkpointing": "yes"},
    "mix.lora_targets empty": {"mix__lora_targets": []}, "mix.lora_targets a mapping": {"mix__lora_targets": {"a": 1}},
    "mix.experts_top_k on a dense model": {"mix__experts_top_k": 2}, "mix a list": {"mix": [1]},
    "fsdp and zero together": {"mix__fsdp": "full_shard", "mix__zero_stage": 3},
    "mix.nested_quant 'maybe'": {"mix__nested_quant": "maybe"},
    "torchtune QLoRA without nested quantization": {"framework": "torchtune", "mix__method": "qlora",
                                                    "mix__nested_quant": False},
    "micro_batch_size 0": {"workload__micro_batch_size": 0}, "micro_batch_size 1.5": {"workload__micro_batch_size": 1.5},
    "micro_batch_size inf": {"workload__micro_batch_size": float("inf")},
    "micro_batch_size 'auto'": {"workload__micro_batch_size": "auto"}, "seq_len 0": {"workload__seq_len": 0},
    "seq_len 1e12": {"workload__seq_len": 10**12}, "seq_len NaN": {"workload__seq_len": float("nan")},
    "epochs inf": {"workload__epochs": float("inf")}, "epochs -1": {"workload__epochs": -1},
    "padding unknown": {"workload__padding": "left"}, "gradient_accumulation 0": {"workload__gradient_accumulation": 0},
    "dataset NaN mean": {"workload__dataset": {"num_samples": 10, "mean_tokens": float("nan"), "max_tokens": 100}},
    "dataset mean over max": {"workload__dataset": {"num_samples": 10, "mean_tokens": 500, "max_tokens": 100}},
    "dataset a string": {"workload__dataset": "alpaca"}, "workload a string": {"workload": "x"},
    "gpus_per_node 0": {"hardware__gpus_per_node": 0}, "gpus_per_node 1e6": {"hardware__gpus_per_node": 10**6},
    "nodes -1": {"hardware__nodes": -1}, "gpu a number": {"hardware__gpu": 7}, "gpu a list": {"hardware__gpu": ["a"]},
    "gpu unknown": {"hardware__gpu": "a100-8gb"},
    "inline gpu with ~0 memory": {"hardware__gpu": {"base": "a100-80gb", "memory_gib": 0.001}},
    "inline gpu 1e-300 TFLOP/s": {"hardware__gpu": {"base": "a100-80gb", "fp16_tflops": 1e-300, "bf16_tflops": 1e-300}},
    "inline gpu infinite bandwidth": {"hardware__gpu": {"base": "a100-80gb", "memory_bandwidth_gbs": float("inf")}},
    "inline gpu missing rates": {"hardware__gpu": {"memory_gib": 24}},
    "inline gpu unknown key": {"hardware__gpu": {"base": "a100-80gb", "memory_gb": 24}},
    "inter_node_gbs NaN": {"hardware__inter_node_gbs": float("nan")}, "price -1": {"price__usd_per_gpu_hour": -1},
    "price inf": {"price__usd_per_gpu_hour": float("inf")}, "price a list": {"price": [1]},
    "unknown top key": {"modle": "x"}, "name a mapping": {"name": {"a": 1}},
    "model a mapping": {"model": {"name": "llama"}}, "model a list": {"model": ["llama-3.2-1b"]},
    "model a number": {"model": 7}, "model empty": {"model": ""}, "model 300 characters": {"model": "m" * 300},
    "model id with a 300-byte part": {"model": "org/" + "m" * 300}, "model with a NUL": {"model": "a\x00b"},
    "model ~unknown-user": {"model": "~no_such_user_ftscope/config.json"}, "model unknown": {"model": "llama-2-7"},
    "model an empty inline config": {"model": {}}, "model an inline config with NaN": {"model": {**fx.LLAMA, "hidden_size": float("nan")}},
    "framework unknown": {"framework": "trl-sftt"}, "framework a number": {"framework": 7},
    "mix.lora_dropout 1.5": {"mix__lora_dropout": 1.5}, "mix.lora_dropout NaN": {"mix__lora_dropout": float("nan")},
    "mix.loss unknown": {"mix__loss": "fused_ce"},
}


def scenario_values(d: Path) -> list[Case]:
    """One bad value in an otherwise valid scenario, through estimate (and a share through the other verbs)."""
    out = []
    verbs = [["estimate"], ["plan", "--gpus", "a100-80gb"], ["recommend"], ["trace"],
             ["profile", "--device", "cpu", "--db", str(d / "n.sqlite")]]
    for i, (name, changes) in enumerate(BAD_VALUES.items()):
        path = fx.write(d / "values" / f"{i:02d}.yaml", fx.scenario(**changes))
        verb = verbs[0] if i % 3 else verbs[(i // 3) % len(verbs)]
        out.append(Case(f"{verb[0]} SCENARIO: {name}", (verb[0], str(path), *verb[1:])))
    raw = {"nested 10,000 deep": "model: " + "[" * 10000 + "]" * 10000 + "\n", "billion laughs": fx.LOL + "model: x\n",
           "a list": "- 1\n- 2\n", "a number": "42\n", "python tag": "model: !!python/object:os.system [ls]\n",
           "unclosed bracket": "model: [llama\n", "tab indentation": "mix:\n\tmethod: lora\n",
           "complex key": "? [a, b]\n: 1\nmodel: llama-3.2-1b\n", "a date": "model: 2024-01-01\n",
           "duplicate sections, one bad": "mix: {method: lora}\nmix: {method: 7}\nmodel: llama-3.2-1b\n"}
    for name, text in raw.items():
        path = fx.write(d / "raw" / f"{_digest(name)}.yaml", text)
        out += [Case(f"{v} SCENARIO: {name}", (v, str(path))) for v in ("estimate", "plan", "recommend")]
    return out


def overrides(ok: str) -> list[Case]:
    bad = {"no '='": "mix.zero_stage", "empty key": "=3", "empty part": "mix..lora_rank=4", "100 parts deep":
           ".".join(["a"] * 100) + "=1", "unclosed list": "mix.lora_targets=[q_proj", "model a mapping": "model={a: 1}",
           "rank 1e999": "mix.lora_rank=1e999", "seq NaN": "workload.seq_len=.nan", "a section a number": "mix=3",
           "billion laughs": "mix.lora_targets=" + "[&a [x,x,x,x,x,x,x,x,x], " + ", ".join(
               f"&{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)) + "]",
           "model 300 bytes": "model=" + "x" * 300, "gpu ~0 memory": "hardware.gpu.memory_gib=0.01",
           "dataset path only": "workload.dataset.path=x.jsonl", "unknown key": "mix.zero_stag=2",
           "a 10,000-deep value": "mix.lora_targets=" + "[" * 10000 + "]" * 10000}
    return [Case(f"{verb} OVERRIDE: {name}", (verb, ok, text)) for verb in ("estimate", "plan") for name, text in bad.items()]


def config_files(d: Path) -> list[Case]:
    out = []
    for i, (name, path) in enumerate(fx.configs(d).items()):
        scn = fx.write(d / "cfgscn" / f"{i:02d}.yaml", fx.scenario(model=str(path)))
        out.append(Case(f"estimate config.json: {name}", ("estimate", str(scn))))
        if i % 4 == 0:
            out.append(Case(f"show config.json: {name}", ("show", str(path))))
            out.append(Case(f"trace config.json: {name}", ("trace", str(scn))))
    return out


def calibrations(d: Path, ok: str) -> list[Case]:
    bad = {"a list": [1], "shared a number": {"shared": 7}, "matmul 0": {"shared": {"matmul": 0}},
           "matmul -1": {"shared": {"matmul": -1}}, "matmul NaN": {"shared": {"matmul": float("nan")}},
           "matmul a string": {"shared": {"matmul": "fast"}}, "bandwidth 5": {"shared": {"bandwidth": 5}},
           "unknown parameter": {"shared": {"matmull": 0.5}}, "per_gpu a list": {"per_gpu": [1]},
           "per_gpu NaN": {"per_gpu": {"a100-80gb": {"attention": float("nan")}}},
           "per_gpu negative floor": {"per_gpu": {"a100-80gb": {"kernel_floor_us": -3}}},
           "provenance a number": {"provenance": 7}, "step overhead 1e300": {"shared": {"step_overhead_s": 1e300}},
           "unknown top key": {"shraed": {}}}
    out = []
    for i, (name, data) in enumerate(bad.items()):
        path = fx.write(d / "cal" / f"{i:02d}.json", data)
        verb = ("estimate", ok) if i % 2 else ("validate",)
        out.append(Case(f"{verb[0]} --calibration: {name}", (*verb, "--calibration", str(path))))
    out.append(Case("estimate --calibration: Infinity token",
                    ("estimate", ok, "--calibration", str(fx.write(d / "cal" / "inf.json", '{"shared": {"matmul": Infinity}}')))))
    return out


def case_files(d: Path) -> list[Case]:
    scn = fx.scenario()
    good = {"id": "x-1", "scenario": scn, "measured": {"peak_gib": 10}}
    bad = {"not a mapping": [good], "no cases key": {"other": []}, "cases a mapping": {"cases": good},
           "case without id": {"cases": [{"scenario": scn, "measured": {}}]}, "id a number": {"cases": [{**good, "id": 7}]},
           "scenario a list": {"cases": [{**good, "scenario": [1]}]}, "measured a list": {"cases": [{**good, "measured": [1]}]},
           "unknown metric": {"cases": [{**good, "measured": {"peak_gb": 3}}]},
           "figure 0": {"cases": [{**good, "measured": {"peak_gib": 0}}]},
           "figure NaN": {"cases": [{**good, "measured": {"peak_gib": float("nan")}}]},
           "figure -3": {"cases": [{**good, "measured": {"tokens_per_s": -3}}]},
           "figure inf": {"cases": [{**good, "measured": {"step_s": float("inf")}}]},
           "figure a string": {"cases": [{**good, "measured": {"step_s": "fast"}}]},
           "batch key a word": {"cases": [{**good, "measured": {"samples_per_s_by_batch": {"one": 1.0}}}]},
           "by-batch figure 0": {"cases": [{**good, "measured": {"samples_per_s_by_batch": {1: 0}}}]},
           "stage negative": {"cases": [{**good, "measured": {"step_s_by_top_k_and_batch": {"top2": {1: {"forward": -1}}}}}]},
           "top-k key garbage": {"cases": [{**good, "measured": {"max_micro_batch_size_by_top_k": {"two": 3}}}]},
           "memory metric unknown": {"cases": [{**good, "measured": {"peak_gib": 3, "memory_metric": "gb"}}]},
           "duplicate id": {"cases": [good, good]}, "bad scenario": {"cases": [{**good, "scenario": {**scn, "mix": {"method": 7}}}]},
           "max batch 0": {"cases": [{**good, "measured": {"max_micro_batch_size": 0}}]},
           "ladder pair of three": {"cases": [{**good, "measured": {"ladder_peak_active_gib_and_tokens_per_s": {"a": [1, 2, 3]}}}]}}
    out = []
    for i, (name, data) in enumerate(bad.items()):
        path = fx.write(d / "cases" / f"{i:02d}.yaml", data)
        verb = ("validate", "--cases", str(path)) if i % 3 else ("calibrate", "--cases", str(path))
        out.append(Case(f"{verb[0]} --cases: {name}", verb))
    for name, text in {"billion laughs": fx.LOL + "cases: []\n", "nested 10,000 deep": "cases: " + "[" * 10000 + "]" * 10000}.items():
        path = fx.write(d / "cases" / f"{name[:4]}.yaml", text)
        out.append(Case(f"validate --cases: {name}", ("validate", "--cases", str(path))))
    return out


def plan_files(d: Path) -> list[Case]:
    row = {"label": "m | 1x a100 | lora", "memory": {"fits": True, "breakdown_gib": {"weights": 1.0}, "capacity_gib": 79.5},
           "scenario": {"hardware": {"gpu": "a100-80gb", "gpus_per_node": 1}}, "run": {"hours": 1.0, "usd": 2.0},
           "time": {"breakdown_s": {"forward": 0.1}}}
    bad = {"a list": [row], "no rows": {}, "rows a number": {"rows": 7}, "rows empty": {"rows": []},
           "a row a number": {"rows": [7]}, "row without memory": {"rows": [{**row, "memory": None}]},
           "fits 'yes'": {"rows": [{**row, "memory": {**row["memory"], "fits": "yes"}}]},
           "hours -1": {"rows": [{**row, "run": {"hours": -1, "usd": 1}}]},
           "breakdown negative": {"rows": [{**row, "memory": {**row["memory"], "breakdown_gib": {"weights": -4}}}]},
           "breakdown NaN": {"rows": [{**row, "time": {"breakdown_s": {"forward": float("nan")}}}]},
           "label a number": {"rows": [{**row, "label": 7}]}, "gpus_per_node 0": {"rows": [{**row, "scenario": {
               "hardware": {"gpu": "a100-80gb", "gpus_per_node": 0}}}]}}
    out = []
    for i, (name, data) in enumerate(bad.items()):
        path = fx.write(d / "plans" / f"{i:02d}.json", data)
        out.append(Case(f"report --plan: {name}", ("report", "--plan", str(path), "--no-cases", "--out", str(d / "r.html"))))
    deep = fx.write(d / "plans" / "deep.json", '{"rows": ' + "[" * 10000 + "]" * 10000 + "}")
    out.append(Case("report --plan: nested 10,000 deep", ("report", "--plan", str(deep), "--no-cases", "--out", str(d / "r.html"))))
    return out


def store_files(d: Path, tiny: str) -> list[Case]:
    readers = {"validate --db": lambda p: ["validate", "--db", p],
               "report --db": lambda p: ["report", "--db", p, "--no-cases", "--out", str(d / "r.html")],
               "calibrate --db": lambda p: ["calibrate", "--db", p],
               "profile --db": lambda p: ["profile", tiny, "--device", "cpu", "--db", p]}
    out = []
    for arg, make in readers.items():
        for cls, path in fx.stores(d).items():
            if cls == "tampered rows":
                if arg in ("validate --db", "report --db"):
                    # damaged rows are listed as not compared / left out of the charts: a result, exit 0
                    out.append(Case(f"{arg}: {cls}", tuple(make(path)), (0,)))
            elif not (cls == "empty file" and arg == "profile --db"):  # an empty file is a new store to a writer
                out.append(Case(f"{arg}: {cls}", tuple(make(path))))
    return out


def options(d: Path, ok: str, tiny: str, data: str, tok: str) -> list[Case]:
    moe = ["study", "moe", tiny, "--data", data, "--eval", data, "--tokenizer", tok]
    prof = ["profile", tiny, "--device", "cpu", "--db", str(d / "n.sqlite")]
    bad = {
        "estimate --margin 1.5": ["estimate", ok, "--margin", "1.5"], "estimate --margin nan": ["estimate", ok, "--margin", "nan"],
        "estimate --margin -0.1": ["estimate", ok, "--margin", "-0.1"], "estimate --margin abc": ["estimate", ok, "--margin", "abc"],
        "estimate unknown option": ["estimate", ok, "--fast"], "estimate no scenario": ["estimate"],
        "unknown verb": ["estimat", ok], "plan --counts a": ["plan", ok, "--counts", "a"],
        "plan --counts 0": ["plan", ok, "--counts", "0"], "plan --counts 1e6": ["plan", ok, "--counts", "1000000"],
        "plan --counts empty": ["plan", ok, "--counts", ","], "plan --max-gpus 0": ["plan", ok, "--max-gpus", "0"],
        "plan --nodes 0": ["plan", ok, "--nodes", "0"], "plan --by speed": ["plan", ok, "--by", "speed"],
        "plan --gpus unknown": ["plan", ok, "--gpus", "a100-8gb"], "plan --nodes 1e9": ["plan", ok, "--nodes", "1000000000"],
        "recommend --by cheap": ["recommend", ok, "--by", "cheap"], "recommend --top 0": ["recommend", ok, "--top", "0"],
        "recommend --budget-usd nan": ["recommend", ok, "--budget-usd", "nan"],
        "recommend --budget-usd -5": ["recommend", ok, "--budget-usd", "-5"],
        "recommend --deadline-hours inf": ["recommend", ok, "--deadline-hours", "inf"],
        "recommend --gpus a100-80gb:0": ["recommend", ok, "--gpus", "a100-80gb:0"],
        "recommend --gpus a100-80gb:x": ["recommend", ok, "--gpus", "a100-80gb:x"],
        "recommend --gpus unknown": ["recommend", ok, "--gpus", "b200x:4"],
        "trace --batch 1e6": ["trace", ok, "--batch", "1e6"], "trace --seq 1e6": ["trace", ok, "--seq", "1e6"],
        "trace --batch 1000000 --seq 1000000": ["trace", ok, "--batch", "1000000", "--seq", "1000000"],
        "trace --batch 0": ["trace", ok, "--batch", "0"], "trace --seq -1": ["trace", ok, "--seq", "-1"],
        "trace --seq 10000000": ["trace", ok, "--seq", "10000000"], "trace --shrink bad": ["trace", ok, "--shrink", "layers=x"],
        "trace --shrink unknown key": ["trace", ok, "--shrink", "depth=2"], "trace --shrink superscript": ["trace", ok, "--shrink", "layers=\u00b2"],
        "profile --steps 0": [*prof, "--steps", "0"], "profile --warmup -1": [*prof, "--warmup", "-1"],
        "profile --batch-sizes x": [*prof, "--batch-sizes", "x"], "profile --batch-sizes 0": [*prof, "--batch-sizes", "0"],
        "profile --batch-sizes 1e9": [*prof, "--batch-sizes", "1000000000"],
        "profile --memory-cap-gib 0": [*prof, "--memory-cap-gib", "0"], "profile --memory-cap-gib nan": [*prof, "--memory-cap-gib", "nan"],
        "profile --device tpu": [*prof, "--device", "tpu"], "profile --nproc 0": [*prof, "--nproc", "0"],
        "profile --node-rank 3 of 1": [*prof, "--node-rank", "3"], "profile --timeout 0": [*prof, "--timeout", "0"],
        "profile --data without --tokenizer": [*prof, "--data", data], "profile --shrink layers=0": [*prof, "--shrink", "layers=0"],
        "profile --weights with --nproc 2": [*prof, "--nproc", "2", "--weights", str(d / "afolder")],
        "study optimizations unknown model": ["study", "optimizations", "llama-2-7"],
        "study optimizations --gpu unknown": ["study", "optimizations", "phi-2", "--gpu", "z100"],
        "study optimizations --gpus 0": ["study", "optimizations", "phi-2", "--gpus", "0"],
        "study optimizations --seq-lens x": ["study", "optimizations", "phi-2", "--seq-lens", "x"],
        "study optimizations --seq-lens 0": ["study", "optimizations", "phi-2", "--seq-lens", "0"],
        "study optimizations --seq-lens 1e12": ["study", "optimizations", "phi-2", "--seq-lens", "1000000000000"],
        "study moe on a dense model": ["study", "moe", ok, *moe[3:]], "study moe --epochs 0": [*moe, "--epochs", "0"],
        "study moe --top-k x": [*moe, "--top-k", "x"], "study moe --lr nan": [*moe, "--lr", "nan"],
        "study moe --lr -1": [*moe, "--lr", "-1"], "study moe --batch-size 0": [*moe, "--batch-size", "0"],
        "study moe --device tpu": [*moe, "--device", "tpu"], "study moe --seed -1": [*moe, "--seed", "-1"],
        "study moe --memory-cap-gib inf": [*moe, "--memory-cap-gib", "inf"], "study moe no --data": moe[:3],
        "show --lora-rank 0": ["show", "phi-2", "--lora-rank", "0"], "show unknown": ["show", "llama-2-7"],
        "show empty": ["show", ""], "show a 300-byte name": ["show", "x" * 300],
        "calibrate --baseline xyz": ["calibrate", "--baseline", "xyz"],
        "report nothing to report": ["report", "--no-cases", "--out", str(d / "r.html")],
        "models extra argument": ["models", "x"], "gpus --json=1": ["gpus", "--json=1"],
        "serve --port 70000": ["serve", "--port", "70000"], "serve --port -1": ["serve", "--port", "-1"],
        "serve --db missing": ["serve", "--db", str(d / "missing.sqlite")], "serve --db a folder": ["serve", "--db", str(d)],
        "serve --db a text file": ["serve", "--db", str(d / "afile.txt")],
        "validate --corpus --source unknown": ["validate", "--corpus", "--source", "no-such-source"],
        "calibrate --cv unknown": ["calibrate", "--cv", "everything"],
    }
    return [Case(name, tuple(argv)) for name, argv in bad.items()]


def odd_but_valid(d: Path) -> list[Case]:
    """Accepted, with a stated warning or as a plain result: the output must hold no NaN, inf or negative figure."""
    long_ctx = fx.write(d / "odd" / "long.yaml", fx.scenario(model="llama-2-7b", workload__seq_len=200_000))
    slow = fx.write(d / "odd" / "slow.yaml", fx.scenario(hardware__gpu={"base": "a100-80gb", "bf16_tflops": 0.1,
                                                                        "fp16_tflops": 0.1, "memory_bandwidth_gbs": 10}))
    small = fx.write(d / "odd" / "small.yaml", fx.scenario(hardware__gpu={"base": "a100-80gb", "memory_gib": 1}))
    cfg = fx.write(d / "odd" / "short" / "config.json", {**fx.LLAMA, "max_position_embeddings": 128})
    short = fx.write(d / "odd" / "short.yaml", fx.scenario(model=str(cfg)))
    cal = fx.write(d / "odd" / "empty-cal.json", {})
    out = [Case(f"estimate --json: {name}", ("estimate", str(p), "--json"), (0,))
           for name, p in (("seq past max positions", long_ctx), ("slow inline gpu", slow), ("1 GiB gpu", small),
                           ("seq past a config's max positions", short))]
    out += [Case("estimate: seq past max positions (table)", ("estimate", str(long_ctx)), (0,)),
            Case("plan --json: 1 GiB gpu", ("plan", str(small), "--json"), (0,)),
            Case("estimate --calibration: empty object", ("estimate", str(short), "--calibration", str(cal), "--json"), (0,)),
            Case("estimate --check: does not fit", ("estimate", str(small), "--check"), (1,))]
    return out


def build(d: Path) -> list[Case]:
    """Write every fixture under `d`; return every case."""
    d.mkdir(parents=True, exist_ok=True)
    ok = str(fx.write(d / "ok.yaml", fx.scenario()))
    # verbs that build a model get the tiny one: a case that slipped past the checks costs seconds, not an hour
    tiny = str(fx.ROOT / "examples" / "tiny-mixtral.yaml")
    data = str(fx.write(d / "small.jsonl", "".join(f'{{"prompt": "what is {i} + 1", "answer": "{i + 1}"}}\n'
                                                     for i in range(4))))
    tok = str(fx.DEMO / "tokenizer.json")
    return [*input_paths(d, ok, tiny, data, tok), *output_paths(d, ok, tiny, data, tok), *scenario_values(d),
            *overrides(ok), *config_files(d), *calibrations(d, ok), *case_files(d), *plan_files(d),
            *store_files(d, tiny), *options(d, ok, tiny, data, tok), *odd_but_valid(d)]
