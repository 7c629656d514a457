"""A shrunk real Mixtral (random weights), a word-level tokenizer and an Alpaca-style data set, made on disk for
llmtuner to load the way the study loaded Mixtral-8x7B and its CS / MATH files. Nothing is downloaded."""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tracking import REPO

WORDS = 2000  # + 5 special tokens < VOCAB


VOCAB = 2048
"""Shrunk vocabulary: the loss terms scale with it (fp32 log-softmax, V x 4 bytes per token) but hold no layer's
tensor; Mixtral's 32,000 would make the CPU step several times slower for a term the estimator already has."""


def mixtral_config(layers: int, hidden: int, top_k: int) -> dict[str, Any]:
    """mistralai/Mixtral-8x7B-v0.1's config (ftscope's bundled copy) shrunk by ftscope's shrink_config: fewer
    layers, smaller hidden (heads, KV heads and the expert width follow), all 8 experts, vocab VOCAB."""
    sys_path = str(REPO / "src")
    import sys

    if sys_path not in sys.path:
        sys.path.insert(0, sys_path)
    from ftscope.measure.runtime.configs import shrink_config

    cfg = json.loads((REPO / "src/ftscope/catalog/models/mixtral-8x7b.json").read_text())
    out = shrink_config(cfg, layers=layers, hidden=hidden, vocab=VOCAB)
    out["num_experts_per_tok"] = top_k  # the study's sed on config.json: 2 = sparse, 8 = dense
    return out


def make_tokenizer(folder: Path) -> None:
    """Word-level tokenizer with Mixtral's special ids (<unk> 0, <s> 1, </s> 2)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "[INST]": 3, "[/INST]": 4}
    vocab.update({f"w{i}": 5 + i for i in range(WORDS)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(str(folder))


def make_model_dir(folder: Path, layers: int, hidden: int, top_k: int, seed: int = 0) -> Path:
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cfg = MixtralConfig(**{k: v for k, v in mixtral_config(layers, hidden, top_k).items()
                           if k not in ("architectures", "transformers_version", "torch_dtype")})
    model = MixtralForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(str(folder), safe_serialization=True)
    (folder / "config.json").write_text(json.dumps({**json.loads((folder / "config.json").read_text()),
                                                    "torch_dtype": "bfloat16"}, indent=1))
    make_tokenizer(folder)
    return folder


def make_dataset(folder: Path, samples: int, words: int, seed: int = 0) -> Path:
    """Alpaca-format samples (instruction, input, output) of `words` words each in instruction and output, so
    that llmtuner's cutoff_len, not the data, sets the sequence length."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)

    def text() -> str:
        return " ".join(f"w{rng.randrange(WORDS)}" for _ in range(words))

    rows = [{"instruction": text(), "input": "", "output": text()} for _ in range(samples)]
    (folder / "probe.json").write_text(json.dumps(rows))
    (folder / "dataset_info.json").write_text(json.dumps({"probe": {"file_name": "probe.json"}}))
    return folder
