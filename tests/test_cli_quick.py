"""The one-line question: flags for the common keys on estimate, plan and recommend (the same answer as the
equivalent scenario file, byte for byte), their order against a file and overrides, and `ftscope init`."""
from __future__ import annotations

import json

import pytest
import yaml

from ftscope.cli import main

QUESTION = ["--model", "llama-3.1-8b", "--gpu", "rtx-4090", "--method", "qlora", "--seq", "4096"]
FILE = {"model": "llama-3.1-8b", "hardware": {"gpu": "rtx-4090"}, "mix": {"method": "qlora"},
        "workload": {"seq_len": 4096}}


def run(capsys, monkeypatch, *args) -> tuple[int, str, str]:
    """`ftscope ARGS` in this process: (exit code, stdout, stderr)."""
    monkeypatch.setattr("sys.argv", ["ftscope", *map(str, args)])
    with pytest.raises(SystemExit) as done:
        main()
    out = capsys.readouterr()
    return done.value.code, out.out, out.err


@pytest.fixture
def scenario_file(tmp_path):
    p = tmp_path / "q.yaml"
    p.write_text(yaml.safe_dump(FILE))
    return p


@pytest.mark.parametrize("verb, extra", [("estimate", []), ("plan", ["--counts", "1,2"]),
                                         ("recommend", ["--top", "2"])])
def test_the_flags_answer_as_the_scenario_file_does(capsys, monkeypatch, scenario_file, verb, extra):
    code_f, by_flags, _ = run(capsys, monkeypatch, verb, *QUESTION, *extra, "--json")
    gpu = ["--gpus", "rtx-4090"] if verb == "plan" else []
    code_s, by_file, _ = run(capsys, monkeypatch, verb, scenario_file, *gpu, *extra, "--json")
    assert code_f == code_s == 0
    if verb == "recommend":  # the search's own wall time differs between two runs
        by_flags, by_file = (json.dumps({**json.loads(t), "search": None}) for t in (by_flags, by_file))
    assert by_flags == by_file


def test_scenario_file_then_flags_then_overrides(capsys, monkeypatch, scenario_file):
    _, out, _ = run(capsys, monkeypatch, "estimate", scenario_file, "--method", "lora", "--gpus", "2", "--batch", "max",
                    "--zero", "2", "--attention", "flash", "--no-checkpointing", "--json")
    s = json.loads(out)["scenario"]
    assert (s["mix"]["method"], s["mix"]["zero_stage"], s["mix"]["attention"]) == ("lora", 2, "flash")
    assert s["hardware"]["gpus_per_node"] == 2 and s["workload"]["seq_len"] == 4096
    _, out, _ = run(capsys, monkeypatch, "estimate", scenario_file, "--method", "lora", "mix.method=full",
                    "hardware.gpu=h100-80gb", "--json")
    s = json.loads(out)["scenario"]
    assert s["mix"]["method"] == "full" and s["hardware"]["gpu"] == "h100-80gb"


def test_without_a_file_a_first_override_is_not_taken_for_one(capsys, monkeypatch):
    code, out, err = run(capsys, monkeypatch, "estimate", "mix.lora_rank=8", *QUESTION, "--json")
    assert code == 0, err
    assert json.loads(out)["scenario"]["mix"]["lora_rank"] == 8


@pytest.mark.parametrize("args, needle", [
    (["estimate"], "give a SCENARIO file or --model"),
    (["estimate", "--model", "llama-3.1-8b"], "give --seq N"),
    (["estimate", *QUESTION, "--method", "dora"], "--method must be one of full, lora, qlora"),
    (["estimate", *QUESTION, "--batch", "lots"], "--batch must be"),
    (["plan", *QUESTION, "--zero", "5"], "--zero must be one of 0, 1, 2, 3"),
    (["recommend", *QUESTION, "--gpus", "0"], "GPU count in '0' must be from 1 to 4096"),
])
def test_bad_flags_are_one_line_errors(capsys, monkeypatch, args, needle):
    code, out, err = run(capsys, monkeypatch, *args)
    assert code == 2 and out == ""
    assert err.startswith("ftscope: error:") and needle in err and len(err.strip().splitlines()) == 1


def test_recommend_gpus_n_searches_up_to_n_of_the_scenario_gpu(capsys, monkeypatch):
    code, out, _ = run(capsys, monkeypatch, "recommend", *QUESTION, "--checkpointing", "--gpus", "2", "--top", "1",
                       "--json")
    counts = {r["scenario"]["hardware"]["gpus_per_node"] for r in json.loads(out)["rows"]}
    gpus = {r["scenario"]["hardware"]["gpu"] for r in json.loads(out)["rows"]}
    assert code == 0 and counts <= {1, 2} and gpus == {"rtx-4090"}


def test_init_writes_a_template_that_answers_like_the_flags(capsys, monkeypatch, tmp_path):
    out_file = tmp_path / "s.yaml"
    code, _, err = run(capsys, monkeypatch, "init", *QUESTION, "--out", out_file)
    assert code == 0 and f"wrote {out_file}" in err
    text = out_file.read_text()
    assert "# full | lora | qlora" in text and "method: qlora" in text
    _, from_template, _ = run(capsys, monkeypatch, "estimate", out_file, "--json")
    _, from_flags, _ = run(capsys, monkeypatch, "estimate", *QUESTION, "--json")
    assert from_template == from_flags
    code, printed, _ = run(capsys, monkeypatch, "init")
    assert code == 0 and printed.startswith("# ftscope scenario") and yaml.safe_load(printed)["mix"]["method"] == "lora"
