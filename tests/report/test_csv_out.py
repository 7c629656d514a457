"""csv_out: rows as CSV through the csv module: nested values as dotted columns, lists joined, None empty."""
from __future__ import annotations

import csv
import io

from ftscope.report.csv_out import flatten, write_csv


def test_flatten_dots_nested_keys_and_joins_lists():
    assert flatten({"a": {"b": 1, "c": {"d": None}}, "e": ["w1", "w2"], "f": "x"}) == \
        {"a.b": 1, "a.c.d": None, "e": "w1;w2", "f": "x"}


def test_rows_with_different_keys_share_one_header_and_quote_what_needs_it():
    out = io.StringIO()
    write_csv([{"gpu": "a40", "usd": 18.27, "reason": None},
               {"gpu": "t4", "reason": 'needs "Ampere", or newer', "extra": {"n": 2}}], out)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert list(rows[0]) == ["gpu", "usd", "reason", "extra.n"]
    assert rows[0] == {"gpu": "a40", "usd": "18.27", "reason": "", "extra.n": ""}
    assert rows[1]["reason"] == 'needs "Ampere", or newer' and rows[1]["usd"] == "" and rows[1]["extra.n"] == "2"
