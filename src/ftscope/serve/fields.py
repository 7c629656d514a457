"""Which input a one-line FtscopeError is about, so the page can show it next to that field.

The message is the CLI's, unchanged. The field comes from the error itself when it carries one (a `field`
attribute), else from the scenario key the message names (`mix.lora_rank must be ...`), else from the words
of the messages that name no key (`offload: optimizer needs ...`, `unknown GPU 'x'`).
"""
from __future__ import annotations

import re
from typing import Any

from ..errors import FtscopeError

_KEY_PATH = re.compile(r"\b(?:hardware|mix|workload|price)(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_BY_WORDS = (
    # (words in the message, field): first match wins, so the narrower phrases come first
    ("unknown gpu", "hardware.gpu"),
    ("unknown model", "model"),
    ("config.json", "model"),
    ("model_type", "model"),
    ("num_attention_heads", "model"),
    ("experts per token", "model"),
    ("lora target", "mix.lora_targets"),
    ("offload", "mix.offload"),
    ("fsdp and zero_stage", "mix.fsdp"),
    ("flashattention", "mix.attention"),
    ("grouped_mm", "mix.experts_backend"),
    ("qlora computes", "mix.precision"),
    ("bf16 support", "mix.precision"),
    ("seq_len", "workload.seq_len"),
    ("sequence length", "workload.seq_len"),
    ("uploaded config", "model"),
    ("text field", "dataset.field"),
    ("tokenizer", "dataset.tokenizer"),
    ("jsonl", "dataset.sample"),
)


def field_of(exc: FtscopeError) -> str | None:
    """The scenario key (`mix.offload`, `model`, ...) the error is about, or None for the scenario as a whole."""
    carried = getattr(exc, "field", None)
    if isinstance(carried, str) and carried:
        return carried
    text = str(exc)
    unknown_key = re.match(r"unknown key '([^']+)'", text)
    if unknown_key:  # the key that is not a field: its section is where to say so
        return unknown_key.group(1).rsplit(".", 1)[0] if "." in unknown_key.group(1) else None
    path = _KEY_PATH.search(text)
    if path:
        return path.group(0)
    low = text.lower()
    return next((field for words, field in _BY_WORDS if words in low), None)


def error_body(exc: FtscopeError) -> dict[str, Any]:
    """What every API answers for bad input: the CLI's one-line message and the field it is about."""
    return {"error": str(exc), "field": field_of(exc)}
