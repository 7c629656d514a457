"""fixes: the single changes that make a non-fitting GPU fit, each checked by re-estimating it."""
from __future__ import annotations

import ftscope
from ftscope.estimate import estimate
from ftscope.plan.fixes import fixes, fixes_per_gpu


def scn(**mix):
    return ftscope.load_scenario({"model": "llama-3.1-8b", "hardware": {"gpu": "l40s", "gpus_per_node": 8},
                                  "mix": {"method": "full", **mix},
                                  "workload": {"micro_batch_size": "max", "seq_len": 2048}})


def test_full_fine_tuning_on_8_l40s_fits_with_zero3_or_qlora_not_with_checkpointing_alone():
    est = estimate(scn(), strict=False)
    assert est.status == "does_not_fit"
    found = {f.change: f for f in fixes(est, margin=0.05)}
    assert set(found) == {"ZeRO-3", "QLoRA"}
    for f in found.values():  # each is what re-estimating with that one change says
        change = {"ZeRO-3": dict(zero_stage=3), "QLoRA": dict(method="qlora")}[f.change]
        after = estimate(est.scenario.with_(**change), margin=0.05)
        assert after.fits and after.micro_batch_size == f.micro_batch_size and f.gpus == 8
        assert f.headroom_pct >= 5 and "GPUs (b" in f.text()


def test_only_gpus_where_nothing_fits_get_fixes():
    s = scn()
    plan = ftscope.plan(s, gpus=["l40s", "mi300x"], counts=[1, 8])
    assert set(plan.fixes) == {"l40s"} and plan.fixes == fixes_per_gpu(plan.rows)
    assert [f["change"] for f in plan.to_dict()["fixes"]["l40s"]] == ["ZeRO-3", "QLoRA"]
    assert estimate(s.with_(gradient_checkpointing=True), strict=False).status == "does_not_fit"
