"""The model a corpus point trained: a bundled preset, or a config built from the architecture the source lists."""
from __future__ import annotations

from typing import Any, Mapping

from ... import catalog
from ...spec.frameworks.models import SAME_ARCHITECTURE


def preset(name: Any) -> tuple[str | None, str]:
    """(preset name or None, note) for a corpus model name; the part before ' (' is what is looked up."""
    raw = str(name).split(" (")[0].strip()
    for candidate in (raw, raw.lower()):
        found = catalog.resolve_model_name(candidate)
        if found:
            return found, ""
    same = SAME_ARCHITECTURE.get(raw.lower())
    if same and catalog.resolve_model_name(same):
        return same, f"{raw} has the blocks of {same}"
    return None, ""


def mpt_config(fields: Mapping[str, Any], seq_len: int) -> dict[str, Any]:
    """An HF-style config for llm-foundry's MPT from the corpus's architecture fields.

    MPT's block is a fused QKV attention and a plain GELU MLP, LayerNorms with bias, biases everywhere, tied
    embeddings, one after the other: exactly the matrices of the falcon family's sequential (non-parallel)
    layout, which is how it is expressed here. The learned position embedding (seq_len x d_model) is not a
    matmul and is left out (0.1 % of the parameters of MPT-7B at 2048)."""
    d = int(fields["d_model"])
    return {"model_type": "falcon", "_name_or_path": "mpt", "hidden_size": d,
            "num_attention_heads": int(fields["n_heads"]), "num_hidden_layers": int(fields["n_layers"]),
            "intermediate_size": int(fields["expansion_ratio"]) * d, "vocab_size": int(fields["vocab_size"]),
            "bias": bool(fields.get("bias", True)), "parallel_attn": False, "new_decoder_architecture": False,
            "tie_word_embeddings": bool(fields.get("tied_embeddings", True)), "max_position_embeddings": seq_len}
