"""What torch.compile keeps of a chunk's cross-entropy (torchtune's `compile_loss`, the recipe's chunked loss).

torchtune compiles only `CEWithChunkedOutputLoss.compute_cross_entropy`, `F.cross_entropy(logits.float(), labels,
reduction="sum")` on one chunk of bf16 logits. This compiles the same function and prints the buffers Inductor's
forward and backward allocate and what the forward returns for backward (torch 2.13.0 CPU; the partition into
forward and backward does not depend on the device):

    TORCH_LOGS=output_code python benchmarks/compiled_ce_saved.py 2>&1 | grep -E "empty_strided_cpu\\(|return \\("

Seen: the forward saves the bf16 logits (an input) and two per-row fp32 statistics, never writing the fp32 upcast
or the log-softmax; the backward allocates one bf16 (tokens x vocab) gradient and a per-row fp32 buffer.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def main() -> None:
    torch.manual_seed(0)
    logits = torch.randn(64, 1000, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, 1000, (64,))

    def compute_cross_entropy(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(x.float(), y, reduction="sum")

    torch.compile(compute_cross_entropy)(logits, labels).backward()
    print(f"compiled loss ran; logits grad {logits.grad.dtype}; see the output code above for the saved tensors")


if __name__ == "__main__":
    main()
