"""fit_test: the fit test read only where a peak can fit equals the same comparisons over the dense blocks x
columns arrays (`dense_arrays`, `capacities`: what Scan.gather and Scan.caps gave classify before it), cell for cell."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import ftscope
from ftscope.plan import classify
from ftscope.plan.fit_test import fit_test
from ftscope.plan.recommend import _targets
from ftscope.plan.scan import Scan
from ftscope.plan.space import SearchSpace, Space

SPACE = SearchSpace(methods=("full", "lora", "qlora"), sharding=((0, None), (3, None)), offload=("none",),
                    attention=("sdpa", "flash"), optimizer=("adamw",), experts_backend=("grouped_mm",),
                    tensor_parallel=((1, False), (2, True)), pipeline_parallel=(1, 2))


def capacities(scan, cols):
    """The capacity of every block (rows) for these mixes (columns), and the same less the scan's margin."""
    caps = np.stack(scan.cap_columns, axis=1)[:, scan.comm_of[cols]] if scan.cap_columns else \
        np.zeros((len(scan.usable), len(cols)))
    return caps, caps * (1.0 - scan.margin)


def dense_arrays(scan, slots):
    """(peak, fixed_peak, safe_fixed_peak, terms) of these slots as whole arrays, read from the scan's chunks (the
    fixed peaks None without a fixed global batch, the safe one the same array without a margin)."""
    scan.settle()
    which, at = slots // scan.width, slots % scan.width

    def pick(get, rows, fill):
        out = np.full((rows, len(slots)), fill)
        for c in np.unique(which).tolist():
            value, mine = get(scan.chunks[c]), np.flatnonzero(which == c)
            if value is not None:
                out[:, mine] = value[:, at[mine]]
        return out

    peak = pick(lambda ch: ch.peak, len(scan.at_world), np.inf)
    fixed = safe = None
    if scan.global_batch is not None:
        fixed = pick(lambda ch: ch.fixed_peak, len(scan.space.blocks), np.inf)
        safe = pick(lambda ch: ch.safe_fixed_peak, len(scan.space.blocks), np.inf) if scan.margin else fixed
    terms = dict(scan.terms, row=scan.terms["row"][:, slots]) if scan.terms else {}
    return peak, fixed, safe, terms


def _dense(scan, cols, margin):
    """The fit test over blocks x columns arrays: what classify computed before fit_test."""
    peak, fixed, safe_fixed, _ = dense_arrays(scan, scan.slot[cols])
    caps, safe_caps = capacities(scan, cols)
    g_of, w_of = scan.g_of, scan.w_of
    ok = scan.supported[:, cols][g_of] & scan.layout_ok[:, cols][w_of]
    on_safe = peak[w_of] <= safe_caps
    kept = peak[w_of] if fixed is None else np.where(on_safe, safe_fixed, fixed)
    fits, safe = kept <= caps, kept <= safe_caps
    status = np.full(ok.shape, classify.UNSUPPORTED, np.int8)
    status[ok & ~fits] = classify.NO_FIT
    status[ok & fits] = classify.FITS
    tier = (ok & fits & ~safe).astype(np.int8)
    at = np.flatnonzero(status.ravel() == classify.FITS)
    ranked = (peak[w_of].ravel()[at] if fixed is None else
              np.where(tier.ravel()[at] == 0, safe_fixed.ravel()[at], fixed.ravel()[at]))
    return status, tier, at, caps.ravel()[at], on_safe.ravel()[at], ranked


@pytest.mark.parametrize("global_batch, margin", [(None, 0.0), (None, 0.1), (64, 0.0), (64, 0.1)])
def test_the_fit_test_equals_the_dense_comparisons(monkeypatch, global_batch, margin):
    monkeypatch.setattr(sys.modules[Scan.__module__], "SLOT_CHUNK", 7)  # slots over several chunks
    scn = ftscope.load_scenario({"model": "llama-3.1-8b", "hardware": {"gpu": "a100-80gb"}, "mix": {"method": "lora"},
                                 "workload": {"micro_batch_size": 1, "seq_len": 8192, "num_samples": 1000}})
    space = Space(scn, _targets(scn, ["t4:2", "rtx-4090:4", "a100-80gb:2", "h100-80gb:8"], False), SPACE)
    scan = Scan(np, space, {}, global_batch, margin)
    for k in range(space.mixes_per_block):
        scan.mix(k, space.mix(k))
    cols = np.flatnonzero(scan.slot >= 0)
    fits, terms = fit_test(np, scan, cols, margin)
    status, tier, at, cap, on_safe, ranked = _dense(scan, cols, margin)
    assert (fits.status == classify.FITS).any() and (fits.status == classify.NO_FIT).any()
    assert (fits.status == classify.UNSUPPORTED).any() and (tier.any() if margin else True)
    assert fits.status.tobytes() == status.tobytes() and fits.tier.tobytes() == tier.tobytes()
    assert fits.at.tolist() == at.tolist() and fits.capacity.tobytes() == cap.tobytes()
    assert fits.peak.tobytes() == ranked.tobytes()
    assert fits.on_safe is None if not margin else fits.on_safe.tolist() == on_safe.tolist()
    assert terms["row"].tolist() == dense_arrays(scan, scan.slot[cols])[3]["row"].tolist()


def test_its_status_codes_are_classifys():
    from ftscope.plan import fit_test as module
    assert (module.UNSUPPORTED, module.NO_FIT, module.FITS) == (classify.UNSUPPORTED, classify.NO_FIT, classify.FITS)
