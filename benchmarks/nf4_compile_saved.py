"""What torch.compile keeps of torchao's NF4 dequantization (the torchtune recipe's `compiled_dequant_saved`).

Compiles a two-NF4-linear block with a LoRA branch (torchao's linear_nf4, as torchtune's QLoRA layers call it) and
prints the buffers Inductor's forward allocates and the tensors it returns for backward. Run it in a venv with
torchao (the README's /work/venvs/recipes-tt: torch 2.13.0 CPU, torchao 0.10.0):

    TORCH_LOGS=output_code python benchmarks/nf4_compile_saved.py 2>&1 | grep -E "empty_strided|return \\("

Seen: one fused kernel per weight writes its bf16 dequantization (2 B per weight; no int64 nibbles), and the
forward returns both dequantized weights among the tensors saved for backward.
"""
from __future__ import annotations

import torch


def main() -> None:
    from torchao.dtypes.nf4tensor import linear_nf4, to_nf4

    torch.manual_seed(0)
    w1 = to_nf4(torch.randn(1024, 512, dtype=torch.bfloat16))
    w2 = to_nf4(torch.randn(512, 1024, dtype=torch.bfloat16))
    a1 = torch.randn(8, 512, dtype=torch.bfloat16, requires_grad=True)
    b1 = torch.zeros(1024, 8, dtype=torch.bfloat16, requires_grad=True)
    x = torch.randn(64, 512, dtype=torch.bfloat16, requires_grad=True)

    def block(x: torch.Tensor) -> torch.Tensor:
        h = linear_nf4(x, w1) + (x @ a1.t()) @ b1.t()
        return linear_nf4(torch.nn.functional.silu(h), w2).sum()

    torch.compile(block)(x).backward()
    print("compiled step ran; see the output code above for the saved tensors")


if __name__ == "__main__":
    main()
