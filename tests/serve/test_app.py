"""The app and the `ftscope serve` command: the page and its files, localhost by default, a warning otherwise,
one-line errors at start, and `estimate` / `plan` never importing the web stack."""
from __future__ import annotations

import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from ftscope.errors import FtscopeError
from ftscope.serve.app import STATIC, bind, is_loopback

from .conftest import ROOT

FTSCOPE = str(Path(sys.executable).parent / "ftscope")


def test_the_page_and_every_file_it_loads(client):
    page = client.get("/")
    assert page.status_code == 200 and "default-src 'self'" in page.headers["content-security-policy"]
    assert page.headers["x-content-type-options"] == "nosniff"
    loaded = re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text)
    imported = [f"/static/js/{m}" for f in (STATIC / "js").glob("*.js") for m in re.findall(r'from "\./([^"]+)"', f.read_text())]
    assert len(loaded) == 2 and len(set(imported)) == 3
    for path in loaded + imported:
        r = client.get(path)
        assert r.status_code == 200 and r.headers["content-type"].split(";")[0] in ("text/css", "text/javascript")


def test_the_page_names_no_other_host():
    for f in [p for p in STATIC.rglob("*") if p.is_file()]:
        text = f.read_text().replace("http://www.w3.org/2000/svg", "")  # the SVG namespace: a name, not a request
        assert not re.search(r"https?://|//[a-z0-9-]+\.[a-z]", text), f


@pytest.mark.parametrize("host,local", [("127.0.0.1", True), ("localhost", True), ("::1", True), ("127.0.0.2", True),
                                        ("0.0.0.0", False), ("::", False), ("192.168.1.5", False), ("myhost", False)])
def test_loopback(host, local):
    assert is_loopback(host) is local


def test_bind_errors_are_one_line():
    with pytest.raises(FtscopeError, match="--port must be from 0 to 65535"):
        bind("127.0.0.1", 70000)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(FtscopeError, match="cannot listen on 127.0.0.1"):
            bind("127.0.0.1", taken.getsockname()[1])
    with pytest.raises(FtscopeError, match="not an address"):
        bind("no-such-host.invalid", 0)


def test_non_local_host_warns_before_anything_else(tmp_path):
    # a missing store stops the server before it listens: the warning is checked without opening 0.0.0.0
    r = subprocess.run([FTSCOPE, "serve", "--host", "0.0.0.0", "--db", str(tmp_path / "none.sqlite")],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 2, r.stderr
    assert lines[0].startswith("ftscope: warning: serving on 0.0.0.0: anyone who can reach this machine")
    assert lines[1] == f"ftscope: error: results store not found: {tmp_path / 'none.sqlite'}"


def test_serve_on_a_free_port_answers_like_the_cli(tmp_path):
    proc = subprocess.Popen([FTSCOPE, "serve", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path)
    try:
        url = re.search(r"http://127\.0\.0\.1:\d+/", proc.stdout.readline()).group(0)
        with urllib.request.urlopen(url, timeout=60) as r:
            assert "ftscope planner" in r.read().decode()
        query = "model=llama-3.2-1b&hardware.gpu=a100-80gb&workload.micro_batch_size=2&workload.seq_len=512"
        with urllib.request.urlopen(f"{url}api/estimate?{query}", timeout=60) as r:
            served = r.read().decode()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    (tmp_path / "empty.yaml").write_text("{}\n")
    cli = subprocess.run([FTSCOPE, "estimate", "empty.yaml", "model=llama-3.2-1b", "hardware.gpu=a100-80gb",
                          "workload.micro_batch_size=2", "workload.seq_len=512", "--json"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert served == cli.stdout, cli.stderr
    assert "Traceback" not in proc.stderr.read()


def test_estimate_and_plan_start_without_the_web_stack():
    code = ("import sys\nfrom ftscope.cli import main\n"
            f"for verb in ('estimate', 'plan'):\n    sys.argv = ['ftscope', verb, {str(ROOT / 'examples' / 'iiswc-mixtral-qlora.yaml')!r}, '--json']\n"
            "    try:\n        main()\n    except SystemExit:\n        pass\n"
            "assert not {'starlette', 'uvicorn', 'ftscope.serve'} & set(sys.modules), sorted(sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_missing_extra_is_one_clear_error(monkeypatch):
    import importlib.util

    from ftscope import serve

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    with pytest.raises(FtscopeError, match=r"needs uvicorn: pip install -e '\.\[serve\]' in a checkout"):
        serve.main(port=0)
