"""The model a corpus point trained: a bundled preset, or a config built from the architecture the source lists."""
from __future__ import annotations

from typing import Any, Mapping

from ... import catalog

SAME_ARCHITECTURE = {
    "llama-3-8b": "llama-3.1-8b", "meta-llama/meta-llama-3-8b": "llama-3.1-8b",
    "llama-3-70b": "llama-3.1-70b", "meta-llama/meta-llama-3-70b": "llama-3.1-70b",
    "meta-llama/llama-2-7b": "llama-2-7b", "meta-llama/llama-2-70b-chat-hf": "llama-2-70b",
    "decapoda-research/llama-7b-hf": "llama-2-7b", "decapoda-research/llama-13b-hf": "llama-2-13b",
    "mistralai/mistral-7b-v0.2": "mistral-7b",
}
"""Models the corpus names whose blocks equal a preset's (only context length or RoPE settings differ, which
change neither memory per token nor FLOPs): Llama 3 = Llama 3.1 at 8k context, LLaMA-1 = Llama 2 at 2k,
Mistral v0.2 = v0.1 without the sliding window."""


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
