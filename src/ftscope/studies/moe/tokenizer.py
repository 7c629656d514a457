"""The study's tokenizer: a local tokenizer.json (or a model folder holding one), never a download, and its EOS."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ...errors import FtscopeError

EOS_NAMES = ("</s>", "<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "<eos>", "[EOS]", "<|eot_id|>")
"""End-of-sequence token names tried in order after the one a model folder's tokenizer_config.json names."""


def load_tokenizer(path: str | Path) -> tuple[Any, int | None]:
    """(tokenizers.Tokenizer, eos id) of a tokenizer.json or a folder holding one (no network)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise FtscopeError("study moe needs the tokenizers package: pip install 'ftscope[measure]'") from None
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    p = p / "tokenizer.json" if p.is_dir() else p
    if not p.is_file():
        raise FtscopeError(f"tokenizer not found: {p} (give a tokenizer.json or a folder with one)")
    tok = Tokenizer.from_file(str(p))
    names = list(EOS_NAMES)
    cfg = folder / "tokenizer_config.json"
    if cfg.is_file():  # HF model folders name their EOS here
        eos = json.loads(cfg.read_text()).get("eos_token")
        eos = eos.get("content") if isinstance(eos, dict) else eos
        if isinstance(eos, str):
            names.insert(0, eos)
    return tok, next((tok.token_to_id(n) for n in names if tok.token_to_id(n) is not None), None)
