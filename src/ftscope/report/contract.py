"""The `--json` output contract as text: one function, so the CLI and `ftscope serve` write the same bytes."""
from __future__ import annotations

import json
from typing import Any


def to_json(data: Any) -> str:
    """One JSON document, as `ftscope VERB --json` prints it (indented, values json cannot hold as str, newline)."""
    return json.dumps(data, indent=2, default=str) + "\n"
