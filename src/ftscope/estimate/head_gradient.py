"""A trained LM head's weight gradient in backward: the bytes of it the phase points' gradient terms leave out.

The loss's backward makes the head's gradient before any other; how long it stays beside the others depends on
chunking, tying and on what steps it (an optimizer fused into backward). Measured on CPU with torch 2.13 by
benchmarks/head_gradient_rss.py.
"""
from __future__ import annotations

from typing import NamedTuple

from ..spec.scenario import Scenario
from .activations import LOSS_CHUNKS


class HeadGradient(NamedTuple):
    """A trained LM head's weight gradient (tied: the embedding's), which the loss's backward makes before any other
    gradient: the bytes of it that the phase points' gradient terms leave out."""

    weight: float
    """Bytes of the head's weight gradient (0: the head is not trained)."""
    chunks: int
    """The head's matmuls: 1, or a chunked loss's chunks (the LM head applied per chunk of tokens)."""
    logits_grad_per_token: float
    """The logits' gradient in the compute dtype, alive during the head matmul's backward (per token)."""
    in_blocks: float
    """Alive while the blocks' backward runs (the recomputed last block), beyond the gradients of earlier
    micro-batches."""
    at_last_block: float
    """Alive at the first block's backward, beyond `gradients` (held by autograd for a tied embedding)."""
    at_embedding: float
    """Alive beyond `gradients` while a tied embedding's gradient is added to the head's, after the first block."""


NO_HEAD_GRADIENT = HeadGradient(0.0, 1, 0.0, 0.0, 0.0, 0.0)


def split_head(hg: HeadGradient, f: float) -> HeadGradient:
    """The head gradient's bytes times f, its chunks kept (memory_layout.split_states' share of a layout): hg._replace
    of every byte field, built directly (a search splits hundreds of thousands of models)."""
    return HeadGradient(hg.weight * f, hg.chunks, hg.logits_grad_per_token * f, hg.in_blocks * f,
                        hg.at_last_block * f, hg.at_embedding * f)


def head_gradient(scn: Scenario, gradient_bytes: float) -> HeadGradient:
    """The trained LM head's weight gradient in backward, beyond the phase points' gradient terms.

    autograd sums the gradients a parameter gets from several uses in the input buffer of its AccumulateGrad node
    (torch/csrc/autograd/input_buffer.cpp: in place only when it holds the last reference to the buffer and its
    storage, which a Linear weight's gradient, a transposed view of the matmul's output, is not) and runs that node,
    and with it a post-accumulate-grad hook (how an optimizer fused into backward steps: torchtune's
    register_optim_in_bwd_hooks), once all of them have arrived: a head tied to the embedding gets its last one from
    the embedding's backward, at the end. Measured on CPU, torch 2.13 (benchmarks/head_gradient_rss.py). Full
    fine-tuning only (a LoRA head is frozen); a fused linear cross-entropy computes the head's gradient inside its
    own kernel, counted with that loss."""
    m, mix = scn.model, scn.mix
    if mix.method != "full" or mix.loss == "fused_linear":
        return NO_HEAD_GRADIENT
    tied = m.lm_head_params == 0
    h = (m.embedding_params if tied else m.lm_head_params) * gradient_bytes
    chunks = (scn.recipe.loss_chunks or LOSS_CHUNKS) if mix.loss == "chunked" else 1
    logits_grad = (4.0 if mix.precision == "fp32" else 2.0) * m.arch.vocab_size
    # gradients of earlier micro-batches (or DeepSpeed's partitions) exist from the start: an untied head's is added
    # into its .grad at once; an optimizer fused into backward steps an untied head's at once and frees it
    early = scn.workload.gradient_accumulation > 1 or mix.zero_stage > 0 or mix.optimizer_in_backward
    held = tied and early  # autograd holds a tied head's gradient until the embedding's arrives, outside .grad
    # the embedding's fresh gradient is added to the head's; out of place onto an unchunked head's transposed view
    at_embedding = (h if held else 0.0) + (h if chunks > 1 else 2 * h) if tied else 0.0
    return HeadGradient(h, chunks, logits_grad, h if (tied or not early) else 0.0, h if held else 0.0, at_embedding)
