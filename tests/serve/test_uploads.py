"""Uploads: size-limited, stored once by content hash under the server's temp dir; dataset statistics."""
from __future__ import annotations

import json

import pytest

from ftscope.errors import FtscopeError
from ftscope.serve.uploads import LIMITS, TooLarge, Uploads, dataset_stats, length_stats

from .conftest import ROOT


def test_the_same_file_is_stored_once_under_the_root(tmp_path):
    up = Uploads(tmp_path / "u")
    ref = up.save("tokenizer", b"{}")
    assert ref == up.save("tokenizer", b"{}") and ref.startswith("upload:")
    assert up.path("tokenizer", ref) == tmp_path / "u" / "tokenizer" / ref[7:] / "tokenizer.json"
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [up.path("tokenizer", ref)]
    with pytest.raises(FtscopeError, match="is not on this server"):
        up.path("config", ref)  # another kind
    with pytest.raises(FtscopeError, match="is not on this server"):
        up.path("tokenizer", "upload:../../etc/passwd")


def test_size_limits(tmp_path):
    up = Uploads(tmp_path, total_limit=100)
    with pytest.raises(TooLarge, match="limited to 1 MiB"):
        up.save("config", b"x" * (LIMITS["config"] + 1))
    up.save("sample", b"a" * 60)
    with pytest.raises(TooLarge, match="restart it"):
        up.save("sample", b"b" * 60)


def test_a_config_is_checked_before_it_is_kept(tmp_path):
    up = Uploads(tmp_path)
    info = up.save_config((ROOT / "examples" / "tiny-mixtral" / "config.json").read_bytes())
    assert info["moe"] is True and up.path("config", info["ref"]).is_file()
    with pytest.raises(FtscopeError, match="model_type"):
        up.save_config(json.dumps({"hidden_size": 8}).encode())
    assert [p.name for p in tmp_path.rglob("*.json")] == ["config.json"]


def test_length_statistics():
    assert length_stats(list(range(1, 101))) == {"num_samples": 100, "mean_tokens": 50.5, "median_tokens": 50.5,
                                                 "p99_tokens": 99, "max_tokens": 100}
    assert length_stats([7]) == {"num_samples": 1, "mean_tokens": 7, "median_tokens": 7, "p99_tokens": 7, "max_tokens": 7}


def test_dataset_stats_say_which_file_is_wrong(tmp_path):
    sample = tmp_path / "s.jsonl"
    sample.write_text('{"text": "one two three"}\n{"prompt": "four", "response": "five"}\n')
    stats = dataset_stats(sample, ROOT / "data" / "moe-demo" / "tokenizer.json")
    assert stats["num_samples"] == 2 and stats["max_tokens"] >= stats["mean_tokens"] > 0
    not_a_tokenizer = tmp_path / "t.json"
    not_a_tokenizer.write_text("{}")
    with pytest.raises(FtscopeError, match="the tokenizer is not a tokenizers JSON file"):
        dataset_stats(sample, not_a_tokenizer)
    sample.write_text("{oops\n")
    with pytest.raises(FtscopeError, match=r"^the JSONL sample:1: not JSON"):
        dataset_stats(sample, ROOT / "data" / "moe-demo" / "tokenizer.json")
