"""The study's tokenizer: a local tokenizer.json (or a model folder holding one), never a download, and its EOS."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ...files import parse_json, read_text

EOS_NAMES = ("</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "<eos>", "[EOS]", "<|eot_id|>")
"""End-of-sequence token names tried in order after the one a model folder's tokenizer_config.json names."""


def load_tokenizer(path: str | Path) -> tuple[Any, int | None]:
    """(tokenizers.Tokenizer, eos id) of a tokenizer.json or a folder holding one (no network)."""
    from ...measure.runtime.batches import load_tokenizer as read_tokenizer

    p = Path(path)
    folder = p if p.is_dir() else p.parent
    tok = read_tokenizer(p)
    names = list(EOS_NAMES)
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():  # HF model folders name their EOS here
        settings = parse_json(read_text(cfg, "tokenizer_config.json"), f"tokenizer_config.json at {cfg}")
        eos = settings.get("eos_token") if isinstance(settings, dict) else None
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str):
            names.insert(0, eos)
    return tok, next((tok.token_to_id(n) for n in names if tok.token_to_id(n) is not None), None)
