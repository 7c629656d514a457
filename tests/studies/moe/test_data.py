"""The MoE study's data (studies/moe/data.py, tokenizer.py): items, baselines, training items and batches."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

from ftscope import FtscopeError  # noqa: E402
from ftscope.studies.moe.data import baselines, load_samples, shuffled_batches, train_item  # noqa: E402
from ftscope.studies.moe.tokenizer import load_tokenizer  # noqa: E402

DEMO = Path(__file__).resolve().parents[3] / "data" / "moe-demo"


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(DEMO / "tokenizer.json")


def test_items_qa_and_multiple_choice(tmp_path, tok):
    tokenizer, eos = tok
    rows = [json.loads(line) for line in (DEMO / "train.jsonl").read_text().splitlines()[:40]]
    samples, cut = load_samples(_jsonl(tmp_path / "t.jsonl", rows), tokenizer)
    assert cut == 0 and len(samples) == 40
    for s, r in zip(samples, rows):
        assert s.mc == ("choices" in r) and s.task == r.get("task", "mc" if s.mc else "qa")
        assert len(s.targets) == (len(r["choices"]) if s.mc else 1)
        ids, labels = train_item(s, eos)
        assert len(ids) == len(labels) and labels[: len(s.prompt)] == [-100] * len(s.prompt)
        assert ids[len(s.prompt):] == s.targets[s.answer] + [eos]  # the loss sees the right answer and EOS


def test_long_prompts_lose_their_start_and_an_answer_longer_than_the_cutoff_is_refused(tmp_path, tok):
    tokenizer, _ = tok
    long = {"prompt": " ".join(["what is 2 plus 3 ?"] * 20), "answer": "5"}
    (s,), cut = load_samples(_jsonl(tmp_path / "a.jsonl", [long]), tokenizer, cutoff=16)
    assert cut == 1 and len(s.prompt) + len(s.targets[0]) + 1 <= 16
    with pytest.raises(FtscopeError, match="longer than the 2-token cutoff"):
        load_samples(_jsonl(tmp_path / "b.jsonl", [{"prompt": "x", "answer": "1 2 3"}]), tokenizer, cutoff=2)


def test_baselines_are_chance_and_the_most_common_answer(tmp_path, tok):
    tokenizer, _ = tok
    train, _ = load_samples(_jsonl(tmp_path / "t.jsonl", [{"prompt": "a", "answer": "5"}] * 3
                                   + [{"prompt": "b", "answer": "7"}]), tokenizer)
    evals, _ = load_samples(_jsonl(tmp_path / "e.jsonl", [
        {"prompt": "c", "answer": "5"}, {"prompt": "d", "answer": "7"},
        {"prompt": "e", "choices": ["x", "y"], "answer": "B"}, {"prompt": "f", "choices": ["x", "y", "z"], "answer": 0},
    ]), tokenizer)
    b = baselines(train, evals)
    assert b["qa"] == {"kind": "qa", "items": 2, "chance": None, "baseline": 0.5}
    assert b["mc"]["chance"] == pytest.approx((1 / 2 + 1 / 3) / 2) and evals[2].answer == 1


def test_shuffled_batches_cover_every_item_once():
    items = [([i], [i]) for i in range(10)]
    batches = shuffled_batches(items, 4, random.Random(0))
    assert [len(b) for b in batches] == [4, 4, 2] and sorted(i for b in batches for i in b) == list(range(10))
    assert batches == shuffled_batches(items, 4, random.Random(0))
