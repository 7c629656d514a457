"""columns: a table fits the width by wrapping text, short headers, then leaving out low-priority columns; a number
is never cut, and the line under the table names what was left out."""
from __future__ import annotations

import io

from rich.console import Console

from ftscope.report.columns import BORDER, Breakdown, Col, FitTable, fit, plain_columns

COLS = [Col("name", "name", justify="left"), Col("total dollars", "usd", short="$", priority=1),
        Col("throughput tokens/s", "tps", short="tok/s", priority=2), Col("why", "why", justify="left", wrap=True, optional=True)]
ROWS = [{"name": "a100-80gb", "usd": "$12,345.67", "tps": "46,744", "why": ""},
        {"name": "rtx-6000-ada", "usd": "$9.37", "tps": "188", "why": "FlashAttention-2 needs an Ampere-or-newer GPU"}]


def render(table, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(table, crop=False)  # as cli_io.print_view does
    return out.getvalue()


def width_of(lay) -> int:
    return sum(lay.widths) + BORDER * len(lay.widths) + 1


def natural_width(table: FitTable) -> int:
    return width_of(table.layout(10_000))


def least_width(table: FitTable) -> int:
    """The width of the essentials: priority-0 columns at their narrowest."""
    return width_of(table.layout(1))


def test_at_its_natural_width_every_column_and_full_header_is_kept():
    table = FitTable("t", COLS, ROWS)
    lay = table.layout(natural_width(table))
    assert lay.headers == ["name", "total dollars", "throughput tokens/s", "why"] and not lay.dropped
    assert table.layout(natural_width(table) - 1).widths != lay.widths  # one column less wide: something wraps


def test_narrowing_wraps_text_then_shortens_headers_then_drops_by_priority():
    table = FitTable("t", COLS, ROWS)
    widths = range(natural_width(table), 20, -1)
    layouts = [table.layout(w) for w in widths]
    for w, lay in zip(widths, layouts):
        kept = [table.cols[i].header for i in lay.columns]
        assert "name" in kept and "why" in kept  # priority 0: always shown
        if "total dollars" not in kept:  # the lower priority number goes only after the higher
            assert "throughput tokens/s" not in kept
        if "total dollars" in kept:  # while anything could still give way, the table fits
            assert width_of(lay) <= w
    order = [table.cols[lay.dropped[-1]].header for lay, before in zip(layouts[1:], layouts) if
             len(lay.dropped) > len(before.dropped)]
    assert order == ["throughput tokens/s", "total dollars"]
    # the short header is tried before its column is left out
    first_short = next(i for i, lay in enumerate(layouts) if "tok/s" in lay.headers)
    first_drop = next(i for i, lay in enumerate(layouts) if 2 in lay.dropped)
    assert first_short < first_drop


def test_no_number_is_ever_cut_or_wrapped_at_any_width():
    table = FitTable("t", COLS, ROWS)
    for width in range(natural_width(table) + 5, least_width(table) - 1, -1):
        text = render(table, width)
        assert "…" not in text
        kept = [table.cols[i].header for i in table.layout(width).columns]
        for value in ("$12,345.67", "$9.37") if "total dollars" in kept else ():
            assert value in text, (width, text)
        for value in ("46,744", "188") if "throughput tokens/s" in kept else ():
            assert value in text, (width, text)
        assert all(len(line) <= width for line in text.splitlines()), text


def test_narrower_than_the_essentials_the_lines_grow_instead_of_cells_being_cut():
    table = FitTable("t", COLS, ROWS)
    text = render(table, least_width(table) - 10)
    assert "…" not in text and "rtx-6000-ada" in text and "Ampere-or-newer" in text


def test_the_line_under_the_table_names_what_was_left_out():
    table = FitTable("t", COLS, ROWS)
    text = render(table, 40)
    assert "not shown at 40 columns: throughput tokens/s" in " ".join(text.split())
    assert "--wide" in text
    assert "not shown" not in render(table, natural_width(table))


def test_an_optional_column_with_nothing_in_it_is_left_out():
    assert [c.header for c in FitTable("t", COLS, ROWS[:1]).cols] == ["name", "total dollars", "throughput tokens/s"]
    assert "why" in [c.header for c in FitTable("t", COLS, ROWS).cols]


def test_a_wrapping_column_folds_only_long_words_that_are_not_numbers():
    cols = [Col("field", "k", justify="left"), Col("value", "v", justify="left", wrap=True)]
    rows = [{"k": "source", "v": "https://huggingface.co/mistralai/Mixtral-8x7B-Instruct-v0.1/blob/main/config.json"},
            {"k": "total_params", "v": "46,702,792,704,000,000,000"}]
    lay = fit(cols, [[r["k"] for r in rows], [r["v"] for r in rows]], 40)
    assert lay.widths[1] >= len("46,702,792,704,000,000,000")  # a number keeps its length, however long
    assert "46,702,792,704,000,000,000" in render(FitTable("t", cols, rows), 40)


def test_header_words_wrap_but_never_break():
    cols = [Col("#", "i"), Col("max batch", "b")]
    lay = fit(cols, [["1"], ["39"]], 13)
    assert lay.widths[1] == len("batch") and not lay.dropped


def test_plain_columns_give_way_from_the_right():
    cols = plain_columns(["case", "metric", "how"])
    assert [c.priority for c in cols] == [0, 1, 2] and all(c.wrap for c in cols)


def test_breakdown_goes_one_per_line_when_it_does_not_fit_across():
    values = {"forward": "1.477", "communication_exposed": "0.001", "communication_hidden": "0.001"}
    across = render(Breakdown("step (s)", values, ("part", "s")), 120)
    assert "communication_exposed" in across.splitlines()[2]  # a header row holding every part
    down = render(Breakdown("step (s)", values, ("part", "s")), 40)
    assert all(len(line) <= 40 for line in down.splitlines()) and "…" not in down
    assert all(any(k in line and v in line for line in down.splitlines()) for k, v in values.items())


def test_text_wraps_at_spaces_before_any_long_word_breaks():
    cols = plain_columns(["point", "why"])
    rows = [{"0": "hfblog-fsdp-llama2-70b-chat-16xa100", "1": "one wall time including evaluation every 100 steps "
             "and two checkpoint saves (the source's own caveat: a ceiling, not a step time)"}]
    text = render(FitTable("t", cols, rows), 80)
    assert "hfblog-fsdp-llama2-70b-chat-16xa100" in text  # the id whole; the reason wraps
    narrow = render(FitTable("t", cols, rows), 40)  # no room for the id whole: it breaks, nothing is lost
    assert "…" not in narrow and "hfblog" in narrow and "16xa100" in " ".join(narrow.split()).replace("│", "")
