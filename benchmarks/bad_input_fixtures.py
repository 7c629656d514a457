"""Fixture files for the bad-input suite (benchmarks/bad_inputs.py): every way a named file can be wrong.

Each function writes its files under a folder it is given (a temporary one) and returns {class: path}.
"""
from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "data" / "moe-demo"
TINY_MOE = ROOT / "examples" / "tiny-mixtral" / "config.json"
LLAMA = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=96, vocab_size=256, max_position_embeddings=4096)
LOL = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))


def write(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    elif isinstance(data, str):
        path.write_text(data)
    elif path.suffix == ".json":
        path.write_text(json.dumps(data))  # NaN / Infinity written as JSON's non-standard tokens on purpose
    else:
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def scenario(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"model": "llama-3.2-1b", "hardware": {"gpu": "a100-80gb"},
                            "mix": {"method": "lora", "attention": "sdpa"},
                            "workload": {"micro_batch_size": 1, "seq_len": 256, "num_samples": 100}}
    for path, value in changes.items():
        node = base
        *parents, last = path.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return base


# ---- path classes: one fixture per way a named file can be wrong ------------------------------------------

def path_classes(d: Path, ext: str) -> dict[str, str]:
    """Bad paths for an input file with suffix `ext`."""
    (d / "afolder").mkdir(exist_ok=True)
    write(d / "afile.txt", "x")
    huge = d / f"huge{ext}"
    if not huge.exists():
        with open(huge, "wb") as fh:
            fh.truncate(17 * 2**20)
    return {
        "name over 255 bytes": str(d / ("L" * 300 + ext)),
        "missing": str(d / f"missing{ext}"),
        "a folder": str(d / "afolder"),
        "/dev/null": "/dev/null",
        "not UTF-8": str(write(d / f"latin1{ext}", b"model: caf\xe9\nname: \xff\xfe\n")),
        "unreadable": "/proc/1/mem",
        "under a file": str(d / "afile.txt" / f"x{ext}"),
        "empty": str(write(d / f"empty{ext}", "")),
        "binary": str(write(d / f"binary{ext}", bytes(range(256)) * 8)),
        "17 MiB": str(huge),
    }


def output_classes(d: Path, ext: str) -> dict[str, str]:
    (d / "outfolder").mkdir(exist_ok=True)
    write(d / "afile.txt", "x")
    return {"a folder": str(d / "outfolder"), "under a file": str(d / "afile.txt" / f"out{ext}"),
            "name over 255 bytes": str(d / ("L" * 300 + ext)), "read-only place": f"/sys/ftscope-out{ext}",
            **({"wrong suffix": str(d / "plot.txt")} if ext in (".png", ".svg") else {})}


def dir_output_classes(d: Path) -> dict[str, str]:
    write(d / "afile.txt", "x")
    return {"a file": str(d / "afile.txt"), "under a file": str(d / "afile.txt" / "sub"),
            "name over 255 bytes": str(d / ("L" * 300)), "read-only place": "/sys/ftscope-outdir"}


# ---- fixture builders ----------------------------------------------------------------------------------------

def stores(d: Path) -> dict[str, str]:
    """Databases that are not (usable) ftscope stores."""
    import sys
    sys.path.insert(0, str(ROOT / "src"))
    from ftscope.measure.store import Store

    out = {"text file": str(write(d / "notdb.sqlite", "hello, not a database\n")),
           "empty file": str(write(d / "empty.sqlite", b""))}  # folders, /dev/null, ...: the path classes
    foreign = d / "foreign.sqlite"
    if not foreign.exists():
        with sqlite3.connect(foreign) as db:
            db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
            db.execute("INSERT INTO users (name) VALUES ('ada')")
    out["someone else's database"] = str(foreign)
    newer = d / "newer.sqlite"
    if not newer.exists():
        Store(newer).close()
        with sqlite3.connect(newer) as db:
            db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    out["newer schema"] = str(newer)
    raw = write(d / "corrupt.sqlite", b"SQLite format 3\x00" + bytes(84) + b"\xff" * 4000)
    out["corrupt"] = str(raw)
    out["tampered rows"] = str(_tampered(d / "tampered.sqlite", Store))
    return out


def _tampered(path: Path, store_cls: Any) -> Path:
    """An ftscope store whose rows were edited by hand: broken JSON, wrong types, negative and missing figures."""
    if path.exists():
        return path
    scn = {"scenario": {"model": str(TINY_MOE), "mix": {"method": "full", "precision": "fp32", "attention": "sdpa"},
                        "workload": {"micro_batch_size": 1, "seq_len": 32}},
           "options": {"device": "cpu"}, "build": {"config": json.loads(TINY_MOE.read_text())}}
    with store_cls(path) as st:
        run = st.start_run(scn, {"device": "cpu"})
        st.record_point(run, "batch=1", "ok", {"batch": "one", "memory": {"peak_allocated_bytes": -5}})
        st.record_point(run, "batch=2", "ok", {"batch": 2, "memory": {"peak_allocated_bytes": 3}})
        st.record_point(run, "batch=3", "ok", {"batch": 3})
        st.record_point(run, "batch=4", "ok", {"batch": 4, "forward_s": -1.0, "backward_s": "x", "optimizer_s": None,
                                               "samples_per_s": -3, "memory": {"peak_allocated_bytes": 100}})
        st.start_run({"scenario": "not a scenario", "options": 7}, {"device": "cpu"})
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO runs (created, updated, scenario_hash, scenario, environment, status)"
                   " VALUES ('x', 'x', 'h', '{not json', '[]', 'done')")
        db.execute("UPDATE points SET measurement = '{\"batch\": 5, ' WHERE key = 'batch=3'")
    return path


def configs(d: Path) -> dict[str, Path]:
    """config.json files a user might point `model:` at, each wrong in one way."""
    bad: dict[str, Any] = {
        "hidden_size NaN": {**LLAMA, "hidden_size": float("nan")}, "hidden_size Infinity": {**LLAMA, "hidden_size": float("inf")},
        "hidden_size string": {**LLAMA, "hidden_size": "64"}, "hidden_size list": {**LLAMA, "hidden_size": [64]},
        "hidden_size -1": {**LLAMA, "hidden_size": -1}, "hidden_size 0": {**LLAMA, "hidden_size": 0},
        "hidden_size 64.5": {**LLAMA, "hidden_size": 64.5}, "heads 0": {**LLAMA, "num_attention_heads": 0},
        "heads list": {**LLAMA, "num_attention_heads": [8]}, "heads do not divide hidden": {**LLAMA, "num_attention_heads": 7, "num_key_value_heads": 7},
        "kv heads do not divide heads": {**LLAMA, "num_key_value_heads": 3}, "layers 1e30": {**LLAMA, "num_hidden_layers": 10**30},
        "vocab missing": {k: v for k, v in LLAMA.items() if k != "vocab_size"}, "max positions NaN": {**LLAMA, "max_position_embeddings": float("nan")},
        "max positions -5": {**LLAMA, "max_position_embeddings": -5}, "head_dim 0": {**LLAMA, "head_dim": 0},
        "head_dim -1": {**LLAMA, "head_dim": -1}, "head_dim string": {**LLAMA, "head_dim": "x"},
        "q_lora_rank string": {**LLAMA, "model_type": "deepseek_v2", "q_lora_rank": "big", "kv_lora_rank": 16,
                               "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8},
        "experts list": {**LLAMA, "model_type": "mixtral", "num_local_experts": [4], "num_experts_per_tok": 2},
        "top-k over experts": {**LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 9},
        "experts NaN": {**LLAMA, "model_type": "mixtral", "num_local_experts": float("nan"), "num_experts_per_tok": 2},
        "layer list a string": {**LLAMA, "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": "0,1"},
        "layer list of strings": {**LLAMA, "model_type": "qwen2_moe", "num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": ["a"]},
        "mamba layers garbage": {"model_type": "blackmamba", "hidden_size": 64, "num_layers": 2, "vocab_size": 256,
                                 "mamba_moe_layers": ["r", "x"]},
        "mamba layers a number": {"model_type": "blackmamba", "hidden_size": 64, "num_layers": 2, "vocab_size": 256,
                                  "mamba_moe_layers": 7},
        "text_config a number": {**LLAMA, "text_config": 7, "hidden_size": None},
        "model_type a number": {**LLAMA, "model_type": 7}, "model_type unknown": {**LLAMA, "model_type": "gpt_bigcode"},
        "model_type missing": {k: v for k, v in LLAMA.items() if k != "model_type"}, "a JSON list": [LLAMA],
        "architectures garbage": {**{k: v for k, v in LLAMA.items() if k != "model_type"}, "architectures": [7]},
        "sliding_window string": {**LLAMA, "sliding_window": "wide"}, "tie a string": {**LLAMA, "tie_word_embeddings": "yes"},
    }
    out = {name: write(d / "configs" / f"{i:02d}" / "config.json", cfg) for i, (name, cfg) in enumerate(bad.items())}
    out["1e400"] = write(d / "configs" / "big" / "config.json", json.dumps(LLAMA)[:-1] + ', "rope_theta": 1e400}')
    out["nested 10,000 deep"] = write(d / "configs" / "deep" / "config.json", "[" * 10000 + "]" * 10000)
    out["not UTF-8"] = write(d / "configs" / "latin1" / "config.json", b'{"model_type": "llama\xe9"}')
    out["empty"] = write(d / "configs" / "empty" / "config.json", "")
    out["truncated"] = write(d / "configs" / "trunc" / "config.json", json.dumps(LLAMA)[:40])
    (d / "configs" / "noconfig").mkdir(parents=True, exist_ok=True)
    out["folder without config.json"] = d / "configs" / "noconfig"
    return out

