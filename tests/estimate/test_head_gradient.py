"""The trained LM head's weight gradient in backward (estimate/head_gradient.py), through the memory model's phase
points (benchmarks/head_gradient_rss.py measured the mechanism on CPU)."""
from __future__ import annotations

import pytest

import ftscope
from ftscope.estimate.memory import memory_model


def scn(model="llama-3.2-1b", gpu="a100-80gb", mix=None, wl=None, hw=None):
    d = {"model": model, "hardware": {"gpu": gpu, **(hw or {})},
         "mix": {"attention": "flash", **(mix or {})},
         "workload": {"micro_batch_size": 1, "seq_len": 512, **(wl or {})}}
    return ftscope.load_scenario(d)


def _grads_by_point(s, b=1, seq=512):
    return [p.gradients for p in memory_model(s).phase_points(b, seq) if p.phase == "backward"]


def test_a_frozen_head_adds_no_gradient_point():
    from ftscope.estimate.head_gradient import NO_HEAD_GRADIENT
    s = scn("llama-3.1-8b", mix={"method": "lora", "loss": "chunked", "precision": "bf16"})
    mm = memory_model(s)
    # the planner stacks every model's points: a frozen head's four repeat the start of backward
    assert mm.head_grad == NO_HEAD_GRADIENT
    assert len(mm.phase_points(1, 512)) == 10 and len(set(mm.phase_points(1, 512))) == 6


def test_a_chunked_head_holds_three_head_gradients_at_its_first_accumulation():
    # Llama 3.1 8B's untied head: 128256 x 4096 bf16; an optimizer fused into backward frees every other gradient
    s = scn("llama-3.1-8b", mix={"method": "full", "precision": "bf16", "loss": "chunked",
                                  "optimizer_in_backward": True, "gradient_checkpointing": True})
    head = 128256 * 4096 * 2
    grads = _grads_by_point(s)
    assert max(grads) == pytest.approx(3 * head)
    assert sorted(grads)[-3:] == pytest.approx([head, 2 * head, 3 * head])
    # one matmul (no chunks): the fresh gradient only, stepped at once (untied): no head gradient in the blocks
    one = _grads_by_point(scn("llama-3.1-8b", mix={"method": "full", "precision": "bf16", "optimizer_in_backward": True,
                                                   "gradient_checkpointing": True}))
    assert max(one) == pytest.approx(head) and min(one) == 0.0


def test_a_tied_head_gradient_waits_for_the_embedding():
    # Llama 3.2 1B ties its head to the embedding (128256 x 2048): under an optimizer fused into backward autograd
    # holds the head's gradient through the blocks and adds the embedding's out of place at the end (one matmul)
    s = scn(mix={"method": "full", "precision": "bf16", "optimizer_in_backward": True, "gradient_checkpointing": True})
    mm = memory_model(s)
    head = 128256 * 2048 * 2
    assert mm.head_grad.in_blocks == pytest.approx(head) and mm.head_grad.at_last_block == pytest.approx(head)
    assert mm.head_grad.at_embedding == pytest.approx(3 * head)
    untied = memory_model(scn("llama-3.1-8b", mix={"method": "full", "precision": "bf16",
                                                    "optimizer_in_backward": True}))
    assert untied.head_grad.in_blocks == untied.head_grad.at_embedding == 0.0


def test_a_tied_head_peaks_when_the_embedding_gradient_is_added():
    # a full fine-tune with SGD (no states, no step temporaries) and a few tokens peaks as backward ends: every
    # gradient, plus the embedding's fresh one and the out-of-place sum with the tied head's
    s = scn(mix={"method": "full", "precision": "bf16", "optimizer": "sgd"}, wl={"seq_len": 64})
    mm = memory_model(s)
    head = 128256 * 2048 * 2
    assert mm.breakdown(1, 64).allocated_bytes == pytest.approx(mm.weights + mm.gradients + 2 * head, rel=1e-3)


def test_a_split_head_gradient_is_every_byte_field_times_the_share():
    """split_head builds the split HeadGradient directly: the same as _replace of each byte field."""
    from ftscope.estimate.head_gradient import HeadGradient, split_head
    hg = HeadGradient(3.0, 8, 5.0, 7.0, 11.0, 13.0)
    want = hg._replace(weight=3.0 * 0.25, logits_grad_per_token=5.0 * 0.25, in_blocks=7.0 * 0.25,
                       at_last_block=11.0 * 0.25, at_embedding=13.0 * 0.25)
    assert split_head(hg, 0.25) == want and type(split_head(hg, 0.25)) is HeadGradient
