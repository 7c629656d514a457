"""The HF config.json a real model is built from: the scenario's (a bundled preset or its file), and smaller
copies of it (`--shrink`) that transformers still builds and that exercise the same code paths."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from ... import catalog
from ...errors import FtscopeError
from ...spec.architecture import ALIASES, TRANSFORMERS_FAMILIES
from ...spec.scenario import Scenario


def scenario_config(scn: Scenario) -> dict[str, Any]:
    """The HF config.json dict of the scenario's model: a bundled preset, or the config file it was read from."""
    spec = scn.model
    if spec.arch.model_type not in TRANSFORMERS_FAMILIES:
        raise FtscopeError(f"{spec.name} ({spec.arch.model_type}) is not traceable: no transformers implementation")
    for ref in (scn.model_ref, spec.name):
        preset = catalog.resolve_model_name(ref) if ref else None
        if preset is not None:
            return copy.deepcopy(catalog.model_config(preset))
    for ref in (spec.source, spec.name, scn.model_ref):
        path = Path(ref).expanduser() if ref else None
        if path is not None and path.exists():
            path = path / "config.json" if path.is_dir() else path
            try:
                return json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as exc:
                raise FtscopeError(f"cannot read the model config {path}: {exc}") from None
    raise FtscopeError(f"cannot find the config.json of model '{spec.name}' to build it")


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The language model's part of a config (multimodal wrappers keep it in text_config), not a copy."""
    return cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg


def first_key(cfg: dict[str, Any], field_name: str) -> str | None:
    return next((k for k in ALIASES[field_name] if cfg.get(k) is not None), None)


def _round_to(x: float, multiple: int, minimum: int) -> int:
    return max(minimum, int(round(x / multiple)) * multiple)


def _shrink_width(c: dict[str, Any], hidden: int) -> None:
    """Hidden size, heads (keeping queries per KV head), head_dim and every width that scales with hidden."""
    h_key = first_key(c, "hidden_size") or "hidden_size"
    old_h = int(c[h_key])
    if hidden == old_h:
        return
    ratio = hidden / old_h
    heads_key = first_key(c, "num_heads")
    kv_key = first_key(c, "num_kv_heads")
    heads = int(c[heads_key]) if heads_key else 1
    kv = int(c[kv_key]) if kv_key else (1 if c.get("multi_query") and not c.get("new_decoder_architecture") else heads)
    group = max(1, heads // max(kv, 1))
    old_hd = int(c.get("head_dim") or old_h // heads)
    new_heads = max(group, (hidden // old_hd) // group * group)
    while new_heads > group and hidden % new_heads:   # hidden must split evenly into heads
        new_heads -= group
    hd = max(2, hidden // new_heads // 2 * 2)         # even: RoPE rotates pairs
    hidden = new_heads * hd                            # rounded when no head count divides it (Falcon-180B)
    prf = c.get("partial_rotary_factor")
    if prf:                                            # phi: the rotary part must be even as well
        c["partial_rotary_factor"] = max(2, int(hd * prf) // 2 * 2) / hd
    c[h_key] = hidden
    if heads_key:
        c[heads_key] = new_heads
    if kv_key:
        c[kv_key] = max(1, new_heads // group)
    if "head_dim" in c and c["head_dim"] is not None:
        c["head_dim"] = hd
    if c.get("query_pre_attn_scalar"):
        c["query_pre_attn_scalar"] = hd
    for key in ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim", "moe_intermediate_size",
                "shared_expert_intermediate_size", "expert_intermediate_size", "intermediate_size_mlp"):
        if c.get(key):
            c[key] = _round_to(c[key] * ratio, 16, 32)
    for key in ("q_lora_rank", "kv_lora_rank"):
        if c.get(key):
            c[key] = _round_to(c[key] * ratio, 16, 16)
    for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if c.get(key):
            c[key] = _round_to(c[key] * min(1.0, 4 * ratio), 8, 8)


def _shrink_experts(c: dict[str, Any], experts: int) -> None:
    e_key = first_key(c, "num_experts")
    if e_key is None:
        return
    c[e_key] = experts
    k_key = first_key(c, "top_k")
    if k_key is not None:
        c[k_key] = min(int(c[k_key]), experts)
    if c.get("n_group"):  # DeepSeek group-limited routing: groups must divide the experts
        c["n_group"], c["topk_group"] = 1, 1


def _shrink_layers(c: dict[str, Any], layers: int) -> None:
    l_key = first_key(c, "num_layers") or "num_hidden_layers"
    c[l_key] = layers
    if c.get("first_k_dense_replace"):
        c["first_k_dense_replace"] = min(int(c["first_k_dense_replace"]), max(layers - 1, 0))
    if c.get("mlp_only_layers"):
        c["mlp_only_layers"] = [i for i in c["mlp_only_layers"] if i < layers]
    if c.get("decoder_sparse_step") and int(c["decoder_sparse_step"]) > layers:
        c["decoder_sparse_step"] = 1
    if c.get("max_window_layers"):
        c["max_window_layers"] = min(int(c["max_window_layers"]), layers)
    for key in ("layer_types", "mamba_moe_layers", "no_rope_layers"):
        if isinstance(c.get(key), list):
            c[key] = c[key][:layers]
    if isinstance(c.get("moe_layers"), list):
        c["moe_layers"] = [i for i in c["moe_layers"] if i < layers]


def _shrink_vocab(c: dict[str, Any], vocab: int) -> None:
    v_key = first_key(c, "vocab_size") or "vocab_size"
    c[v_key] = vocab
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        tok = c.get(key)
        if isinstance(tok, int) and tok >= vocab:
            c[key] = vocab - 1
        elif isinstance(tok, list):
            c[key] = [min(t, vocab - 1) for t in tok]


def shrink_config(cfg: dict[str, Any], layers: int | None = None, hidden: int | None = None,
                  experts: int | None = None, vocab: int | None = None,
                  intermediate: int | None = None) -> dict[str, Any]:
    """A smaller copy of an HF config that transformers still builds: heads, KV heads, head_dim, MLP/expert
    widths and MLA ranks are scaled with `hidden`; top-k stays <= experts; layer lists stay in range.

    Keeps the grouping of query heads per KV head and the per-family structure (shared experts, dense first
    layers, parallel blocks), so a shrunk model exercises the same code paths as the full one.
    """
    if isinstance(cfg.get("text_config"), dict):
        out = copy.deepcopy(cfg)
        out["text_config"] = shrink_config(cfg["text_config"], layers, hidden, experts, vocab, intermediate)
        return out
    c = copy.deepcopy(cfg)
    if hidden is not None:
        _shrink_width(c, hidden)
    if intermediate is not None:
        for key in ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim"):
            if c.get(key):
                c[key] = intermediate
    if experts is not None:
        _shrink_experts(c, experts)
    if layers is not None:
        _shrink_layers(c, layers)
    if vocab is not None:
        _shrink_vocab(c, vocab)
    return c


_SHRINK_ARGS = {"layers", "hidden", "experts", "vocab", "intermediate"}
_SHRINK_ALIASES = {"num_layers": "layers", "hidden_size": "hidden", "num_experts": "experts", "vocab_size": "vocab"}


def apply_shrink(cfg: dict[str, Any], shrink: dict[str, Any] | None) -> dict[str, Any]:
    """`shrink` as shrink_config keywords (layers=, hidden=, ...) or config keys; config keys that name a size
    (num_hidden_layers, hidden_size, num_local_experts, vocab_size, ...) go through shrink_config so the rest of
    the config follows; any other key overrides the config verbatim."""
    if not shrink:
        return copy.deepcopy(cfg)
    args: dict[str, Any] = {}
    raw: dict[str, Any] = {}
    for key, value in shrink.items():
        if key in _SHRINK_ARGS:
            args[key] = value
            continue
        field_name = next((f for f, keys in ALIASES.items() if key in keys and f in _SHRINK_ALIASES), None)
        if field_name is not None:
            args[_SHRINK_ALIASES[field_name]] = value
        else:
            raw[key] = value
    out = shrink_config(cfg, **args)
    out.update(raw)
    return out
