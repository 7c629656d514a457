"""Fake weights for a model built on the meta device: FakeTensors of the same shapes and dtypes (tied weights
stay tied), and bitsandbytes' 4-bit layers as fake NF4-packed weights with a fake quantization state (nested or
not, as the build made them)."""
from __future__ import annotations

from typing import Any

from ..runtime.build import NF4_BLOCKSIZE


def fake_weights(model: Any, fake_mode: Any) -> list[Any]:
    """Replace every meta parameter and buffer with a FakeTensor of the same shape and dtype (tied weights stay
    tied); bitsandbytes Linear4bit weights become fake NF4-packed tensors with a fake quantization state,
    made by bitsandbytes' own quantize_4bit fake kernel. Returns every tensor that now holds weight memory."""
    import torch

    try:
        import bitsandbytes as bnb
        linear4bit = bnb.nn.Linear4bit
    except ImportError:  # pragma: no cover - only QLoRA needs it
        bnb, linear4bit = None, ()
    memo: dict[int, Any] = {}
    held: list[Any] = []
    if bnb is not None and any(isinstance(m, linear4bit) for m in model.modules()):
        bnb.functional.quantize_blockwise(torch.ones(256))  # caches the dynamic map (its build reads values)
    with fake_mode:
        for mod in model.modules():
            for name, p in list(mod._parameters.items()):
                if p is None:
                    continue
                if id(p) not in memo:
                    if isinstance(mod, linear4bit) and name == "weight":
                        memo[id(p)] = _fake_4bit(mod, p, bnb, held)
                    else:
                        fake = torch.empty(p.shape, dtype=p.dtype, device="cpu")
                        memo[id(p)] = torch.nn.Parameter(fake, requires_grad=p.requires_grad)
                    held.append(memo[id(p)])
                mod._parameters[name] = memo[id(p)]
            for name, b in list(mod._buffers.items()):
                if b is None:
                    continue
                if id(b) not in memo:
                    memo[id(b)] = torch.empty(b.shape, dtype=b.dtype, device="cpu")
                    held.append(memo[id(b)])
                mod._buffers[name] = memo[id(b)]
    return held


def _fake_4bit(mod: Any, p: Any, bnb: Any, held: list[Any]) -> Any:
    import torch

    out_f, in_f = mod.out_features, mod.in_features
    w = torch.empty((out_f, in_f), dtype=torch.bfloat16, device="cpu")
    nested = bool(getattr(p, "compress_statistics", True))  # the build's Linear4bit setting (mix.nested_quant)
    packed, qs = bnb.functional.quantize_4bit(w, blocksize=NF4_BLOCKSIZE, compress_statistics=nested,
                                              quant_type="nf4", quant_storage=torch.uint8)
    param = torch.nn.Parameter(packed, requires_grad=False)
    for attr, value in (("quant_state", qs), ("blocksize", NF4_BLOCKSIZE), ("compress_statistics", nested),
                        ("quant_type", "nf4"), ("quant_storage", torch.uint8), ("bnb_quantized", True),
                        ("module", mod)):
        setattr(param, attr, value)
    mod.quant_state = qs
    for t in (qs.absmax, getattr(qs, "offset", None), qs.code,
              getattr(qs.state2, "absmax", None) if qs.nested else None,
              getattr(qs.state2, "code", None) if qs.nested else None):
        if isinstance(t, torch.Tensor):
            held.append(t)
    return param
