"""Fine-tuning sources (validate/corpus/finetuning.py): Answer.AI's fsdp_qlora and torchtune."""
from __future__ import annotations

import pytest

from ftscope import load_scenario
from ftscope.validate.corpus.finetuning import _torchtune_mix, answerai, torchtune

ANSWERAI = "answerai-fsdp-qlora-benchmarks"
TORCHTUNE = "torchtune-readme-and-tutorials"


def test_answerai_throughput_is_derived_from_the_run_time(point):
    m = answerai(*point(ANSWERAI, "fsdpqlora-4090-7b-lora-bs6"))
    tput = next(x for x in m.measures if x.metric == "tokens_per_s_per_gpu")
    assert tput.value == pytest.approx(1024 * 2048 / 481 / 2)
    s = load_scenario(m.scenario)
    assert s.mix.fsdp == "full_shard" and s.mix.lora_rank == 64 and s.mix.precision == "bf16"
    assert m.framework == "fsdp_qlora"


def test_answerai_ddp_and_offload_rows(point):
    ddp = load_scenario(answerai(*point(ANSWERAI, "fsdpqlora-3090-7b-lora-ddp-bs4")).scenario)
    assert ddp.mix.fsdp is None and ddp.mix.zero_stage == 0
    lora_off = answerai(*point(ANSWERAI, "fsdpqlora-4090-7b-lora-offload-bs10"))
    assert lora_off.scenario["mix"]["offload"] == "optimizer+params" and lora_off.needs == ()
    qlora_off = answerai(*point(ANSWERAI, "fsdpqlora-4090-70b-qlora-offload-bs2"))
    assert qlora_off.needs == ("qlora param offload",)
    assert load_scenario(qlora_off.scenario).mix.offload == "optimizer+params"   # allowed under FSDP


def test_answerai_effective_batch_rows_accumulate_to_about_32(point):
    m = answerai(*point(ANSWERAI, "fsdpqlora-cloud-70b-a100-sxm4-40gb-x2-bs1"))
    assert m.scenario["workload"]["gradient_accumulation"] == 16


def test_torchtune_packed_compiled_row_needs_compile(point):
    m = torchtune(*point(TORCHTUNE, "torchtune-2409-llama31-8b-lora-rtx4090-24gbx1"))
    assert m.needs == ("torch.compile",)
    assert m.scenario["workload"]["padding"] == "packed" and m.scenario["mix"]["loss"] == "chunked"


def test_torchtune_multi_gpu_tokens_per_s_scope_is_listed(point):
    m = torchtune(*point(TORCHTUNE, "torchtune-2405-llama-2-70b-lora-8xa100"))
    assert m.scenario is None  # alpaca unpacked: lengths unknown
    m = torchtune(*point(TORCHTUNE, "torchtune-2409-llama31-70b-lora-a100x8"))
    tput = next(x for x in m.measures if x.metric == "tokens_per_s_per_gpu")
    assert tput.reason  # per GPU or per job: not stated


def test_torchtune_ladder_rows(point):
    packed = torchtune(*point(TORCHTUNE, "torchtune-ladder-llama32-3b-+packed"))
    assert packed.why_not() is None
    assert {x.metric for x in packed.measures} == {"tokens_per_s_per_gpu", "peak_gib:allocated"}
    offload = torchtune(*point(TORCHTUNE, "torchtune-ladder-llama32-3b-+act-offload"))
    assert set(offload.needs) == {"torch.compile", "optimizer in backward", "activation offload"}
    baseline = torchtune(*point(TORCHTUNE, "torchtune-ladder-llama32-3b-baseline"))
    assert "token-length" in baseline.why_not()


def test_torchtune_tutorial_speed_without_a_gpu_is_listed(point):
    m = torchtune(*point(TORCHTUNE, "torchtune-tut-qlora-llama2-7b-speed-compile"))
    assert m.reason.startswith("GPU not stated")


def test_points_carry_their_frameworks_recipe(point):
    m = answerai(*point(ANSWERAI, "fsdpqlora-3090-7b-lora-s512"))
    assert load_scenario(m.scenario).recipe.name == "fsdp-qlora"
    # the post's max_memory_allocated is compared beside the table's reserved figure
    assert {x.metric: x.value for x in m.measures}["peak_gib:allocated"] == 8.28
    old = load_scenario(torchtune(*point(TORCHTUNE, "torchtune-2404-llama2-7b-full-4x4090")).scenario)
    assert old.recipe.name == "torchtune-0.1" and old.mix.loss == "standard"  # before torchtune's chunked loss
    ladder = load_scenario(torchtune(*point(TORCHTUNE, "torchtune-ladder-llama32-3b-+packed")).scenario)
    assert ladder.recipe.name == "torchtune" and ladder.mix.loss == "standard"  # the ladder's chunked_ce: False


def test_torchtune_figures_before_august_2024_are_gigabytes(point):
    """torchtune's get_memory_stats divided by 1e9 until 2024-08-15, by 1024**3 after; a figure that names no counter
    is read as the one its logging era's tables name: reserved in the GB era, peak active (allocated) in the GiB era."""
    old = torchtune(*point(TORCHTUNE, "torchtune-2404-llama2-7b-full-4x4090"))
    assert {x.metric: x.value for x in old.measures}["peak_gib:reserved"] == pytest.approx(22.9e9 / 2**30)
    new = torchtune(*point(TORCHTUNE, "torchtune-2409-llama31-405b-qlora-a100x8"))  # labelled GB, logged in GiB
    assert {x.metric: x.value for x in new.measures}["peak_gib:allocated"] == 44.8


def test_torchtune_readme_figures_copied_from_march_2024_are_untruncated(point):
    """fef3ed10's 1x4090 LoRA (17.18 GB) and QLoRA (9.29 GB) figures were written on 2024-03-21/22, before
    InstructDataset truncated at max_seq_len (2024-03-30): padded to lengths not stated, so listed; the QLoRA
    tutorial's own 2024-04-15 run (9.29 GB, alpaca truncated at 512) is compared in its place."""
    for pid in ("torchtune-2404-llama2-7b-lora-1x4090", "torchtune-2404-llama2-7b-qlora-1x4090"):
        m = torchtune(*point(TORCHTUNE, pid))
        assert m.scenario is None and "before torchtune's alpaca builders truncated" in m.why_not()
    tut = torchtune(*point(TORCHTUNE, "torchtune-tut-qlora-llama2-7b-reserved"))
    scn = load_scenario(tut.scenario)
    assert scn.workload.seq_len == 512 and scn.recipe.name == "torchtune-0.1"
    assert len(scn.mix.lora_targets) == 7  # 7B_qlora_single_device: q, k, v, output_proj + the MLP
    assert {x.metric: x.value for x in tut.measures}["peak_gib:reserved"] == pytest.approx(9.29e9 / 2**30)


def test_torchtune_figures_their_stated_setup_cannot_produce_list_the_peak(point):
    """A figure below what its stated setup must hold (weights, checkpointed layer inputs, the loss's logits), or one
    the same project's earlier figure of the same config contradicts, cannot be that setup's: its peak is listed with
    the reason, its throughput kept; the estimate's forward reaches past the figures below their setup."""
    from ftscope.estimate.memory import memory_model
    lora = torchtune(*point(TORCHTUNE, "torchtune-2409-llama31-8b-lora-rtx4090-24gbx1"))
    peak = next(x for x in lora.measures if x.metric.startswith("peak"))
    assert "is less than the stated setup" in peak.reason
    assert memory_model(load_scenario(lora.scenario)).breakdown(2, 2048).phases["forward"] / 2**30 > 16.2
    # the 405B's throughput is listed too (A100 size not stated): nothing is left, so the point is listed
    big = torchtune(*point(TORCHTUNE, "torchtune-2409-llama31-405b-qlora-a100x8"))
    assert big.scenario is None and big.why_not().startswith("44.8 GB is less than the stated setup")
    stated = load_scenario({"model": "llama-3.1-405b", "framework": "torchtune",
                            "hardware": {"gpu": "a100-80gb", "gpus_per_node": 8},
                            "mix": {"method": "qlora", "lora_rank": 16, "lora_targets": "all-linear", "loss": "standard",
                                    "fsdp": "full_shard", "gradient_checkpointing": True},
                            "workload": {"micro_batch_size": 2, "seq_len": 2048, "padding": "packed"}})
    assert memory_model(stated).breakdown(2, 2048).phases["forward"] / 2**30 > 44.8
    # contradicted by the same project's earlier figure of the same recipe and config (14.17 GB at a95c6b93)
    lora2 = torchtune(*point(TORCHTUNE, "torchtune-2404-llama2-7b-lora-2x4090"))
    assert lora2.scenario is None and "14.17 GB" in lora2.why_not()
    qlora = torchtune(*point(TORCHTUNE, "torchtune-2409-llama31-8b-qlora-rtx4090-24gbx1"))
    assert all(x.reason is None for x in qlora.measures if x.metric.startswith("peak"))


def test_torchtune_named_configs_supply_what_their_rows_omit(point):
    a6000 = load_scenario(torchtune(*point(TORCHTUNE, "torchtune-2409-llama31-8b-full-a6000-48gbx1")).scenario)
    assert a6000.mix.optimizer == "paged_adamw_8bit" and a6000.mix.optimizer_in_backward
    assert a6000.mix.loss == "chunked"  # every 2409 config but 405B_qlora ran CEWithChunkedOutputLoss
    assert _torchtune_mix(point(TORCHTUNE, "torchtune-2409-llama31-405b-qlora-a100x8")[0])[0]["loss"] == "standard"
    paged32 = torchtune(*point(TORCHTUNE, "torchtune-2404-llama2-7b-full-1x4090"))
    assert "paged 32-bit" in paged32.why_not()


def test_torchtune_a6000_rows_peak_is_listed_config_unstated(point):
    """The 2024-09 table names no config; on a 48 GB card its rows' peak cannot be tied to one."""
    a6000 = torchtune(*point(TORCHTUNE, "torchtune-2409-llama31-8b-lora-a6000-48gbx1"))
    why = {x.metric: x.reason for x in a6000.measures}
    assert why["peak_gib:allocated"].startswith("config not stated") and why["tokens_per_s_per_gpu"] is None
    rtx = torchtune(*point(TORCHTUNE, "torchtune-2409-llama31-8b-qlora-rtx4090-24gbx1"))
    assert all(x.reason is None for x in rtx.measures)


def test_torchtune_tutorial_figures_take_the_date_they_were_written(point):
    """The LoRA / QLoRA tutorials are cited at a later HEAD; their figures were written on 2024-04-15 (torchtune 0.1:
    GB of 1e9 bytes, its alpaca builders' max_seq_len 512)."""
    m = torchtune(*point(TORCHTUNE, "torchtune-tut-lora-llama2-7b-r64-all"))
    scn = load_scenario(m.scenario)
    assert scn.recipe.name == "torchtune-0.1" and scn.workload.seq_len == 512 and scn.mix.lora_rank == 64
    assert {x.metric: x.value for x in m.measures}["peak_gib:reserved"] == pytest.approx(17.04e9 / 2**30)
    # the tutorials quote one run twice: the repeat is listed, so it counts once
    dup = torchtune(*point(TORCHTUNE, "torchtune-tut-lora-llama2-7b-reserved"))
    assert dup.scenario is None and "same run" in dup.why_not()
