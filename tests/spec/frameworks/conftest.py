"""Real framework example configs (examples/frameworks/, each copied with its source, commit and licence)."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "frameworks"


@pytest.fixture
def example():
    """The path of a bundled real framework config."""
    return lambda name: EXAMPLES / name


@pytest.fixture
def write_config(tmp_path):
    """Write a config mapping (YAML, or JSON for .json) or a command line (str) to tmp_path and return its path."""
    def write(name: str, data) -> Path:
        path = tmp_path / name
        if isinstance(data, str):
            path.write_text(data)
        elif name.endswith(".json"):
            import json
            path.write_text(json.dumps(data))
        else:
            path.write_text(yaml.safe_dump(data))
        return path
    return write
