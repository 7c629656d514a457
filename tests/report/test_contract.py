"""The --json text: one function for the CLI and `ftscope serve`."""
from __future__ import annotations

import json
from pathlib import Path

from ftscope.report.contract import to_json


def test_one_indented_document_with_a_newline():
    text = to_json({"a": 1.5, "path": Path("x/y"), "none": None})
    assert text.endswith("}\n") and json.loads(text) == {"a": 1.5, "path": "x/y", "none": None}
    assert text == json.dumps({"a": 1.5, "path": "x/y", "none": None}, indent=2) + "\n"
