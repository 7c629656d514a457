"""cli_warnings: what transformers, bitsandbytes or torch warn is filtered and counted (shown with -v); ftscope's
own warnings still show."""
from __future__ import annotations

import logging
import warnings

import pytest

from ftscope import cli_warnings
from ftscope.cli_warnings import LOGGER, THIRD_PARTY, filter_third_party, hidden_note, third_party

SITE = "/venv/lib/python3.11/site-packages"


@pytest.fixture
def isolated(monkeypatch):
    """Undo what filter_third_party changes in this process: showwarning, the loggers, the environment."""
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    monkeypatch.setattr(cli_warnings, "_shown_by", cli_warnings._shown_by)
    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    saved = {n: (logging.getLogger(n).handlers[:], logging.getLogger(n).propagate, logging.getLogger(n).level)
             for n in (LOGGER, *THIRD_PARTY)}
    yield
    for name, (handlers, propagate, level) in saved.items():
        log = logging.getLogger(name)
        log.handlers[:], log.propagate, log.level = handlers, propagate, level


def test_a_file_is_third_party_when_an_installed_package_of_the_list_holds_it():
    assert third_party(f"{SITE}/transformers/modeling_utils.py")
    assert third_party("/usr/lib/python3/dist-packages/torch/jit/_script.py")
    assert not third_party(f"{SITE}/ftscope/cli.py")
    assert not third_party("/home/me/torch/notes.py")  # a folder named torch outside site-packages


def _warn_all() -> None:
    warnings.warn_explicit("`is_gradient_checkpointing` is deprecated", FutureWarning,
                           f"{SITE}/transformers/modeling_utils.py", 3312)
    logging.getLogger("bitsandbytes.backends.cpu.ops").warning("Failed to load CPU gemm_4bit_forward")
    warnings.warn("ftscope's own warning", UserWarning)


def test_third_party_warnings_are_counted_not_shown_and_ftscopes_own_still_show(isolated, capsys):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        filter_third_party(verbose=False)
        _warn_all()
    assert [str(w.message) for w in seen] == ["ftscope's own warning"]
    assert capsys.readouterr().err == ""
    assert hidden_note() == "2 third-party warning(s) filtered (ftscope -v shows them)"


def test_verbose_logs_them_on_stderr(isolated, capsys):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        filter_third_party(verbose=True)
        _warn_all()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("ftscope: third-party: ") for line in err)
    assert err[0] == ("ftscope: third-party: FutureWarning: `is_gradient_checkpointing` is deprecated "
                      "(transformers/modeling_utils.py:3312)")
    assert "bitsandbytes.backends.cpu.ops: Failed to load CPU gemm_4bit_forward" in err[1]
    assert [str(w.message) for w in seen] == ["ftscope's own warning"] and hidden_note() is None


def test_a_warning_raised_inside_a_third_party_package_is_caught_whatever_its_stacklevel(isolated, tmp_path):
    pkg = tmp_path / "site-packages" / "peft"
    pkg.mkdir(parents=True)
    (pkg / "tuners.py").write_text("import warnings\n\ndef call():\n    warnings.warn('from peft', UserWarning, stacklevel=2)\n")
    namespace: dict = {}
    exec(compile((pkg / "tuners.py").read_text(), str(pkg / "tuners.py"), "exec"), namespace)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        filter_third_party(verbose=False)
        namespace["call"]()  # attributed to this test file (stacklevel=2), raised in site-packages/peft
    assert seen == [] and hidden_note() is not None


def test_transformers_own_logger_is_quieted_through_its_setting_unless_the_user_set_it(isolated, monkeypatch):
    filter_third_party(verbose=False)
    import os
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "error"
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "info")
    filter_third_party(verbose=False)
    assert os.environ["TRANSFORMERS_VERBOSITY"] == "info"
