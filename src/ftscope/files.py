"""The files users name: read and written through one error path, parsed under size, depth and alias budgets.

Every OSError and UnicodeError on a user's path becomes one FtscopeError that names the input and the fix
(no such file, a folder, a name component over 255 bytes, permission, not UTF-8, too large). YAML and JSON are
parsed under budgets so a hostile file fails fast: nesting depth, and YAML aliases that would expand to
billions of nodes ("billion laughs"), are counted on the event stream before anything is built.
"""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Any

from .errors import FtscopeError

MAX_TEXT_BYTES = 16 * 2**20
"""Scenario, config.json, calibration and cases files are kilobytes; 16 MiB is a typo or an attack."""
MAX_DEPTH = 64
"""Nesting levels of a YAML/JSON document (a scenario has 4)."""
MAX_NODES = 1_000_000
"""Nodes of a YAML document with its aliases expanded (the largest cases file has ~20,000)."""
NAME_MAX = 255
"""Bytes per path component on ext4, xfs, btrfs, APFS and NTFS."""


def show(path: str | os.PathLike[str], limit: int = 80) -> str:
    """A path short enough for a one-line message."""
    text = os.fspath(path)
    return text if len(text) <= limit else text[: limit // 2 - 2] + "..." + text[-(limit // 2 - 2):]


def check_path(path: str | os.PathLike[str], what: str) -> Path:
    """`path` as a Path, refused when no file system could hold it (empty, NUL byte, a component over 255 bytes)."""
    text = os.fspath(path)
    if not text.strip():
        raise FtscopeError(f"{what}: empty path")
    if "\x00" in text:
        raise FtscopeError(f"{what} path contains a NUL byte: {show(text)!r}")
    for part in text.split(os.sep):
        size = len(part.encode("utf-8", "surrogateescape"))
        if size > NAME_MAX:
            raise FtscopeError(f"{what} path has a name of {size} bytes (file systems allow {NAME_MAX}): "
                               f"{show(text)}; shorten it")
    return Path(text)


def os_error(exc: OSError, what: str, path: str | os.PathLike[str], doing: str = "read") -> FtscopeError:
    """One line for an OSError on a user's path: what went wrong and what to do."""
    where = show(path)
    code = exc.errno
    if isinstance(exc, FileNotFoundError):
        return FtscopeError(f"{what} not found: {where}")
    if isinstance(exc, IsADirectoryError):
        return FtscopeError(f"{what} {where} is a folder; give a file")
    if isinstance(exc, NotADirectoryError):
        return FtscopeError(f"{what} {where}: a folder in the path is a file")
    if isinstance(exc, PermissionError):
        return FtscopeError(f"cannot {doing} {what} {where}: permission denied (check the file's permissions)")
    if code == errno.ENAMETOOLONG:
        return FtscopeError(f"{what} path is too long for the file system: {where}")
    if code in (errno.EROFS,):
        return FtscopeError(f"cannot {doing} {what} {where}: read-only file system (choose another place)")
    if code == errno.ENOSPC:
        return FtscopeError(f"cannot {doing} {what} {where}: no space left on the device")
    reason = exc.strerror or type(exc).__name__
    return FtscopeError(f"cannot {doing} {what} {where}: {reason}")


def read_bytes(path: str | os.PathLike[str], what: str, max_bytes: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of a user's file, at most `max_bytes` (devices and pipes are read up to the budget)."""
    p = check_path(path, what)
    try:
        if p.is_dir():
            raise FtscopeError(f"{what} {show(p)} is a folder; give a file")
        with open(p, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise os_error(exc, what, p) from None
    if len(data) > max_bytes:
        raise FtscopeError(f"{what} {show(p)} is larger than {max_bytes // 2**20} MiB; is it the right file?")
    return data


def decode(data: bytes, what: str, path: str | os.PathLike[str]) -> str:
    """UTF-8 text (a byte-order mark is dropped); anything else is one error saying where it broke."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FtscopeError(f"{what} {show(path)} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                           f"{exc.start}); save it as UTF-8") from None


def read_text(path: str | os.PathLike[str], what: str, max_bytes: int = MAX_TEXT_BYTES) -> str:
    return decode(read_bytes(path, what, max_bytes), what, path)


def _first_line(exc: Exception) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return " ".join(lines[:1] + lines[-1:]) if len(lines) > 1 else (lines[0] if lines else type(exc).__name__)


def _yaml_loader() -> Any:
    """libyaml's safe loader when PyYAML was built with it (the pure-Python scanner takes seconds over deep
    nesting before it yields a single event); else the pure-Python one. Both are safe loaders."""
    import yaml
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def check_yaml_budget(text: str, where: str) -> None:
    """Refuse YAML nested deeper than MAX_DEPTH or expanding (aliases counted in full) past MAX_NODES.

    Walks the parser's event stream, which is flat: nothing is built, so 10,000 levels or 10^9 aliased nodes
    are refused in milliseconds. Each anchor remembers the expanded size of its node; an alias adds that size.
    """
    import yaml

    anchors: dict[str, int] = {}
    stack: list[list[Any]] = [[0, None]]  # per open collection: [expanded size so far, anchor]
    for event in yaml.parse(text, Loader=_yaml_loader()):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            stack.append([1, event.anchor])
            if len(stack) - 1 > MAX_DEPTH:
                raise FtscopeError(f"{where} is nested more than {MAX_DEPTH} levels deep")
            continue
        if isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            size, anchor = stack.pop()
        elif isinstance(event, yaml.ScalarEvent):
            size, anchor = 1, event.anchor
        elif isinstance(event, yaml.AliasEvent):
            size, anchor = anchors.get(event.anchor, 1), None
        else:
            continue
        if anchor is not None:
            anchors[anchor] = size
        stack[-1][0] += size
        if stack[-1][0] > MAX_NODES or size > MAX_NODES:
            raise FtscopeError(f"{where} expands to more than {MAX_NODES:,} values (YAML aliases?); refused")


def parse_yaml(text: str, where: str) -> Any:
    """YAML (safe subset) under the depth and alias budgets; any problem is one FtscopeError."""
    import yaml

    try:
        check_yaml_budget(text, where)
        return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a safe loader, C or Python
    except yaml.YAMLError as exc:
        if "maximum nesting depth" in str(exc):  # libyaml's own limit, met while scanning ahead
            raise FtscopeError(f"{where} is nested more than {MAX_DEPTH} levels deep") from None
        raise FtscopeError(f"malformed YAML in {where}: {_first_line(exc)}") from None
    except RecursionError:
        raise FtscopeError(f"{where} is nested too deeply") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} overflows a float")
    return value


def parse_json(text: str, where: str) -> Any:
    """Strict JSON: NaN / Infinity / overflowing numbers refused, nesting bounded."""
    try:
        data = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise FtscopeError(f"malformed JSON in {where}: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # raised by the two hooks above
        raise FtscopeError(f"malformed JSON in {where}: {exc}") from None
    except RecursionError:
        raise FtscopeError(f"{where} is nested too deeply") from None
    check_depth(data, where)
    return data


def check_depth(data: Any, where: str) -> None:
    """Refuse parsed data nested deeper than MAX_DEPTH (iterative: deep input cannot overflow the stack)."""
    stack = [(data, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise FtscopeError(f"{where} is nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)


def load_structured(path: str | os.PathLike[str], what: str, max_bytes: int = MAX_TEXT_BYTES) -> Any:
    """A YAML or JSON file (by suffix: .json is JSON, anything else YAML), read and parsed under the budgets."""
    text = read_text(path, what, max_bytes)
    where = f"{what} {show(path)}"
    return parse_json(text, where) if os.fspath(path).endswith(".json") else parse_yaml(text, where)


# ---- outputs ------------------------------------------------------------------------------------------------

def output_file(path: str | os.PathLike[str], what: str) -> Path:
    """A path a file can be written to: not a folder, not under a file; missing parent folders are created."""
    p = check_path(path, what)
    if p.is_dir():
        raise FtscopeError(f"{what} {show(p)} is a folder; give a file name")
    _make_parent(p.parent, what, p)
    existed = p.exists()
    try:  # the one sure test of writability (permissions, read-only mounts, /sys): open it for appending
        with open(p, "ab"):
            pass
        if not existed:
            p.unlink()
    except OSError as exc:
        raise os_error(exc, what, p, "write") from None
    return p


def output_dir(path: str | os.PathLike[str], what: str) -> Path:
    """A folder files can be written into (created with its parents when missing)."""
    p = check_path(path, what)
    if p.exists() and not p.is_dir():
        raise FtscopeError(f"{what} {show(p)} is a file; give a folder")
    _make_parent(p, what, p)
    return p


def _make_parent(folder: Path, what: str, target: Path) -> None:
    for up in (folder, *folder.parents):
        if up.exists():
            if not up.is_dir():
                raise FtscopeError(f"{what} {show(target)}: {show(up)} is a file, not a folder")
            break
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise os_error(exc, what, target, "create") from None


def write_text(path: str | os.PathLike[str], text: str, what: str) -> Path:
    return write_bytes(path, text.encode("utf-8"), what)


def write_bytes(path: str | os.PathLike[str], data: bytes, what: str) -> Path:
    """Write a user's output file (checked with output_file first); failures are one FtscopeError."""
    p = output_file(path, what)
    try:
        p.write_bytes(data)
    except OSError as exc:
        raise os_error(exc, what, p, "write") from None
    return p
