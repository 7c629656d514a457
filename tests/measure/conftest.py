"""Shared fixtures of the measure tests."""
from __future__ import annotations

import pytest

import ftscope
from ftscope import catalog


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """A real (tiny) Hugging Face checkpoint on disk: a shrunk Mixtral saved with save_pretrained (safetensors)."""
    import json

    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ftscope.measure.runtime.build import build_model
    from ftscope.measure.runtime.configs import shrink_config

    folder = tmp_path_factory.mktemp("ckpt")
    cfg = shrink_config(catalog.model_config("mixtral-8x7b"), layers=1, hidden=64, vocab=128, experts=4)
    (folder / "config.json").write_text(json.dumps(cfg))
    scn = ftscope.load_scenario({"model": str(folder / "config.json"), "mix": {"method": "full", "precision": "bf16"},
                                 "workload": {"micro_batch_size": 1, "seq_len": 16}})
    torch.manual_seed(123)
    model, _ = build_model(scn, device="cpu")
    model.save_pretrained(folder)
    return folder, {k: v.clone() for k, v in model.state_dict().items()}
