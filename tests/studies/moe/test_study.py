"""study moe (studies/moe/): the issue's acceptance on the bundled tiny Mixtral and demo data, on CPU.

A shorter run than the demo (2 epochs, a subset of the eval set): training loss falls for both top-k values,
eval accuracy beats chance (multiple choice) and the most-common-answer baseline (QA) for both, and the expert
load table sums to tokens x top-k in every layer.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

import ftscope  # noqa: E402
from ftscope.studies.moe.study import study_moe  # noqa: E402
from ftscope.report.moe_study import write_outputs  # noqa: E402

pytestmark = pytest.mark.slow  # fine-tunes a real model per top-k

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "data" / "moe-demo"
SCENARIO = ROOT / "examples" / "moe-study-demo.yaml"


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe")
    rows = [json.loads(line) for line in (DATA / "eval.jsonl").read_text().splitlines()]
    # 100 items of each task keep the per-epoch evaluation short
    subset = [r for r in rows if "choices" in r][:100] + [r for r in rows if "choices" not in r][:100]
    eval_path = tmp / "eval.jsonl"
    eval_path.write_text("".join(json.dumps(r) + "\n" for r in subset))
    scn = ftscope.load_scenario(SCENARIO)
    result = study_moe(scn, DATA / "train.jsonl", eval_path, DATA / "tokenizer.json", epochs=2, top_ks=(2, 4),
                       device="cpu", memory_cap_gib=1 / 32, max_batch_cap=256)
    return result, subset, tmp


def test_both_runs_start_from_the_same_weights_and_the_loss_falls(study):
    result, _, _ = study
    assert [r.top_k for r in result.runs] == [2, 4]
    assert result.runs[0].init_checksum == result.runs[1].init_checksum
    for r in result.runs:
        first, last = r.step_losses[:20], r.step_losses[-20:]
        assert sum(last) / len(last) < 0.5 * sum(first) / len(first), r.top_k
        assert r.epochs[2].train_loss < r.epochs[1].train_loss
        assert r.epochs[2].eval_loss < r.epochs[0].eval_loss
        assert r.samples_per_s > 0 and r.tokens_per_s > r.samples_per_s


def test_accuracy_beats_chance_and_the_trivial_baseline(study):
    result, subset, _ = study
    mc = [r for r in subset if "choices" in r]
    chance = sum(1 / len(r["choices"]) for r in mc) / len(mc)
    train = [json.loads(line) for line in (DATA / "train.jsonl").read_text().splitlines()]
    common = Counter(r["answer"] for r in train if "choices" not in r).most_common(1)[0][0]
    qa = [r for r in subset if "choices" not in r]
    baseline = sum(r["answer"] == common for r in qa) / len(qa)
    assert result.tasks["commonsense"]["baseline"] == pytest.approx(chance)
    assert result.tasks["arithmetic"]["baseline"] == pytest.approx(baseline)
    for r in result.runs:
        final = r.epochs[-1].accuracy
        assert final["commonsense"] > chance + 0.15, (r.top_k, final)
        assert final["arithmetic"] > baseline + 0.05, (r.top_k, final)


def test_expert_load_sums_to_tokens_times_top_k_in_every_layer(study):
    result, subset, _ = study
    for r in result.runs:
        for snap in (r.load_before, r.load_after):
            assert snap.top_k == r.top_k and snap.queries == len(subset)
            assert len(snap.counts) == 2  # the tiny Mixtral's two MoE layers
            for row, tokens in zip(snap.counts, snap.tokens):
                assert len(row) == 4 and sum(row) == tokens * r.top_k
            assert snap.var_sample[0] == pytest.approx(snap.var_population[0] * 4 / 3)
            assert all(abs(sum(w) - 1) < 1e-9 for w in snap.weight_share)
    # dense routing sends every token to every expert: perfectly even counts
    dense = result.runs[1].load_after
    assert all(len(set(row)) == 1 for row in dense.counts) and max(dense.cv) == 0


def test_max_batch_and_outputs(study):
    result, _, tmp = study
    sparse, dense = (r.max_batch for r in result.runs)
    assert 1 <= dense["max_batch"] <= sparse["max_batch"]  # all experts active: more activation memory per sample
    assert result.runs[0].max_batch_estimated is not None
    files = {p.name for p in write_outputs(result, tmp / "out")}
    assert {"study.json", "tables.md", "accuracy.png", "loss.png", "expert_load_top2.png"} <= files
    d = json.loads((tmp / "out" / "study.json").read_text())
    assert d["runs"][0]["load_after"]["summary"]["var_population"] >= 0
