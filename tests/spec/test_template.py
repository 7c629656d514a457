"""The scenario template and the README's defaults: generated from the typed dataclasses, loading back to the
same scenario as the defaults, and the README holding exactly the generated table."""
from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import yaml

from ftscope.spec.hardware import Hardware
from ftscope.spec.mix import Mix
from ftscope.spec.quick import QuickFlags
from ftscope.spec.scenario import Price, load_scenario, scenario_from_dict
from ftscope.spec.template import (EXAMPLE_MODEL, EXAMPLE_SEQ, defaults, defaults_markdown, field_docs,
                                   scenario_template)
from ftscope.spec.workload import Workload

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_key_is_listed_with_a_comment():
    text = scenario_template()
    data = yaml.safe_load(text)
    for section, cls in (("hardware", Hardware), ("mix", Mix), ("workload", Workload), ("price", Price)):
        assert list(data[section]) == [f.name for f in fields(cls)]
    lines = text.splitlines()
    for i, line in enumerate(lines):
        key = line.strip().split(":")[0]
        if line.startswith("  ") and not line.strip().startswith("#"):
            assert lines[i - 1].strip().startswith("#"), f"{key} has no comment"


def test_the_template_loads_back_to_the_defaults():
    template = scenario_from_dict(yaml.safe_load(scenario_template()))
    minimal = load_scenario({"model": EXAMPLE_MODEL, "workload": {"seq_len": EXAMPLE_SEQ}})
    assert template == minimal


def test_flags_set_the_template_values_and_it_loads_to_what_they_ask():
    flags = QuickFlags(model="llama-3.2-1b", gpu="rtx-4090", method="qlora", seq=4096, checkpointing=True)
    template = scenario_from_dict(yaml.safe_load(scenario_template(flags)))
    assert template == load_scenario({}, flags.overrides())
    assert template.mix.method == "qlora" and template.cluster.gpu.key == "rtx-4090"


def test_field_docs_are_read_from_the_source():
    docs = field_docs(Mix)
    assert docs["method"].startswith("full | lora | qlora") and "lora_rank" in docs
    assert "tokens" in field_docs(Workload)["seq_len"].lower()


def test_the_readme_lists_the_defaults_exactly():
    d = defaults()
    assert d["mix.method"] == "lora" and d["mix.gradient_checkpointing"] is False and d["mix.attention"] == "sdpa"
    assert defaults_markdown() in README.read_text(), (
        "README's defaults table differs from the scenario types; paste ftscope.spec.template.defaults_markdown()")
