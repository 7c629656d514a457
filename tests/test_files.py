"""files.py: user files read and written through one error path, parsed under size, depth and alias budgets."""
from __future__ import annotations

import os
import time

import pytest

from ftscope import FtscopeError
from ftscope.files import (MAX_DEPTH, MAX_NODES, check_path, load_structured, output_dir, output_file, parse_json,
                           parse_yaml, read_text, write_text)

LAUGHS = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{','.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))


def one_line(exc_info) -> str:
    message = str(exc_info.value)
    assert "\n" not in message
    return message


def test_billion_laughs_is_refused_in_milliseconds_not_expanded():
    start = time.perf_counter()
    with pytest.raises(FtscopeError, match=f"more than {MAX_NODES:,} values") as info:
        parse_yaml(LAUGHS, "scenario s.yaml")
    assert time.perf_counter() - start < 5  # 9^9 nodes were never built (a generous bound for a loaded machine)
    one_line(info)


@pytest.mark.parametrize("text", ["model: " + "[" * 10_000 + "]" * 10_000, "\n".join(" " * i + "a:" for i in range(200))])
def test_deep_yaml_is_refused_without_recursion(text):
    with pytest.raises(FtscopeError, match=f"nested more than {MAX_DEPTH} levels"):
        parse_yaml(text, "scenario s.yaml")


def test_aliases_that_stay_small_are_fine():
    assert parse_yaml("a: &x {k: 1}\nb: *x\n", "s") == {"a": {"k": 1}, "b": {"k": 1}}


@pytest.mark.parametrize("text, match", [
    ('{"a": NaN}', "NaN is not a number JSON allows"), ('{"a": -Infinity}', "-Infinity is not a number"),
    ('{"a": 1e400}', "1e400 overflows"), ("[" * 100_000 + "]" * 100_000, "nested"), ("[" * 70 + "]" * 70, "nested"),
    ('{"a": ', "malformed JSON in config.json at x: Expecting value at line 1"),
])
def test_json_is_strict_and_bounded(text, match):
    with pytest.raises(FtscopeError, match=match):
        parse_json(text, "config.json at x")


def test_read_errors_name_the_input_and_the_problem(tmp_path):
    (tmp_path / "latin1.yaml").write_bytes(b"name: caf\xe9\n")
    (tmp_path / "big.yaml").write_bytes(b"x" * 2048)
    (tmp_path / "file").write_text("x")
    cases = {
        str(tmp_path / ("x" * 300 + ".yaml")): "has a name of 305 bytes",
        str(tmp_path / "missing.yaml"): "scenario file not found",
        str(tmp_path): "is a folder; give a file",
        str(tmp_path / "latin1.yaml"): r"is not UTF-8 text \(byte 0xe9 at offset 9\); save it as UTF-8",
        str(tmp_path / "file" / "x.yaml"): "a folder in the path is a file|not found",
        "": "empty path",
    }
    for path, match in cases.items():
        with pytest.raises(FtscopeError, match=match) as info:
            read_text(path, "scenario file")
        one_line(info)
    with pytest.raises(FtscopeError, match="larger than 0 MiB"):
        read_text(tmp_path / "big.yaml", "scenario file", max_bytes=1024)


def test_load_structured_reads_json_or_yaml_by_suffix(tmp_path):
    (tmp_path / "a.json").write_text('{"k": [1, 2]}')
    (tmp_path / "a.yaml").write_text("k: [1, 2]\n")
    assert load_structured(tmp_path / "a.json", "x") == load_structured(tmp_path / "a.yaml", "x") == {"k": [1, 2]}


def test_check_path_refuses_what_no_file_system_holds():
    with pytest.raises(FtscopeError, match="NUL"):
        check_path("a\x00b", "model")
    with pytest.raises(FtscopeError, match="256 bytes"):
        check_path("dir/" + "é" * 128, "model")  # 128 two-byte characters
    assert str(check_path("org/" + "m" * 255, "model")).endswith("m" * 255)


def test_outputs_refuse_folders_and_places_under_files(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(FtscopeError, match="is a folder; give a file name"):
        output_file(tmp_path, "report file")
    with pytest.raises(FtscopeError, match="is a file, not a folder"):
        output_file(tmp_path / "file" / "r.html", "report file")
    with pytest.raises(FtscopeError, match="is a file; give a folder"):
        output_dir(tmp_path / "file", "--emit folder")
    out = output_file(tmp_path / "new" / "deeper" / "r.html", "report file")
    assert out.parent.is_dir() and not out.exists()  # parents made, the file itself not left behind
    assert write_text(out, "hello", "report file").read_text() == "hello"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file permissions")
def test_read_only_folder_is_refused_before_any_work(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(FtscopeError, match="permission denied"):
            output_file(ro / "r.html", "report file")
    finally:
        ro.chmod(0o755)


def test_a_place_nothing_can_be_written_is_refused():
    with pytest.raises(FtscopeError, match="cannot write report file /sys/ftscope-test.html"):
        output_file("/sys/ftscope-test.html", "report file")
