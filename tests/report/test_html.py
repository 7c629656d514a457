"""The one-file HTML report: self-contained, and every image renders in headless Chromium without console errors."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow  # the report charts a real profile run


def _small_store(tmp_path: Path) -> Path:
    """A real profile store: the bundled tiny Mixtral measured on CPU at two batch sizes."""
    import ftscope
    from ftscope.measure.runtime.profile import profile

    db = tmp_path / "runs.sqlite"
    profile(ftscope.load_scenario(ROOT / "examples" / "tiny-mixtral.yaml"), device="cpu", steps=1, warmup=0,
            batch_sizes=(1, 2), db=str(db))
    return db


def _write_report(tmp_path: Path) -> Path:
    plan = subprocess.run([str(BIN / "ftscope"), "plan", "examples/iiswc-mixtral-qlora.yaml", "--all", "--json",
                           "--gpus", "a40,a100-80gb,h100-80gb"], cwd=ROOT, capture_output=True, text=True, check=True)
    (tmp_path / "plan.json").write_text(plan.stdout)
    out = tmp_path / "report.html"
    proc = subprocess.run([str(BIN / "ftscope"), "report", "--plan", str(tmp_path / "plan.json"), "--db",
                           str(_small_store(tmp_path)), "--out", str(out), "--png", str(tmp_path / "png")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def test_report_is_self_contained_with_every_chart(tmp_path):
    out = _write_report(tmp_path)
    html = out.read_text()
    imgs = re.findall(r"<img [^>]*src='([^']+)'", html)
    assert len(imgs) >= 11  # plan (3) + profile store (5) + published cases (3)
    assert "Profile run" in html
    assert all(src.startswith("data:image/png;base64,") for src in imgs)
    assert "http://" not in html and "https://" not in html  # nothing to fetch
    assert len(list((tmp_path / "png").glob("*.png"))) == len(imgs)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_report_renders_in_headless_chromium(tmp_path):
    exe = _chromium()
    if exe is None:
        pytest.skip("Debian's chromium is not installed (make test installs it; it failed here)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')")
    out = _write_report(tmp_path)
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--no-first-run", "--disable-sync", "--disable-quic"])
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(out.as_uri())
        page.wait_for_load_state("load")
        images = page.evaluate("Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.naturalHeight])")
        page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        browser.close()
    assert len(images) >= 6
    assert all(done and w > 100 and h > 100 for done, w, h in images), images
    assert errors == []
    assert (tmp_path / "report.png").stat().st_size > 50_000
