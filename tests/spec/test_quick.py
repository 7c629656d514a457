"""QuickFlags: each flag sets one scenario key, with its value checked and a one-line error naming the flag."""
from __future__ import annotations

import pytest

from ftscope import FtscopeError
from ftscope.spec.quick import QuickFlags
from ftscope.spec.scenario import load_scenario


def test_each_flag_sets_its_key():
    keys = QuickFlags(model="llama-3.1-8b", gpu="4090", gpus=4, method="qlora", seq=4096, batch="max",
                      checkpointing=False, attention="flash", zero=2).keys()
    assert keys == {"model": "llama-3.1-8b", "hardware.gpu": "rtx-4090", "hardware.gpus_per_node": 4,
                    "hardware.nodes": 1, "mix.method": "qlora", "mix.attention": "flash", "mix.zero_stage": 2,
                    "mix.gradient_checkpointing": False, "workload.seq_len": 4096, "workload.micro_batch_size": "max"}
    assert QuickFlags().keys() == {} and not QuickFlags().given and QuickFlags(seq=1).given


def test_more_than_a_node_is_whole_8_gpu_nodes():
    assert QuickFlags(gpus=16).keys() == {"hardware.gpus_per_node": 8, "hardware.nodes": 2}
    with pytest.raises(FtscopeError, match="--gpus must be 1 to 8, or a multiple of 8"):
        QuickFlags(gpus=12).keys()


@pytest.mark.parametrize("flags, needle", [
    (dict(method="dora"), "--method must be one of full, lora, qlora; got 'dora'"),
    (dict(attention="flash4"), "--attention must be one of eager, sdpa"),
    (dict(zero=4), "--zero must be one of 0, 1, 2, 3"),
    (dict(seq=0), "--seq must be a number of tokens"),
    (dict(batch="-3"), "--batch must be a micro-batch size"),
    (dict(batch="4.5"), "--batch must be a micro-batch size"),
    (dict(gpus=0), "--gpus must be"),
    (dict(gpu="h100-90gb"), "unknown GPU"),
    (dict(model=" "), "--model needs"),
])
def test_bad_values_name_the_flag(flags, needle):
    with pytest.raises(FtscopeError) as err:
        QuickFlags(**flags).keys()
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_overrides_are_the_keys_and_load_as_typed_values():
    flags = QuickFlags(model="llama-3.2-1b", seq=512, batch="8", checkpointing=True)
    assert sorted(flags.overrides()) == ["mix.gradient_checkpointing=true", 'model="llama-3.2-1b"',
                                         "workload.micro_batch_size=8", "workload.seq_len=512"]
    scn = load_scenario({}, flags.overrides())
    assert scn.workload.micro_batch_size == 8 and scn.mix.gradient_checkpointing is True
    assert scn.model.name == "llama-3.2-1b"
