"""The JSON API: the CLI's --json bytes out, the CLI's one-line errors with their field, never a traceback."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

import ftscope
from ftscope.errors import FtscopeError
from ftscope.report.contract import to_json

from .conftest import ROOT

EXAMPLE = ROOT / "examples" / "llama2-7b-lora-zero2-8gpu.yaml"
SMALL = {"model": "llama-3.2-1b", "hardware": {"gpu": "a100-80gb"}, "mix": {"method": "lora"},
         "workload": {"micro_batch_size": 4, "seq_len": 1024}}


def test_post_estimate_answers_the_bytes_the_cli_prints(client):
    cli = subprocess.run([str(Path(sys.executable).parent / "ftscope"), "estimate", str(EXAMPLE), "--json"],
                         capture_output=True, text=True, check=True)
    r = client.post("/api/estimate", json=yaml.safe_load(EXAMPLE.read_text()))
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.text == cli.stdout


def test_get_with_the_page_query_is_the_same_scenario(client):
    query = "model=llama-3.2-1b&hardware.gpu=a100-80gb&mix.method=lora&workload.micro_batch_size=4&workload.seq_len=1024"
    got = client.get(f"/api/estimate?{query}&_view=plan")  # page-only keys (_view) are not scenario keys
    assert got.text == to_json(ftscope.estimate(ftscope.load_scenario(SMALL)).to_dict())
    download = client.get(f"/api/estimate?{query}&_download=1")
    assert download.text == got.text and "attachment" in download.headers["content-disposition"]


BAD = [
    ({"mix": {"method": "lorax"}}, "mix.method"),
    ({"workload": {"seq_len": 0}}, "workload.seq_len"),
    ({"workload": {"micro_batch_size": "lots"}}, "workload.micro_batch_size"),
    ({"mix": {"offload": "optimizer"}}, "mix.offload"),
    ({"mix": {"zero_stage": 2, "fsdp": "full_shard"}}, "mix.fsdp"),
    ({"hardware": {"gpu": "a100-80"}}, "hardware.gpu"),
    ({"hardware": {"gpus_per_node": -1}}, "hardware.gpus_per_node"),
    ({"model": "llama-2-7"}, "model"),
    ({"mix": {"lora_rnak": 8}}, "mix"),
    ({"mix": {"experts_top_k": 2}}, "mix.experts_top_k"),
    ({"hardware": {"gpu": "t4"}, "mix": {"attention": "flash"}}, "mix.attention"),
]


@pytest.mark.parametrize("change,field", BAD, ids=[f for _, f in BAD])
def test_bad_input_is_the_cli_message_and_its_field(client, change, field):
    raw = {**SMALL, **{k: {**SMALL.get(k, {}), **v} if isinstance(v, dict) else v for k, v in change.items()}}
    with pytest.raises(FtscopeError) as cli_error:  # what `ftscope estimate` would print after "ftscope: error: "
        ftscope.estimate(ftscope.load_scenario(raw))
    r = client.post("/api/estimate", json=raw)
    assert r.status_code == 400
    assert r.json() == {"error": str(cli_error.value), "field": field}
    inline = client.post("/api/estimate?_errors=inline", json=raw)  # what the page asks for
    assert inline.status_code == 200 and inline.json() == r.json()


@pytest.mark.parametrize("body,needle", [
    (b"{not json", "not JSON"),
    (b"[1, 2]", "must be a mapping"),
    (b'{"model": "/etc/passwd", "workload": {"seq_len": 8}}', "paths on the server are for the CLI"),
    (b'{"model": "../x.json", "workload": {"seq_len": 8}}', "paths on the server are for the CLI"),
    (b'{"model": "upload:0123456789abcdef", "workload": {"seq_len": 8}}', "is not on this server"),
    (b'{"workload": {"seq_len": 8}}', "scenario has no 'model'"),
])
def test_malformed_requests_are_one_line_errors(client, body, needle):
    r = client.post("/api/estimate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert needle in r.json()["error"] and "\n" not in r.json()["error"] and "Traceback" not in r.text


def test_a_body_over_the_limit_is_refused(client):
    r = client.post("/api/estimate", content=b" " * (2**20 + 1))
    assert r.status_code == 413 and "limit" in r.json()["error"]


def test_a_bug_is_a_500_without_traceback(client, monkeypatch):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("deep inside")

    monkeypatch.setattr(ftscope, "estimate", broken)
    r = client.post("/api/estimate", json=SMALL)
    assert r.status_code == 500
    assert r.json()["field"] is None and "deep inside" not in r.text and "Traceback" not in r.text
    assert client.get("/api/choices").status_code == 200  # the server goes on


def test_unknown_routes_and_methods_answer_json(client):
    assert client.get("/api/nothing").json()["error"].endswith("Not Found")
    assert client.delete("/api/estimate").status_code == 405


def test_plan_is_the_plan_json_contract(client):
    # the CLI's answer: `ftscope plan` keeps its default 5 % margin, and so does the page
    from ftscope.estimate.result import TIGHT_MARGIN

    r = client.post("/api/plan", json=SMALL)
    assert r.text == to_json(ftscope.plan(ftscope.load_scenario(SMALL), margin=TIGHT_MARGIN).to_dict())
    assert any(row["pareto"] for row in r.json()["rows"])


def test_recommend_gives_the_top_rows_and_their_explanation(client):
    from ftscope.plan.recommend import recommend

    rec = recommend(ftscope.load_scenario(SMALL))
    data = client.post("/api/recommend", json=SMALL).json()
    assert data["explanation"] == rec.explanation and len(data["explanation"]) >= 3
    assert [r["label"] for r in data["rows"]] == [c.to_dict()["label"] for c in rec.rows[:5]]
    assert data["counts"] == rec.summary.counts() and data["counts"]["feasible"] <= data["counts"]["candidates"]


def test_launch_zip_holds_what_recommend_emit_writes(client, tmp_path):
    from ftscope.plan.emit import emit_recommendation
    from ftscope.plan.recommend import recommend

    scn = {**SMALL, "hardware": {"gpu": "a100-80gb", "gpus_per_node": 4}}
    written = emit_recommendation(recommend(ftscope.load_scenario(scn)), tmp_path / "emit")
    r = client.get("/api/launch.zip?model=llama-3.2-1b&hardware.gpu=a100-80gb&hardware.gpus_per_node=4&mix.method=lora"
                   "&workload.micro_batch_size=4&workload.seq_len=1024")
    assert r.status_code == 200 and r.headers["content-type"] == "application/zip"
    files = zipfile.ZipFile(io.BytesIO(r.content))
    assert sorted(files.namelist()) == sorted(str(p.relative_to(tmp_path / "emit")) for p in written)
    for p in written:  # the same files (the DeepSpeed config is named relative to its folder in both)
        assert files.read(str(p.relative_to(tmp_path / "emit"))).decode() == p.read_text()


def test_scenario_yaml_round_trips_to_the_same_estimate(client):
    r = client.get("/api/scenario.yaml?model=llama-3.2-1b&mix.method=qlora&workload.seq_len=2048&workload.micro_batch_size=max")
    assert r.status_code == 200 and "attachment" in r.headers["content-disposition"]
    raw = yaml.safe_load(r.text)
    assert raw == {"model": "llama-3.2-1b", "mix": {"method": "qlora"},
                   "workload": {"seq_len": 2048, "micro_batch_size": "max"}}
    assert client.get("/api/scenario.yaml?model=llama-3.2-1b&workload.seq_len=-5").json()["field"] == "workload.seq_len"


def test_uploaded_config_becomes_a_model_reference(client, uploads_dir):
    config = (ROOT / "examples" / "tiny-mixtral" / "config.json").read_bytes()
    up = client.post("/api/upload/config", content=config).json()
    assert up["ref"].startswith("upload:") and up["moe"] is True and up["total_params"] > 0
    r = client.post("/api/estimate", json={**SMALL, "model": up["ref"]})
    assert r.status_code == 200 and r.json()["model"]["total_params"] == up["total_params"]
    assert [p.name for p in uploads_dir.rglob("*") if p.is_file()] == ["config.json"]  # only under the temp dir
    text = client.get(f"/api/scenario.yaml?model={up['ref']}&workload.seq_len=64").text
    assert yaml.safe_load(text)["model"] == "config.json" and "beside this file" in text


@pytest.mark.parametrize("body,status,needle", [
    (b"{", 400, "malformed config.json"),
    (b'{"model_type": "nonesuch"}', 400, "not supported"),
    (b"[]", 400, "JSON object"),
    (b" " * (2**20 + 1), 413, "limited to 1 MiB"),
])
def test_bad_config_uploads(client, body, status, needle):
    r = client.post("/api/upload/config", content=body)
    assert r.status_code == status and needle in r.json()["error"]
    assert r.json()["field"] == "model" or status == 413


def test_dataset_statistics_from_a_jsonl_sample_and_a_tokenizer(client, uploads_dir):
    from ftscope.serve.uploads import dataset_stats

    demo = ROOT / "data" / "moe-demo"
    tok = client.post("/api/upload/tokenizer", content=(demo / "tokenizer.json").read_bytes()).json()["ref"]
    stats = client.post(f"/api/dataset?tokenizer={tok}&field=text", content=(demo / "eval.jsonl").read_bytes()).json()
    assert stats == dataset_stats(demo / "eval.jsonl", demo / "tokenizer.json") and stats["num_samples"] == 500
    scn = {**SMALL, "workload": {"micro_batch_size": 4, "seq_len": 1024, "padding": "dynamic",
                                 "dataset": stats}}
    assert client.post("/api/estimate", json=scn).status_code == 200  # the statistics are a valid dataset
    assert {p.parent.parent.name for p in uploads_dir.rglob("*") if p.is_file()} == {"tokenizer", "sample"}


@pytest.mark.parametrize("query,body,field", [
    ("tokenizer=upload:0123456789abcdef", b'{"text": "a b"}\n', "dataset.tokenizer"),
    ("model=llama-3.2-1b", b'{"text": "a b"}\n', "dataset.tokenizer"),
    ("TOK", b"not json\n", "dataset.sample"),
    ("TOK", b"", "dataset.sample"),
    ("TOK&field=a%20b", b'{"text": "a"}\n', "dataset.field"),
])
def test_bad_dataset_uploads_name_their_field(client, query, body, field):
    tok = client.post("/api/upload/tokenizer", content=(ROOT / "data" / "moe-demo" / "tokenizer.json").read_bytes())
    r = client.post("/api/dataset?" + query.replace("TOK", f"tokenizer={tok.json()['ref']}"), content=body)
    assert r.status_code == 400 and r.json()["field"] == field, r.json()
    assert "/tmp" not in r.json()["error"] and "uploads" not in r.json()["error"]  # no server paths


def test_choices_say_whether_there_is_a_store(client):
    data = client.get("/api/choices").json()
    assert data["store"] is False and data["mix"]["method"] == ["full", "lora", "qlora"]
    assert client.get("/api/store").json()["error"].startswith("no profile store")


def test_json_contract_is_one_function():
    d = {"a": 1.5, "b": Path("x")}
    assert to_json(d) == json.dumps(d, indent=2, default=str) + "\n"


_SECTIONS = {"hardware": ["gpu", "gpus_per_node", "nodes"],
             "mix": ["method", "lora_rank", "lora_targets", "gradient_checkpointing", "attention", "zero_stage", "fsdp",
                     "offload", "precision", "optimizer", "experts_top_k", "experts_backend", "loss"],
             "workload": ["micro_batch_size", "seq_len", "dataset", "padding", "gradient_accumulation", "epochs"]}


def test_any_scenario_is_an_answer_never_a_crash(client):
    from hypothesis import HealthCheck, given, settings, strategies as st

    scalar = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**7), st.floats(allow_nan=True), st.text(max_size=6),
                       st.sampled_from(["max", "qlora", "flash", "a100-80gb", "optimizer", "full_shard", "packed"]))
    value = st.recursive(scalar, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=4), c, max_size=3)),
                         max_leaves=5)
    scenario = st.fixed_dictionaries({"model": st.sampled_from(["llama-3.2-1b", "mixtral-8x7b", 3, None])}, optional={
        name: st.dictionaries(st.sampled_from(keys), value, max_size=4) for name, keys in _SECTIONS.items()})

    @settings(max_examples=60, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
    @given(scenario)
    def answers(raw):
        r = client.post("/api/estimate", content=json.dumps(raw, allow_nan=True))
        assert r.status_code in (200, 400), (r.status_code, raw, r.text)
        assert ("error" in r.json()) == (r.status_code == 400)

    answers()


def test_the_model_s_own_tokenizer_from_the_local_hf_cache(client, tmp_path, monkeypatch):
    demo = ROOT / "data" / "moe-demo"
    snap = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text((ROOT / "examples" / "tiny-mixtral" / "config.json").read_text())
    (snap / "tokenizer.json").write_text((demo / "tokenizer.json").read_text())
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    sample = b'{"text": "There are 5 rocks"}\n{"text": "Answer :"}\n'
    stats = client.post("/api/dataset?model=acme/tiny", content=sample).json()
    assert stats["num_samples"] == 2 and stats["max_tokens"] >= 2
    assert client.get("/api/choices").json()["cached"] == ["acme/tiny"]
