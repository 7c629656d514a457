#!/usr/bin/env python3
"""Generate the bundled MoE-study demo data: data/moe-demo/{train,eval}.jsonl and tokenizer.json.

The IISWC study fine-tunes on a math set (exact-match answers, GSM8K-style) and a commonsense set (multiple
choice, HellaSwag-style). This script makes small synthetic stand-ins for both, so `ftscope study moe` runs on
any machine without downloads:

- arithmetic (QA, exact match): one-step word problems, "Tom has 3 apples . He buys 4 more . How many apples
  does Tom have now ? Answer :" -> "7". Operands 1..9, addition and subtraction (never negative).
- commonsense (multiple choice, scored by log-likelihood): "Which is a fruit : a hammer , an apple or a bus ?
  Answer :" with choices ["hammer", "apple", "bus"] and answer 1; six categories of eight words, two wordings
  each. Tried first and dropped: comparisons ("Which is heavier : a feather or a brick ? A ) feather B ) brick")
  answered by letter stayed at chance, and answered by word barely left it, within the few CPU minutes the demo
  has; a 2-layer model from random weights learns a property of each word far faster than an ordering.

Eval items never appear verbatim in train. Arithmetic eval sentences are new (held-out name x object x template
combinations) but the number facts recur: the model must read the operands and the operation out of a sentence
it has not seen. A commonsense eval item's right word never meets either of its distractors in a training item,
so only a model that learned what each word is, not which strings go together, answers it.

Everything is seeded (`--seed`), so the output is byte-identical on every run. The tokenizer is a WordLevel
model trained with the `tokenizers` library on the generated text (whitespace and punctuation split, every word
one token, vocabulary well under the 512 of the bundled tiny Mixtral) with [PAD], [UNK], [BOS] and [EOS].

    python scripts/make_moe_demo_data.py            # writes data/moe-demo/
"""
from __future__ import annotations

import argparse
import json
import random
from itertools import product
from pathlib import Path
from typing import Any

NAMES = ["Tom", "Ann", "Sam", "Mia", "Leo", "Eva", "Ben", "Zoe", "Max", "Ivy", "Dan", "Amy", "Joe", "Kim",
         "Ray", "Liz"]
PRONOUN = {n: ("She" if n in {"Ann", "Mia", "Eva", "Zoe", "Ivy", "Amy", "Kim", "Liz"} else "He") for n in NAMES}
OBJECTS = ["apples", "pens", "books", "cards", "coins", "shells", "stamps", "rocks", "cookies", "marbles",
           "stickers", "candles"]

ADD = [
    "{n} has {a} {o} . {p} buys {b} more . How many {o} does {n} have now ?",
    "There are {a} {o} in a box . {n} puts {b} more in the box . How many {o} are in the box now ?",
    "{n} found {a} {o} on Monday and {b} {o} on Tuesday . How many {o} did {n} find in all ?",
]
SUB = [
    "{n} has {a} {o} . {p} gives {b} to {m} . How many {o} does {n} have left ?",
    "There are {a} {o} in a box . {n} takes {b} out of the box . How many {o} are in the box now ?",
    "{n} had {a} {o} and lost {b} of them . How many {o} does {n} have left ?",
]

# Categories for the multiple choice: the model must learn which category every word belongs to.
CATEGORIES: dict[str, tuple[list[str], list[str]]] = {
    "animal": (["horse", "dog", "cat", "cow", "sheep", "mouse", "duck", "rabbit"],
               ["Which is an animal", "Which one is alive"]),
    "fruit": (["apple", "banana", "grape", "lemon", "peach", "cherry", "orange", "pear"],
              ["Which is a fruit", "Which one can you eat"]),
    "tool": (["hammer", "saw", "drill", "wrench", "shovel", "axe", "rake", "chisel"],
             ["Which is a tool", "Which one do you work with"]),
    "vehicle": (["car", "bus", "truck", "train", "bicycle", "boat", "plane", "tractor"],
                ["Which is a vehicle", "Which one can you ride in"]),
    "furniture": (["chair", "table", "sofa", "bed", "desk", "shelf", "stool", "cabinet"],
                  ["Which is furniture", "Which one can you sit on"]),
    "clothing": (["shirt", "coat", "hat", "sock", "scarf", "glove", "boot", "dress"],
                 ["Which is clothing", "Which one can you wear"]),
}
SPECIAL = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]


def article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def arithmetic(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, eval) word problems; an eval sentence's (template, name, object) never occurs in train."""
    combos = list(product(range(len(ADD) + len(SUB)), NAMES, OBJECTS))
    rng.shuffle(combos)
    held = set(combos[: len(combos) // 5])  # 20 % of the sentence frames are eval-only

    def make(frame: tuple[int, str, str]) -> dict[str, Any]:
        t, n, o = frame
        m = rng.choice([x for x in NAMES if x != n])
        if t < len(ADD):
            a, b = rng.randint(1, 9), rng.randint(1, 9)
            text, ans = ADD[t], a + b
        else:
            a = rng.randint(2, 9)
            b = rng.randint(1, a)
            text, ans = SUB[t - len(ADD)], a - b
        prompt = text.format(n=n, p=PRONOUN[n], m=m, a=a, b=b, o=o) + " Answer :"
        return {"task": "arithmetic", "prompt": prompt, "answer": str(ans)}

    train_frames = [c for c in combos if c not in held]
    eval_frames = sorted(held)
    train = [make(rng.choice(train_frames)) for _ in range(1500)]
    evals = [make(rng.choice(eval_frames)) for _ in range(250)]
    return train, evals


def commonsense(rng: random.Random) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, eval) three-choice category questions; an eval item's right word never appears in train
    together with either of its distractors (in any order or wording), so only a model that learned what each
    word is, not which strings go together, answers it."""
    words = {w: c for c, (ws, _) in CATEGORIES.items() for w in ws}

    def make(cat: str) -> dict[str, Any]:
        right = rng.choice(CATEGORIES[cat][0])
        others = rng.sample([w for w in words if words[w] != cat], 2)
        choices = [right, *others]
        rng.shuffle(choices)
        a, b, c = (f"{article(w)} {w}" for w in choices)
        prompt = f"{rng.choice(CATEGORIES[cat][1])} : {a} , {b} or {c} ? Answer :"
        return {"task": "commonsense", "prompt": prompt, "choices": choices, "answer": choices.index(right)}

    cats = list(CATEGORIES)
    evals = [make(rng.choice(cats)) for _ in range(250)]
    held = {frozenset((e["choices"][e["answer"]], d)) for e in evals for d in e["choices"] if d != e["choices"][e["answer"]]}
    train: list[dict[str, Any]] = []
    while len(train) < 900:
        item = make(rng.choice(cats))
        if not any(frozenset((d, o)) in held for d in item["choices"] for o in item["choices"] if d != o):
            train.append(item)
    return train, evals


def train_tokenizer(texts: list[str], path: Path) -> int:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace()])
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    trainer = trainers.WordLevelTrainer(vocab_size=512, min_frequency=1, special_tokens=SPECIAL)
    tok.train_from_iterator(texts, trainer)
    bos = tok.token_to_id("[BOS]")
    # Every encoded prompt starts with [BOS], as Llama/Mixtral tokenizers start with <s>.
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", bos)])
    tok.enable_padding(pad_id=tok.token_to_id("[PAD]"), pad_token="[PAD]")
    tok.no_padding()  # the study pads itself; padding config is only kept as metadata
    path.write_text(tok.to_str(pretty=False) + "\n")
    # tokenizer_config.json names the special tokens the way HF model folders do.
    (path.parent / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]"}, indent=1) + "\n")
    return tok.get_vocab_size()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "data" / "moe-demo"))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    a_train, a_eval = arithmetic(rng)
    c_train, c_eval = commonsense(rng)
    train, evals = a_train + c_train, a_eval + c_eval
    rng.shuffle(train)
    rng.shuffle(evals)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train.jsonl", train), ("eval.jsonl", evals)):
        with (out / name).open("w") as fh:
            for r in rows:
                fh.write(json.dumps(r, separators=(",", ":")) + "\n")
    texts = [r["prompt"] + " " + (r["answer"] if isinstance(r["answer"], str) else " ".join(r["choices"]))
             for r in train]  # vocabulary from train only: eval must not add words
    vocab = train_tokenizer(texts, out / "tokenizer.json")
    size = sum(p.stat().st_size for p in out.iterdir())
    print(f"{out}: train {len(train)} ({len(a_train)} arithmetic, {len(c_train)} commonsense), eval {len(evals)} "
          f"({len(a_eval)} arithmetic, {len(c_eval)} commonsense), vocab {vocab}, {size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
