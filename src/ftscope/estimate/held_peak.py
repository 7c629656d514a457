"""One-stream memory models' peak bytes per micro-batch, without building their phase points.

A plan solves hundreds of memory models for the largest micro-batch that fits, each at a dozen batch sizes, and
checks the breakdown at the batch it picks: `MemoryModel._points` builds ten tuples per batch, of which the solvers
read a sum each. Here `model_terms` reads a model's fields once, `acts_at` the activations of its points at a batch
shape, and `peak_at`, `totals_at` and `top_at` the sums the solvers and the breakdown's sanity check read: a mirror of
MemoryModel._points and _reserved_of's one-stream branch (the same float operations in the same order, each point's
sum left to right; tests/estimate/test_held_peak.py checks == on seeded random models), like memory_columns.py and
memory_arrays.py.
"""
from __future__ import annotations

from math import copysign
from ..spec.hardware import GIB
from .memory import MemoryModel


def held_terms(mem: MemoryModel, held: bool = True) -> tuple[float, float, float] | None:
    """(workspace bytes, fragmentation share, other stream's pool) that MemoryModel._reserved_of(points, held) adds
    to each phase point when nothing is on another stream (no gathered units, no gradient pool: its first branch),
    read as it reads them; None otherwise (the totals then take _reserved_of itself)."""
    al, g, gp = mem.allocator, mem.stream_gathered, mem.gradient_pool
    if not (g == 0.0 and gp == 0.0 and copysign(1.0, g) > 0.0):
        return None
    fr = al.fragmentation_checkpointed if mem.checkpointing else al.fragmentation
    return al.workspace_gib * GIB, (min(fr, al.pinned) if held else fr), mem.stream_pool


def model_terms(mem: MemoryModel) -> tuple | None:
    """What acts_at, peak_at, top_at and totals_at read of a model: (what its activations read, what its points add
    to them), as two tuples (a plan keeps one per model: few objects, where closures would keep dozens of cells for
    the garbage collector to walk); None where held_terms is."""
    terms = held_terms(mem)
    if terms is None:
        return None
    ws, fr_held, pool = terms
    fr = held_terms(mem, held=False)[1]
    a, hg = mem.acts, mem.head_grad
    static = mem.weights + mem.optimizer
    wt, g_fwd = mem.weight_transient, mem.gradients_in_forward
    g_end = max(mem.gradients, g_fwd)
    sg = static + g_fwd
    h = hg.weight
    g_emb = g_end + hg.at_embedding
    emb = static + g_emb + wt if hg.at_embedding else None  # the tied embedding's point: no activations
    opt_t = mem.optimizer_transient
    opt = static + mem.gradients + opt_t  # the optimizer step's point: no activations
    acts = (mem.checkpointing, mem.offload_activations, a.head_per_token, a.logits_saved_per_token,
            a.checkpoint_per_token, a.saved_per_token, a.saved_per_token_quadratic, a.layer_per_token,
            a.layer_per_token_quadratic, a.layer_ffn_per_token, a.checkpoint_layer_per_token,
            a.forward_transient_per_token, a.loss_tile_per_token, a.loss_tile_tokens, a.logits_held_per_token,
            a.logits_forward_extra_per_token, a.logits_backward_extra_per_token, h, hg.chunks, hg.logits_grad_per_token)
    # each point's base (its allocated bytes are base + activations + temporary) and gradients; then the held and
    # the plain totals of the two points without activations
    points = (sg, g_fwd, wt, wt + mem.block_transient, sg + h, g_fwd + h, sg + 2 * h, g_fwd + 2 * h, sg + 3 * h,
              g_fwd + 3 * h, static + (g_fwd + hg.in_blocks), g_fwd + hg.in_blocks,
              static + (g_end + hg.at_last_block), g_end + hg.at_last_block, emb, g_emb, opt, mem.gradients, opt_t, ws,
              pool, fr_held, fr, None if emb is None else emb + ws + fr_held * (0.0 + wt) + pool,
              None if emb is None else emb + ws + fr * (0.0 + wt) + pool, opt + ws + fr_held * (0.0 + opt_t) + pool,
              opt + ws + fr * (0.0 + opt_t) + pool)
    return acts, points


def acts_at(c: tuple, batch: float, seq: float) -> tuple:
    """The activations term of each point _points makes at a micro-batch (`c`: model_terms): end of forward, the
    last block's forward, start of backward, the head's three moments (0.0 where it has fewer), recompute, end of
    backward."""
    (ckpt, offload, head_pt, logits_pt, ck_pt, sv_pt, svq, ly_pt, lyq, ffn_pt, ckl_pt, ft_pt, tile_pt, tile_tok,
     held_pt, fx_pt, bx_pt, trained, n, lg_pt) = c[0]
    t = batch * seq
    # (a product of the same two floats is the same float: each is made once)
    head_t, logits, scores = head_pt * t, logits_pt * t, lyq * t * seq
    head = head_t + logits  # activation_bytes
    if ckpt:
        saved = ck_pt * t + head
    else:
        saved = sv_pt * t + svq * t * seq + head
    layer = ly_pt * t + scores
    if offload:
        kept = ckl_pt * t if ckpt else layer
        kept = 2 * kept
        saved = saved - head
        saved = (kept if kept < saved else saved) + head  # min(saved - head, 2 * kept) + head
    tile = tile_pt * (tile_tok if tile_tok < t else t)  # _points: min(t, tile_tok)
    held = held_pt * t
    after_head = saved - logits + held
    if ckpt:
        rec_act = layer - ffn_pt * t + scores
        rec_act = after_head + (rec_act if rec_act > layer else layer)  # max(layer, ...)
    else:
        rec_act = after_head + scores
    m0 = m1 = m2 = 0.0
    if trained:  # the head's backward: saved - logits + kept + held, kept per moment
        grad = lg_pt * t / n
        m0 = saved - logits + (logits * (n - 1) / n + grad) + held
        if n > 1:
            m1 = saved - logits + (logits * (n - 2) / n + grad) + held
            m2 = saved - logits + logits * (n - 2) / n + held
    return (saved + fx_pt * t + tile, after_head - held - head_t + ft_pt * t, saved + bx_pt * t + tile + held,
            m0, m1, m2, rec_act, layer + held)


def peak_at(c: tuple, acts: tuple, least: float) -> float:
    """MemoryModel.peak_bytes(batch, seq) of the model whose model_terms `c` is (`acts`: acts_at(c, batch, seq);
    `least`: its least_reserved): max(least, *the held totals), each point's total summed as _reserved_of sums it,
    in _points' order."""
    fwd, blk, bwd, m0, m1, m2, rec, end = acts
    (sg, _, wt, bt, sh1, _, sh2, _, sh3, _, sgr, _, sgl, _, _, _, _, _, _, ws, pool, fr, _, emb, _, opt, _) = c[1]
    top = least
    x = sg + fwd + wt + ws + fr * (fwd + wt) + pool
    if x > top:
        top = x
    x = sg + blk + bt + ws + fr * (blk + bt) + pool
    if x > top:
        top = x
    x = sg + bwd + wt + ws + fr * (bwd + wt) + pool
    if x > top:
        top = x
    if c[0][17]:  # a trained head's moments (a frozen one repeats the start of backward)
        x = sh1 + m0 + wt + ws + fr * (m0 + wt) + pool
        if x > top:
            top = x
        if c[0][18] > 1:
            x = sh2 + m1 + wt + ws + fr * (m1 + wt) + pool
            if x > top:
                top = x
            x = sh3 + m2 + wt + ws + fr * (m2 + wt) + pool
            if x > top:
                top = x
        if emb is not None and emb > top:
            top = emb
    x = sgr + rec + bt + ws + fr * (rec + bt) + pool
    if x > top:
        top = x
    x = sgl + end + bt + ws + fr * (end + bt) + pool
    if x > top:
        top = x
    return opt if opt > top else top


def top_at(c: tuple, acts: tuple) -> tuple:
    """The reserved bytes of the point where the breakdown at a micro-batch peaks (the first of the largest of
    _reserved_of's totals, the floor left out) and that point's terms: (bytes, gradients, activations, temporary,
    allocated), for the model whose model_terms `c` is (`acts`: acts_at(c, batch, seq))."""
    fwd, blk, bwd, m0, m1, m2, rec, end = acts
    (sg, g_fwd, wt, bt, sh1, gh1, sh2, gh2, sh3, gh3, sgr, g_rec, sgl, g_last, emb, g_emb, opt, g_opt, opt_t, ws, pool,
     _, fr, _, emb_total, _, opt_total) = c[1]
    top, at = sg + fwd + wt + ws + fr * (fwd + wt) + pool, 0
    x = sg + blk + bt + ws + fr * (blk + bt) + pool
    if x > top:
        top, at = x, 1
    x = sg + bwd + wt + ws + fr * (bwd + wt) + pool
    if x > top:
        top, at = x, 2
    if c[0][17]:
        x = sh1 + m0 + wt + ws + fr * (m0 + wt) + pool
        if x > top:
            top, at = x, 3
        if c[0][18] > 1:
            x = sh2 + m1 + wt + ws + fr * (m1 + wt) + pool
            if x > top:
                top, at = x, 4
            x = sh3 + m2 + wt + ws + fr * (m2 + wt) + pool
            if x > top:
                top, at = x, 5
        if emb is not None and emb_total > top:
            top, at = emb_total, 6
    x = sgr + rec + bt + ws + fr * (rec + bt) + pool
    if x > top:
        top, at = x, 7
    x = sgl + end + bt + ws + fr * (end + bt) + pool
    if x > top:
        top, at = x, 8
    if opt_total > top:
        return opt_total, g_opt, 0.0, opt_t, opt
    if at == 6:
        return top, g_emb, 0.0, wt, emb
    base, grads, act, temp = ((sg, g_fwd, fwd, wt), (sg, g_fwd, blk, bt), (sg, g_fwd, bwd, wt), (sh1, gh1, m0, wt),
                              (sh2, gh2, m1, wt), (sh3, gh3, m2, wt), None, (sgr, g_rec, rec, bt),
                              (sgl, g_last, end, bt))[at]
    return top, grads, act, temp, base + act + temp


def totals_at(c: tuple, batch: float, seq: float) -> list[float]:
    """MemoryModel.reserved_totals(batch, seq) of the model whose model_terms `c` is: each of _points' ten points'
    held total, in its order, repeats included (solvers.reserved_curves reads them per point)."""
    fwd, blk, bwd, m0, m1, m2, rec, end = acts_at(c, batch, seq)
    (sg, _, wt, bt, sh1, _, sh2, _, sh3, _, sgr, _, sgl, _, _, _, _, _, _, ws, pool, fr, _, emb, _, opt, _) = c[1]
    start = sg + bwd + wt + ws + fr * (bwd + wt) + pool
    head = [start] * 4
    if c[0][17]:
        head = [sh1 + m0 + wt + ws + fr * (m0 + wt) + pool]
        if c[0][18] > 1:
            head += [sh2 + m1 + wt + ws + fr * (m1 + wt) + pool, sh3 + m2 + wt + ws + fr * (m2 + wt) + pool]
        head.append(start if emb is None else emb)
        head += [head[0]] * (4 - len(head))
    return [sg + fwd + wt + ws + fr * (fwd + wt) + pool, sg + blk + bt + ws + fr * (blk + bt) + pool, start, *head,
            sgr + rec + bt + ws + fr * (rec + bt) + pool, sgl + end + bt + ws + fr * (end + bt) + pool, opt]
