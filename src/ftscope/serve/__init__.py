"""`ftscope serve`: the planner as a local web page.

    app.py       the Starlette app and the uvicorn server (`serve(host, port, db)`)
    api.py       the JSON API over ftscope.estimate / plan / recommend, with the CLI's JSON text
    scenarios.py the scenario in the page's URL (`key.path=value` pairs) and as a YAML file
    choices.py   each control's allowed values, from the sources the CLI validates against
    fields.py    which field a one-line error is about
    uploads.py   size-limited uploads in a temporary directory; dataset statistics from a JSONL sample
    store.py     a profile store charted as `ftscope report --db` charts it
    static/      the page: hand-written HTML, CSS and JavaScript with SVG charts (no other host is asked)

Needs the `serve` extra (starlette, uvicorn, tokenizers); `ftscope estimate` and `plan` never import it.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import FtscopeError, install_hint

_NEEDED = ("starlette", "uvicorn")


def main(host: str = "127.0.0.1", port: int = 8765, db: str | Path | None = None) -> None:
    """Run the server (what `ftscope serve` calls); a missing extra is one clear error, not an ImportError."""
    missing = [name for name in _NEEDED if importlib.util.find_spec(name) is None]
    if missing:
        raise FtscopeError(f"ftscope serve needs {', '.join(missing)}: {install_hint('serve')}")
    from .app import serve

    serve(host, port, db)
