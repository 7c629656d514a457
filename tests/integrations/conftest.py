"""Tiny real models for the integration tests: a bundled Llama config shrunk to 2 layers x 64."""
from __future__ import annotations

import pytest

from ftscope import catalog


@pytest.fixture(scope="session")
def tiny_config():
    from ftscope.measure.runtime.configs import shrink_config

    return shrink_config(catalog.model_config("llama-3.2-1b"), layers=2, hidden=64, vocab=256)


@pytest.fixture
def tiny_model(tiny_config):
    """A freshly built fp32 tiny Llama (seeded), no adapters."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(**tiny_config)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)


@pytest.fixture
def tiny_lora(tiny_model):
    peft = pytest.importorskip("peft")
    return peft.get_peft_model(tiny_model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))


def padded_samples(n: int, length: int, seed: int = 0) -> list[dict]:
    """n samples of `length` tokens, each padded after a seeded number of real ones (labels -100 on padding)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, 256, (length,), generator=g)
        real = int(torch.randint(length // 2, length + 1, (1,), generator=g))
        mask = (torch.arange(length) < real).long()
        out.append({"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)})
    return out
