"""The profile store (`ftscope serve --db PATH`) charted as `ftscope report --db` charts it: the same sections
and matplotlib figures, sent to the page as SVG images (data URIs, so nothing is fetched from elsewhere)."""
from __future__ import annotations

import base64
import io
import threading
from pathlib import Path
from typing import Any

from ..errors import FtscopeError


class StoreCharts:
    """Charts of one store, drawn again only when the file changes (a profile run may still be writing it)."""

    def __init__(self, db: str | Path | None):
        self.db = Path(db) if db else None
        self._key: tuple[float, int] | None = None
        self._sections: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def check(self) -> None:
        """Fail at start-up, not on the first page view, when the store or matplotlib is missing."""
        if self.db is None:
            return
        from ..measure.store import Store
        Store(self.db, readonly=True).close()  # not found, not a store, a newer schema: one line now
        from ..report.charts import pyplot
        pyplot()  # raises "charts need matplotlib: pip install -e '.[report]' ..."

    def sections(self) -> list[dict[str, Any]]:
        if self.db is None:
            raise FtscopeError("no profile store: start the server with `ftscope serve --db PATH`")
        stat = self.db.stat()
        with self._lock:  # matplotlib's pyplot is not thread-safe
            if self._key != (stat.st_mtime, stat.st_size):
                self._sections = _draw(self.db)
                self._key = (stat.st_mtime, stat.st_size)
            return self._sections


def _draw(db: Path) -> list[dict[str, Any]]:
    from ..report.charts import pyplot
    from ..report.html import db_sections

    out = []
    for sec in db_sections(db):
        figures = []
        for stem, fig in sec.figures:
            buf = io.BytesIO()
            fig.savefig(buf, format="svg", bbox_inches="tight")
            pyplot().close(fig)
            figures.append({"name": stem, "src": "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode()})
        out.append({"title": sec.title, "text": sec.text, "figures": figures})
    return out
