"""study optimizations: the Singh et al. grid behaves as physics says (not as copied numbers)."""
from __future__ import annotations

from ftscope.report.study_views import max_context_chart
from ftscope.studies.optimizations import combos, conclusions, study


def test_grid_covers_every_combination_for_every_model():
    rows = study(["phi-2", "llama-2-7b"], seq_lens=[512, 4096])
    assert len(rows) == 2 * len(combos())
    assert all(set(r.by_seq) == {512, 4096} for r in rows)


def test_flash_and_checkpointing_reach_the_longest_context():
    rows = study(["llama-2-7b"], seq_lens=[2048])
    best = max(rows, key=lambda r: r.max_seq_len)
    assert best.attention == "flash" and best.gradient_checkpointing
    eager = max(r.max_seq_len for r in rows if r.attention == "eager")
    assert best.max_seq_len > 2 * eager


def test_zero_stage_lowers_full_finetuning_memory():
    rows = [r for r in study(["llama-2-7b"], seq_lens=[512]) if r.method == "full" and r.attention == "flash"
            and not r.gradient_checkpointing and r.offload == "none"]
    peaks = {r.zero_stage: r.by_seq[512]["peak_gib"] for r in rows if r.by_seq[512]["peak_gib"] is not None}
    assert peaks[3] < peaks[2] < peaks[1]


def test_conclusions_name_a_fitting_combination(tmp_path):
    rows = study(["llama-2-7b", "llama-2-70b"], seq_lens=[2048])
    c = conclusions(rows, 2048)
    assert c["llama-2-7b"]["zero2_lora_fits"] is True
    assert c["llama-2-70b"]["zero2_lora_fits"] is False  # 70B LoRA needs sharded or quantized weights on 80 GB
    max_context_chart(rows, tmp_path / "s.png")
    assert (tmp_path / "s.png").stat().st_size > 10_000
