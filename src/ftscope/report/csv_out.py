"""`--csv`: the rows a table shows, as CSV with a header line (the csv module's quoting), raw numbers as the JSON
has them. Nested objects become dotted columns (`memory.peak_gib`), lists one cell joined by ';', None an empty
cell; rows with different keys share one header (the union, in first-seen order)."""
from __future__ import annotations

import csv
from typing import Any, Iterable, Mapping, TextIO


def flatten(row: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}, 'c': [1, 2]} -> {'a.b': 1, 'c': '1;2'}."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            out[name] = ";".join(str(v) for v in value)
        else:
            out[name] = value
    return out


def write_csv(rows: Iterable[Mapping[str, Any]], out: TextIO) -> None:
    flat = [flatten(r) for r in rows]
    header = list(dict.fromkeys(k for r in flat for k in r))
    writer = csv.DictWriter(out, fieldnames=header, restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(flat)
