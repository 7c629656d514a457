"""measure: a missing extra is one line that says how to install it from a checkout (ftscope is not on an index)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from ftscope.errors import FtscopeError
from ftscope.measure import require_torch

ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_package_names_the_checkout_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(FtscopeError) as err:
        require_torch()
    msg = str(err.value)
    assert msg.startswith("this needs peft") and "\n" not in msg
    assert "pip install -e '.[measure]' in a checkout" in msg and "make install-test" in msg
    assert "ftscope[" not in msg  # `pip install 'ftscope[measure]'` fails: no index has ftscope


def test_every_extra_a_hint_names_is_declared():
    """`pip install -e '.[X]'` installs X only if pyproject.toml declares it (pip warns and skips an unknown one)."""
    import re
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = set()
    for path in (ROOT / "src" / "ftscope").rglob("*.py"):
        named |= set(re.findall(r"install_hint\(['\"](\w+)['\"]\)", path.read_text()))
    assert named and named <= set(extras), named - set(extras)
