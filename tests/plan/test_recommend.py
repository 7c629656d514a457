"""recommend: the reasoning the issue asks for, checked on the search itself (no copied numbers)."""
from __future__ import annotations

import pytest

import ftscope
from ftscope.estimate.weight_memory import gathered_weight_bytes
from ftscope.plan.ranking import rank_key
from ftscope.plan.recommend import (ENGINES, SearchSpace, complexity, gathered_gb_per_step, recommend, signed_percent,
                                    signed_usd)

SMALL = SearchSpace(methods=("full", "lora", "qlora"), gradient_checkpointing=(False, True),
                    attention=("sdpa", "flash"), optimizer=("adamw",), offload=("none", "optimizer"))


def _scn(model: str, seq: int = 2048, gpu: str = "a100-80gb", batch: int = 1, **mix) -> ftscope.spec.scenario.Scenario:
    return ftscope.load_scenario({"model": model, "hardware": {"gpu": gpu},
                                  "mix": {"method": "lora", "attention": "flash", **mix},
                                  "workload": {"micro_batch_size": batch, "seq_len": seq, "padding": "packed",
                                               "num_samples": 2000}})


def test_winner_fits_and_is_ranked_first_by_time():
    rec = recommend(_scn("llama-2-7b"), gpus=["a100-80gb:4"], space=SMALL)
    assert rec.best is not None and rec.best.feasible
    feasible = [c for c in rec.rows if c.feasible]
    assert min(c.estimate.run.hours for c in feasible) >= rec.best.estimate.run.hours * 0.995


def test_rejected_candidates_keep_a_reason():
    rec = recommend(_scn("llama-2-7b"), gpus=["a100-80gb:2"], space=SMALL)
    rejected = [c for c in rec.rows if not c.feasible]
    assert rejected and all(c.reason for c in rejected)


def test_more_gpus_never_make_the_best_time_worse():
    times = []
    for n in (1, 2, 4, 8):
        rec = recommend(_scn("llama-2-13b"), gpus=[f"a100-80gb:{n}"], space=SMALL)
        times.append(rec.best.estimate.run.hours)
    assert all(b <= a * 1.0001 for a, b in zip(times, times[1:]))


def test_70b_and_180b_on_80gb_gpus_need_sharded_or_quantized_weights():
    for model in ("llama-2-70b", "falcon-180b"):
        rec = recommend(_scn(model), gpus=["h100-80gb:8"], space=SearchSpace(optimizer=("adamw",)))
        feasible = [c for c in rec.rows if c.feasible]
        assert feasible, model
        for c in feasible:
            shards_params = c.scenario.mix.zero_stage == 3 or c.scenario.mix.fsdp is not None  # ZeRO-3 or FSDP
            assert shards_params or c.scenario.mix.method == "qlora", c.scenario.mix.label()


def test_32k_context_on_one_80gb_gpu_needs_flash_or_checkpointing():
    rec = recommend(_scn("llama-2-7b", seq=32768), gpus=["a100-80gb:1"],
                    space=SearchSpace(attention=("eager", "sdpa", "flash"), optimizer=("adamw",)))
    feasible = [c for c in rec.rows if c.feasible]
    assert feasible
    for c in feasible:
        assert c.scenario.mix.attention == "flash" or c.scenario.mix.gradient_checkpointing, c.scenario.mix.label()


def test_budget_and_deadline_drop_candidates_with_the_reason():
    base = recommend(_scn("llama-2-7b"), gpus=["a100-80gb:2"], space=SMALL)
    cheapest = min(c.estimate.run.usd for c in base.rows if c.feasible)
    rec = recommend(_scn("llama-2-7b"), gpus=["a100-80gb:2"], space=SMALL, budget_usd=cheapest * 1.0001)
    assert all(c.estimate.run.usd <= cheapest * 1.0001 for c in rec.rows if c.feasible)
    assert rec.summary.reasons["over budget"] > 0
    assert rec.summary.feasible + rec.summary.reasons["over budget"] == base.summary.feasible
    fastest = base.best.estimate.run.hours
    rec = recommend(_scn("llama-2-7b"), gpus=["a100-80gb:2"], space=SMALL, deadline_hours=fastest * 0.5)
    assert rec.best is None and rec.summary.reasons["over deadline"] == base.summary.feasible


def test_global_batch_is_kept_when_the_scenario_fixes_the_batch():
    rec = recommend(_scn("llama-2-7b", batch=4), gpus=["a100-80gb:4"], space=SMALL)
    for c in rec.rows:
        if c.feasible:
            wl = c.scenario.workload
            got = c.estimate.micro_batch_size * wl.gradient_accumulation * c.scenario.cluster.world_size
            assert got >= 4 and got < 4 + c.estimate.micro_batch_size * c.scenario.cluster.world_size


def test_ties_go_to_the_simpler_mix():
    rec = recommend(_scn("llama-2-7b"), gpus=["a100-80gb:1"], space=SMALL)
    best = rec.best
    same = [c for c in rec.rows if c.feasible and f"{c.estimate.run.hours:.3g}" == f"{best.estimate.run.hours:.3g}"]
    assert complexity(best.scenario) == min(complexity(c.scenario) for c in same)


def test_explanation_compares_the_winner_with_alternatives_in_numbers():
    rec = recommend(_scn("llama-2-70b"), gpus=["h100-80gb:8"], space=SMALL)
    text = "\n".join(rec.explanation)
    assert rec.explanation[0].startswith("best by time")
    assert "%" in text and "GiB" in text
    assert any("cannot run" in line or "% time" in line for line in rec.explanation[1:])


def test_explanation_signs_money_and_percentages_as_written_by_hand():
    assert [signed_usd(v) for v in (0.77, -0.49, -0.004, 0.0, 1234.5)] == ["+$0.77", "-$0.49", "$0.00", "$0.00",
                                                                          "+$1,234.50"]
    assert [signed_percent(v) for v in (2.4, -98.0, -0.3, 0.4)] == ["+2 %", "-98 %", "0 %", "0 %"]
    rec = recommend(_scn("llama-2-70b"), gpus=["h100-80gb:8"], space=SMALL)
    text = "\n".join(rec.explanation)
    assert "$+" not in text and "$-" not in text and "-0 %" not in text


def test_json_has_rows_best_and_reasons():
    d = recommend(_scn("llama-2-7b"), gpus=["a100-80gb:2"], space=SMALL, top=4).to_dict()
    assert {"rows", "best", "explanation", "counts", "search"} <= set(d)
    assert d["best"]["memory"]["fits"] is True and "scenario" in d["best"]
    assert [r["memory"]["fits"] for r in d["rows"]] == [True] * 4 + [False] * 4  # top 4, then the first rejected
    assert all(r["reason"] for r in d["rows"] if not r["memory"]["fits"])
    counts = d["counts"]
    assert counts["feasible"] + sum(counts["reasons"].values()) == counts["candidates"] == 2 * 144  # 2 counts x 144 mixes
    assert d["search"]["complete"] and d["search"]["covered"] == 1.0


def test_best_deepspeed_is_the_best_zero_candidate():
    rec = recommend(_scn("llama-2-7b"), gpus=["a100-80gb:2"], space=SMALL)
    every = []
    recommend(_scn("llama-2-7b"), gpus=["a100-80gb:2"], space=SMALL, on_row=every.append)
    zero = [c for c in every if c.feasible and c.scenario.mix.zero_stage > 0]
    best = min(zero, key=lambda c: rank_key(c, "time"))  # min keeps the first of equal keys, as the search does
    assert rec.best_deepspeed.to_dict() == best.to_dict()


def test_an_engine_restricts_the_search_to_its_launcher():
    scn = _scn("llama-2-13b")
    every = recommend(scn, gpus=["a100-80gb:2"], space=SMALL)
    for engine, runs_it in (("deepspeed", lambda m: m.fsdp is None), ("fsdp", lambda m: m.fsdp is not None)):
        rec = recommend(scn, gpus=["a100-80gb:2"], space=SMALL, engine=engine)
        assert rec.engine == engine and rec.to_dict()["engine"] == engine
        assert rec.rows and all(runs_it(c.scenario.mix) for c in rec.rows)
        assert rec.summary.candidates == every.summary.candidates * len(ENGINES[engine]) // len(SMALL.sharding)
        if runs_it(every.best.scenario.mix):  # the unrestricted winner is in this engine's space: it still wins
            assert rec.best.to_dict() == every.best.to_dict()


def test_gathered_gb_per_step_counts_what_the_time_model_gathers():
    """The "why" text's gigabytes are comm.data_parallel's: bitsandbytes gathers its 4-bit data alone (nested or
    not), torchao's NF4Tensor its scalers too; DeepSpeed gathers again for the recompute, FSDP does not."""
    def scenario(framework="hf-trainer", **mix):
        return ftscope.load_scenario({
            "model": "llama-2-7b", "framework": framework, "hardware": {"gpu": "a100-80gb", "gpus_per_node": 4},
            "mix": {"method": "qlora", "gradient_checkpointing": True, **mix},
            "workload": {"micro_batch_size": 1, "seq_len": 512, "gradient_accumulation": 2}})
    nested, plain = scenario(zero_stage=3), scenario(zero_stage=3, nested_quant=False)
    assert gathered_gb_per_step(plain) == gathered_gb_per_step(nested)
    assert gathered_gb_per_step(nested) == pytest.approx(gathered_weight_bytes(nested) * 3 / 4 * 3 * 2 / 1e9)
    fsdp, ao = scenario(fsdp="full_shard"), scenario("torchtune", fsdp="full_shard")
    assert gathered_gb_per_step(fsdp) == pytest.approx(gathered_weight_bytes(fsdp) * 3 / 4 * 2 * 2 / 1e9)
    assert gathered_gb_per_step(ao) == pytest.approx(gathered_weight_bytes(ao) * 3 / 4 * 2 * 2 / 1e9)
    assert gathered_gb_per_step(ao) > gathered_gb_per_step(fsdp) > 0
    once = scenario(fsdp="shard_grad_op")  # gathers every weight once a step, whatever the accumulation
    assert gathered_gb_per_step(once) == pytest.approx(gathered_weight_bytes(once) * 3 / 4 / 1e9)
    assert gathered_gb_per_step(scenario(zero_stage=2)) == 0.0
