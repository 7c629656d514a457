"""What torch.compile keeps of a whole transformer block: torchtune's own TransformerSelfAttentionLayer, eager and
compiled per layer (`layer.compile()`, as torchtune's training.compile_model does), bytes saved for backward per token.

Builds the block from torchtune's source (a checkout at the README ladder's commit; only torchtune/modules and the
Llama 3.1 RoPE are imported, so its package __init__, which needs datasets and tokenizers, is skipped and torchao is
stubbed: no NF4 here) in the Llama 3.2 layout (RMSNorm, GQA attention through SDPA, a SwiGLU MLP), bf16, full
fine-tuning, at two MLP widths, and fits bytes = a h + b f per token (h hidden, f MLP width; weights excluded):

    mkdir /tmp/tt1814 && git -C <torchtune clone> archive 1814feb17a9038e1a8053ce93111bd26774a8db6 torchtune | tar -x -C /tmp/tt1814
    python benchmarks/compiled_layer_saved.py /tmp/tt1814

Seen (torch 2.13.0 CPU Inductor): eager 24 h + 8 f, compiled 14 h + 6 f. Compiled, the block drops the two norms'
fp32 copies and bf16 normalized outputs and keeps one more h-wide tensor (10 h less) and drops ONE of the gated MLP's
four f-wide tensors (2 f less), where per-op checkpointing recomputes two (ftscope's estimate/memory_layout.py
`elementwise_saved_per_token`). A hand-written copy of the block gives the same 10 h + 2 f.
"""
from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import torch
import torch.nn as nn


def _import_torchtune(root: Path):
    """torchtune's modules package without its top-level __init__ (datasets, tokenizers) and with torchao stubbed."""
    for name in ("torchao", "torchao.dtypes", "torchao.dtypes.nf4tensor"):
        sys.modules.setdefault(name, types.ModuleType(name))
    nf4 = sys.modules["torchao.dtypes.nf4tensor"]
    nf4.NF4Tensor = type("NF4Tensor", (torch.Tensor,), {})
    nf4.to_nf4 = nf4.linear_nf4 = lambda *a, **k: None
    nf4.implements = lambda *a, **k: (lambda f: f)
    sys.modules["torchao.dtypes"].NF4Tensor, sys.modules["torchao.dtypes"].to_nf4 = nf4.NF4Tensor, nf4.to_nf4
    pkg = types.ModuleType("torchtune")
    pkg.__path__ = [str(root / "torchtune")]
    sys.modules["torchtune"] = pkg
    import torchtune.modules as modules

    spec = importlib.util.spec_from_file_location("tt_rope", root / "torchtune/models/llama3_1/_position_embeddings.py")
    rope = importlib.util.module_from_spec(spec)
    sys.modules["tt_rope"] = rope  # dynamo imports a traced module by name
    spec.loader.exec_module(rope)
    return modules, rope.Llama3ScaledRoPE


def build_layer(modules, rope_cls, h: int, f: int, heads: int, kv_heads: int) -> nn.Module:
    """One Llama 3.2 block as torchtune's llama3_2 builder makes it (models/llama3_2/_component_builders.py)."""
    hd = h // heads
    attn = modules.MultiHeadAttention(
        embed_dim=h, num_heads=heads, num_kv_heads=kv_heads, head_dim=hd,
        q_proj=nn.Linear(h, heads * hd, bias=False), k_proj=nn.Linear(h, kv_heads * hd, bias=False),
        v_proj=nn.Linear(h, kv_heads * hd, bias=False), output_proj=nn.Linear(h, h, bias=False),
        pos_embeddings=rope_cls(dim=hd, max_seq_len=4096, base=500_000, scale_factor=32), max_seq_len=4096)
    mlp = modules.FeedForward(gate_proj=nn.Linear(h, f, bias=False), down_proj=nn.Linear(f, h, bias=False),
                              up_proj=nn.Linear(h, f, bias=False))
    layer = modules.TransformerSelfAttentionLayer(attn=attn, mlp=mlp, sa_norm=modules.RMSNorm(h),
                                                  mlp_norm=modules.RMSNorm(h))
    return layer.to(torch.bfloat16)


def saved_bytes(layer: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves for backward (weights, buffers and the input excluded)."""
    skip = {t.untyped_storage().data_ptr() for t in (*layer.parameters(), *layer.buffers(), x)}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if key not in skip:
            seen[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    out.sum().backward()
    return sum(seen.values())


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tt1814")
    modules, rope_cls = _import_torchtune(root)
    torch.manual_seed(0)
    h, tokens, widths = 768, 256, (1024, 2048)
    per_token: dict[tuple[int, bool], float] = {}
    for f in widths:
        for compiled in (False, True):
            layer = build_layer(modules, rope_cls, h, f, heads=6, kv_heads=2)
            if compiled:
                layer.compile()
                saved_bytes(layer, torch.randn(1, tokens, h, dtype=torch.bfloat16, requires_grad=True))  # compile
            x = torch.randn(1, tokens, h, dtype=torch.bfloat16, requires_grad=True)
            per_token[(f, compiled)] = saved_bytes(layer, x) / tokens
    for compiled in (False, True):
        b = (per_token[(widths[1], compiled)] - per_token[(widths[0], compiled)]) / (widths[1] - widths[0])
        a = (per_token[(widths[0], compiled)] - b * widths[0]) / h
        print(f"{'compiled' if compiled else 'eager   '}: {a:.2f} h + {b:.2f} f bytes saved per token")


if __name__ == "__main__":
    main()
