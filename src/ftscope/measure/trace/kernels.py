"""What the traced step must see as a real CUDA step would: an unpacked batch (so sdpa runs its causal kernel)
and the attention kernel CUDA picks when q/k and v head dims differ."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator


@contextmanager
def unpacked_batch() -> Iterator[None]:
    """Answer transformers' packed-sequence probe the way real data does for one unpacked, unpadded batch.

    `find_packed_sequence_indices` reads position_ids values to see whether several sequences share a row; on
    fake tensors it cannot, says "maybe", and the model then builds an explicit B x S x S mask instead of
    letting sdpa run its `is_causal` kernel. Real position_ids 0..S-1 make it return None."""
    from transformers import masking_utils

    saved = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        with _cuda_attention_kernels():
            yield
    finally:
        masking_utils.find_packed_sequence_indices = saved


@contextmanager
def _cuda_attention_kernels() -> Iterator[None]:
    """Pick the attention kernel CUDA would: with q/k and v head dims that differ (DeepSeek's MLA: 192 vs 128)
    CPU sdpa falls back to the math path (it materializes B x H x S x S scores in fp32), while CUDA runs the
    memory-efficient kernel. Its fake-tensor implementation runs anywhere, so the trace uses that."""
    import torch
    import torch.nn.functional as F

    sdpa = F.scaled_dot_product_attention

    def routed(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        if (query.shape[-1] != value.shape[-1] and attn_mask is None and not enable_gqa
                and query.shape[-3] == key.shape[-3] == value.shape[-3]):
            out = torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, None, query.requires_grad or key.requires_grad or value.requires_grad,
                dropout_p, is_causal, scale=scale)
            return out[0]
        return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                    enable_gqa=enable_gqa)

    F.scaled_dot_product_attention = routed
    try:
        yield
    finally:
        F.scaled_dot_product_attention = sdpa
