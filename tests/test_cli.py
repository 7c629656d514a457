"""The `ftscope` command: JSON on stdout only, exit codes, one-line errors, every verb's --help."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ftscope.cli import app

REPO = Path(__file__).resolve().parents[1]
IISWC = str(REPO / "examples" / "iiswc-mixtral-qlora.yaml")
_SCRIPT = Path(sys.executable).parent / "ftscope"
FTSCOPE = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "ftscope.cli"]


def ftscope(*args, cwd=REPO):
    return subprocess.run([*FTSCOPE, *map(str, args)], capture_output=True, text=True, cwd=cwd)


def ok_json(*args):
    r = ftscope(*args)
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    return json.loads(r.stdout)  # nothing but one JSON document on stdout


def assert_user_error(r, *needles):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("ftscope: error:")
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture
def dense(tmp_path):
    p = tmp_path / "dense.yaml"
    p.write_text(yaml.safe_dump({"model": "llama-3.2-1b", "hardware": {"gpu": "a100-80gb"},
                                 "mix": {"method": "lora", "attention": "sdpa"},
                                 "workload": {"micro_batch_size": 2, "seq_len": 512, "num_samples": 1000}}))
    return p


# --- JSON outputs ---------------------------------------------------------------------------------------------

def test_estimate_json_contract():
    d = ok_json("estimate", IISWC, "--json")
    mem = d["memory"]
    assert mem["peak_gib"] > 0 and isinstance(mem["fits"], bool) and mem["capacity_gib"] > 0
    assert set(mem["breakdown_gib"]) >= {"weights", "gradients", "optimizer", "activations", "temporary", "overhead"}
    assert mem["peak_phase"] in {"forward", "backward", "optimizer"}
    assert d["limits"]["max_micro_batch_size"] >= 1 and d["limits"]["max_seq_len"] >= 1
    t = d["time"]
    for k in ("step_s", "tokens_per_s", "samples_per_s", "mfu"):
        assert t[k] > 0
    assert set(t["breakdown_s"]) >= {"forward", "backward", "recompute", "optimizer", "communication", "dequant", "other"}
    for k in ("hours", "gpu_hours", "usd"):
        assert d["run"][k] > 0
    assert d["scenario"]["model"] == "mixtral-8x7b"


def test_estimate_overrides_apply():
    top2 = ok_json("estimate", IISWC, "--json")
    top8 = ok_json("estimate", IISWC, "mix.experts_top_k=8", "--json")
    assert top8["scenario"]["mix"]["experts_top_k"] == 8
    assert top8["limits"]["max_micro_batch_size"] < top2["limits"]["max_micro_batch_size"]
    safe = ok_json("estimate", IISWC, "--json", "--margin", "0.2")
    assert safe["limits"]["max_micro_batch_size"] < top2["limits"]["max_micro_batch_size"]


def test_plan_json():
    d = ok_json("plan", IISWC, "--json")
    assert set(d) >= {"rows", "best"}
    assert d["rows"] and d["best"] is not None and d["best"]["memory"]["fits"]
    for r in d["rows"]:
        assert r["memory"]["fits"] or r["reason"]
    costs = [r["run"]["usd"] for r in d["rows"] if r["memory"]["fits"] and r["run"] and r["run"]["usd"] is not None]
    assert d["best"]["run"]["usd"] == min(costs)


def test_plan_options():
    d = ok_json("plan", IISWC, "--gpus", "a40,h100-80gb", "--counts", "1,2", "--by", "time", "--json")
    assert {(r["scenario"]["hardware"]["gpu"], r["scenario"]["hardware"]["gpus_per_node"]) for r in d["rows"]} == {
        ("a40", 1), ("a40", 2), ("h100-80gb", 1), ("h100-80gb", 2)}
    assert d["by"] == "time"
    hours = [r["run"]["hours"] for r in d["rows"] if r["memory"]["fits"]]
    assert d["best"]["run"]["hours"] == min(hours)


def test_catalog_verbs_json():
    models = ok_json("models", "--json")
    assert {"llama-2-7b", "mixtral-8x7b", "blackmamba-2.8b"} <= {m["name"] for m in models}
    gpus = ok_json("gpus", "--json")
    assert {"a40", "a100-80gb", "h100-80gb", "t4"} <= {g["key"] for g in gpus}
    show = ok_json("show", "mixtral-8x7b", "--json")
    assert show["total_params"] == 46_702_792_704 and show["active_params"] == 12_879_925_248


def test_validate_json():
    d = ok_json("validate", "--json")
    assert d["results"] and d["summary"]
    for v in d["summary"].values():
        assert 0 <= v["median"] <= v["max"]


@pytest.fixture
def small_cases(tmp_path):
    from ftscope.validate.cases import BUNDLED
    from importlib import resources
    data = yaml.safe_load(resources.files("ftscope").joinpath("data", BUNDLED).read_text())
    keep = [c for c in data["cases"] if c["id"] in ("iiswc-a40-mixtral-math-sparse", "torchtune-llama31-8b-lora-4090")]
    assert len(keep) == 2
    p = tmp_path / "cases.yaml"
    p.write_text(yaml.safe_dump({"cases": keep}))
    return p


def test_calibrate_cv_json(small_cases):
    d = ok_json("calibrate", "--cases", small_cases, "--cv", "all", "--json")
    assert set(d["shared"]) >= {"gemm_ampere", "bandwidth", "kernel_floor_us", "host_us_per_kernel"}
    assert d["provenance"]["points"] >= 5
    assert set(d["cross_validation"]) == {"leave_one_source_out", "leave_one_case_out", "leave_one_gpu_out",
                                          "leave_one_model_out", "per_gpu_leave_one_case_out"}
    # two sources (the IISWC series, torchtune's README): each held out in turn
    assert set(d["cross_validation"]["leave_one_source_out"]) == {"iiswc", "torchtune-readme-and-tutorials"}


def test_calibrate_cv_kind_is_checked(small_cases):
    assert_user_error(ftscope("calibrate", "--cases", small_cases, "--cv", "sources"), "--cv must be one of")


def test_calibrate_fits_profile_stores_too(small_cases):
    db = REPO / "data" / "measurements" / "gpu-timing.sqlite"
    d = ok_json("calibrate", "--cases", small_cases, "--db", db, "--json")
    assert "h200" in d["provenance"]["gpus"] and any("gpu-timing" in s for s in d["provenance"]["sources"])
    assert "h200" in d["per_gpu"]  # 18 points: enough for its own refit
    own = d["provenance"]["per_gpu"]["h200"]
    assert own["points"] == 18 and own["in_sample_median_abs_pct_error_own"] < 25


def test_calibrate_out_feeds_estimate(small_cases, tmp_path, dense):
    out = tmp_path / "cal.json"
    r = ftscope("calibrate", "--cases", small_cases, "--out", out)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["shared"]
    d = ok_json("estimate", dense, "--calibration", out, "--json")
    assert d["time"]["step_s"] > 0


@pytest.mark.parametrize("args,needle", [
    (["models"], "mixtral-8x7b"),
    (["gpus"], "h100-80gb"),
    (["show", "mixtral-8x7b"], "46,702,792,704"),
    (["validate"], "iiswc"),
    (["plan", IISWC], "best:"),
    (["estimate", IISWC], "a40"),
])
def test_table_verbs_run(args, needle):
    r = ftscope(*args)
    assert r.returncode == 0, r.stderr
    assert needle in r.stdout


def test_recommend_json_has_the_top_rows_and_exact_counts(dense):
    d = ok_json("recommend", dense, "--gpus", "a100-80gb:2", "--top", "3", "--json")
    assert [r["memory"]["fits"] for r in d["rows"]][:3] == [True] * 3 and d["best"]["memory"]["fits"]
    counts = d["counts"]
    assert counts["feasible"] + sum(counts["reasons"].values()) == counts["candidates"] > 1000
    assert d["search"]["complete"] and d["search"]["exhaustive"] is False


def test_recommend_all_streams_every_configuration_as_json_lines(dense):
    r = ftscope("recommend", dense, "--gpus", "a100-80gb:1", "--all")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    summary = lines[-1]["summary"]
    assert len(lines) - 1 == summary["counts"]["candidates"]
    assert sum(row["memory"]["fits"] for row in lines[:-1]) == summary["counts"]["feasible"]
    assert summary["best"]["label"] in {row.get("label") for row in lines[:-1]}


def test_recommend_time_budget_says_how_much_it_covered(dense):
    d = json.loads(ftscope("recommend", dense, "--time-budget", "0.000001", "--json").stdout)
    assert d["search"]["complete"] is False and d["counts"]["unsearched"] > 0
    r = ftscope("recommend", dense, "--time-budget", "0.000001")
    assert r.returncode == 1 and "time budget reached" in r.stdout


def test_recommend_engine_restricts_the_search(dense):
    d = ok_json("recommend", dense, "--gpus", "a100-80gb:2", "--top", "3", "--engine", "fsdp", "--json")
    assert d["engine"] == "fsdp" and all(r["scenario"]["mix"]["fsdp"] for r in d["rows"])
    assert_user_error(ftscope("recommend", dense, "--engine", "megatron"), "--engine must be one of deepspeed, fsdp")


# --- exit codes and errors -----------------------------------------------------------------------------------

def test_check_exit_codes(dense):
    assert ftscope("estimate", dense, "--check").returncode == 0
    r = ftscope("estimate", dense, "model=llama-2-70b", "hardware.gpu=l4", "mix.method=full", "--check", "--json")
    assert r.returncode == 1
    d = json.loads(r.stdout)
    assert d["memory"]["fits"] is False and "does not fit" in d["reason"]
    # without --check a misfit is still a successful answer, which says so before any hours or dollars
    r = ftscope("estimate", dense, "model=llama-2-70b", "hardware.gpu=l4", "mix.method=full")
    assert r.returncode == 0
    assert r.stdout.startswith("does not fit: needs") and r.stdout.index("does not fit") < r.stdout.index("GPU-h")
    assert "short by" in r.stdout and d["memory"]["status"] == "does_not_fit" and d["memory"]["headroom_gib"] < 0


def test_estimate_states_headroom(dense):
    r = ftscope("estimate", dense)
    assert r.returncode == 0 and "headroom" in r.stdout and "free at the peak" in r.stdout and "tight" not in r.stdout
    tight = ftscope("estimate", dense, "workload.micro_batch_size=max", "--check")
    assert tight.returncode == 0 and "tight: " in tight.stdout and "under the 5 % margin" in tight.stdout


def test_unknown_model(dense):
    assert_user_error(ftscope("estimate", dense, "model=llama-9-7b"), "unknown model", "did you mean")


def test_unknown_gpu_with_suggestion(dense):
    assert_user_error(ftscope("estimate", dense, "hardware.gpu=h100-90gb"), "unknown GPU", "h100-80gb")


def test_missing_file(tmp_path):
    assert_user_error(ftscope("estimate", tmp_path / "nope.yaml"), "not found")


def test_malformed_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("model: [llama-2-7b\nmix: {method: lora\n")
    assert_user_error(ftscope("estimate", p), "malformed")


def test_unknown_key_names_the_nearest(dense):
    assert_user_error(ftscope("estimate", dense, "mix.metod=lora"), "unknown key", "method")


@pytest.mark.parametrize("override", ["workload.micro_batch_size=-4", "workload.micro_batch_size=0",
                                      "workload.seq_len=-1", "mix.zero_stage=5", "mix.method=dora"])
def test_out_of_range_values(dense, override):
    assert_user_error(ftscope("estimate", dense, override), override.split("=")[0])


def test_unsupported_mix_is_a_user_error(dense):
    assert_user_error(ftscope("estimate", dense, "hardware.gpu=t4", "mix.attention=flash", "mix.precision=fp16-mixed"),
                      "FlashAttention")


def test_plan_bad_options():
    assert_user_error(ftscope("plan", IISWC, "--by", "speed"), "--by")
    assert_user_error(ftscope("plan", IISWC, "--counts", "1,x"), "--counts")


def test_show_unknown_model():
    assert_user_error(ftscope("show", "mixtral-9x7b"), "unknown model")


def test_validate_malformed_cases(tmp_path):
    p = tmp_path / "cases.yaml"
    p.write_text("cases: [oops")
    assert_user_error(ftscope("validate", "--cases", p), "malformed")


# --- help -----------------------------------------------------------------------------------------------------

VERBS = [c.name or c.callback.__name__ for c in app.registered_commands]


def test_all_documented_verbs_exist():
    assert {"estimate", "plan", "models", "gpus", "show", "validate", "calibrate"} <= set(VERBS)


@pytest.mark.parametrize("verb", VERBS)
def test_help_of_every_verb(verb):
    r = CliRunner().invoke(app, [verb, "--help"])
    assert r.exit_code == 0, r.output
    assert "Usage" in r.output and verb in r.output


def test_top_level_help():
    r = CliRunner().invoke(app, ["--help"])
    assert r.exit_code == 0
    for verb in VERBS:
        assert verb in r.output


def test_in_process_estimate_json(dense):
    r = CliRunner().invoke(app, ["estimate", str(dense), "--json"])
    assert r.exit_code == 0
    assert json.loads(r.stdout)["memory"]["fits"] is True


def test_validate_corpus_json_and_reasons():
    d = ok_json("validate", "--corpus", "--source", "answerai-fsdp-qlora-benchmarks", "--json")
    assert set(d["coverage"]) == {"answerai-fsdp-qlora-benchmarks"}
    assert d["totals"]["points"] == 33 and d["totals"]["compared"] + d["totals"]["listed"] == 33
    r = ftscope("validate", "--corpus", "--source", "hf-blog-fsdp-llama2-70b", "--reasons")
    assert r.returncode == 0 and "not compared" in r.stdout and "hfblog-fsdp-llama2-70b-chat-16xa100" in r.stdout
    assert_user_error(ftscope("validate", "--corpus", "--source", "nope"), "unknown corpus source")


FRAMEWORKS = REPO / "examples" / "frameworks"


def test_framework_config_estimate_shows_the_mapped_scenario_and_lists_unmapped_keys():
    r = ftscope("estimate", FRAMEWORKS / "axolotl-llama-3-qlora.yml", "--show-scenario", "hardware.gpu=h100-80gb")
    assert r.returncode == 0, r.stderr
    shown = yaml.safe_load(r.stdout.split("llama-3.1-8b |")[0])  # the scenario YAML comes before the tables
    assert shown["framework"] == "axolotl" and shown["mix"]["method"] == "qlora" and shown["hardware"]["gpu"] == "h100-80gb"
    assert "peak memory" in r.stdout
    lines = r.stderr.strip().splitlines()
    assert all(line.startswith("ftscope: ") for line in lines)
    assert any(line.startswith("ftscope: warning: not mapped: datasets") for line in lines)


def test_framework_config_json_stays_one_document_and_refusals_are_one_line():
    r = ftscope("estimate", FRAMEWORKS / "trl-sft-llama-2-7b-qlora.sh", "--json", "--show-scenario")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["scenario"]["framework"] == "trl-sft"
    assert "framework: trl-sft" in r.stderr
    assert_user_error(ftscope("estimate", FRAMEWORKS / "axolotl-llama-3-lora-8b-int8.yml"), "lora_modules_to_save")
    assert_user_error(ftscope("recommend", IISWC, "--emit-format", "megatron"), "--emit-format")
