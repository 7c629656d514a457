"""options.py: command-line values checked before any work (ranges, finiteness, lists, the paths options name)."""
from __future__ import annotations

import math

import pytest

from ftscope import FtscopeError
from ftscope import options as opt


def test_int_lists_are_parsed_and_bounded():
    assert opt.ints("1, 2,,8", "--counts", 1, 64) == [1, 2, 8]
    assert opt.ints(None, "--counts", 1, 64) == []
    for text, match in (("a", "comma-separated integers"), ("0", "from 1 to 64"), ("1e6", "comma-separated")):
        with pytest.raises(FtscopeError, match=match):
            opt.ints(text, "--counts", 1, 64)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1.0, -0.1])
def test_numbers_must_be_finite_and_in_range(value):
    with pytest.raises(FtscopeError, match="--margin must be a finite number at least 0 and below 1"):
        opt.number(value, "--margin", ge=0, lt=1)


def test_in_range_values_pass():
    opt.number(0.5, "--margin", ge=0, lt=1)
    opt.number(None, "--margin", ge=0, lt=1)
    opt.integer(4, "--steps", 1, 10)
    opt.device("cuda:1")
    with pytest.raises(FtscopeError, match="--device must be auto, cuda, cuda:N or cpu"):
        opt.device("tpu")


@pytest.mark.parametrize("text, match", [("layers=0", "N from 1"), ("depth=2", "--shrink takes"),
                                         ("layers=\u00b2", "--shrink takes"), ("layers", "--shrink takes"),
                                         ("hidden=big", "--shrink takes")])
def test_shrink_is_checked(text, match):
    with pytest.raises(FtscopeError, match=match):
        opt.shrink(text)


def test_shrink_parses():
    assert opt.shrink("layers=2,hidden=256") == {"layers": 2, "hidden": 256}
    assert opt.shrink("layers=2, hidden=256,experts=4") == {"layers": 2, "hidden": 256, "experts": 4}
    assert opt.shrink(None) is None and opt.shrink("") is None


def test_input_paths_and_model_folders(tmp_path):
    (tmp_path / "f.json").write_text("{}")
    assert opt.input_file(tmp_path / "f.json", "calibration file") == tmp_path / "f.json"
    with pytest.raises(FtscopeError, match="calibration file .* is a folder"):
        opt.input_file(tmp_path, "calibration file")
    with pytest.raises(FtscopeError, match="--weights folder .* is not a folder"):
        opt.model_dir(tmp_path / "f.json", "--weights folder")
    with pytest.raises(FtscopeError, match="--weights folder config.json not found"):
        opt.model_dir(tmp_path, "--weights folder")


def test_output_file_suffix():
    with pytest.raises(FtscopeError, match="--plot file must end in .png or .svg"):
        opt.out_file("chart.txt", "--plot file", (".png", ".svg"))
