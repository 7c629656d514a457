"""heap.keep_large_allocations: glibc takes every setting; elsewhere nothing changes."""
import os
import subprocess
import sys

import pytest

from ftscope import heap


def _glibc() -> bool:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (ValueError, OSError):
        return False


@pytest.mark.skipif(not _glibc(), reason="glibc's mallopt only")
def test_glibc_takes_every_setting_and_large_arrays_still_work():
    # in a child process: the settings last for the process's life
    code = ("from ftscope.heap import keep_large_allocations; import numpy as np; "
            "assert keep_large_allocations(); a = np.ones(1 << 26); b = a * 2; del a; c = np.zeros(1 << 26); "
            "print(float(b.sum() + c.sum()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert float(out) == 2.0 * (1 << 26)


def test_without_glibc_it_changes_nothing(monkeypatch):
    def not_glibc(name):
        raise ValueError("unrecognized configuration name")
    monkeypatch.setattr(heap.os, "confstr", not_glibc)
    assert heap.keep_large_allocations() is False


def test_recommend_sets_it_before_searching():
    import inspect
    from ftscope import cli
    source = inspect.getsource(cli.recommend)
    assert source.index("keep_large_allocations()") < source.index("run_recommend(scn")
