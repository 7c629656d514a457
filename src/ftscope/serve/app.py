"""`ftscope serve`: the planner as a local web page (Starlette app, uvicorn server).

The page (static/: hand-written HTML, CSS and JavaScript, SVG charts) is served from the package and asks only
this server; the API is in api.py. Uploads live in a temporary directory removed when the server stops.
"""
from __future__ import annotations

import ipaddress
import socket
import sys
import tempfile
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..errors import FtscopeError
from .api import Api
from .store import StoreCharts
from .uploads import Uploads

STATIC = Path(__file__).parent / "static"
SECURITY_HEADERS = {
    # the page may load and ask only what this server serves: no other host, even by mistake
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                               "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def create_app(upload_root: str | Path, db: str | Path | None = None) -> Starlette:
    """The web app: the page, its static files and the API. Uploads are written under `upload_root` only."""
    store = StoreCharts(db)
    store.check()
    api = Api(Uploads(upload_root), store)

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers=SECURITY_HEADERS)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        return JSONResponse({"error": f"{request.method} {request.url.path}: {getattr(exc, 'detail', 'not found')}",
                             "field": None}, status_code=status)

    routes = [Route("/", index), *api.routes(), Mount("/static", StaticFiles(directory=STATIC), name="static")]
    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found})


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0 picks a free port), or a one-line error when the address is taken."""
    if not 0 <= port <= 65535:
        raise FtscopeError(f"--port must be from 0 to 65535; got {port}")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise FtscopeError(f"--host {host!r} is not an address this machine has ({exc.strerror})") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise FtscopeError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _warm_up() -> None:
    """One estimate before the URL is shown: the first one pays the imports and the calibration load (~0.2 s),
    which would otherwise land on the first edit of the page."""
    from .. import estimate, load_scenario

    estimate(load_scenario({"model": "llama-3.2-1b", "workload": {"seq_len": 512}})).to_dict()


def serve(host: str = "127.0.0.1", port: int = 8765, db: str | Path | None = None) -> None:
    """Run the server until Ctrl+C; print the URL first (the port actually bound, for --port 0)."""
    import uvicorn

    if not is_loopback(host):
        sys.stderr.write(f"ftscope: warning: serving on {host}: anyone who can reach this machine can use the planner "
                         "and upload files to it (size-limited, kept in a temporary directory); "
                         "the default 127.0.0.1 keeps it to this machine\n")
    with tempfile.TemporaryDirectory(prefix="ftscope-serve-") as uploads:
        app = create_app(uploads, db)
        sock = bind(host, port)
        _warm_up()
        shown = f"[{host}]" if ":" in host else host
        sys.stdout.write(f"ftscope serve: http://{shown}:{sock.getsockname()[1]}/ (Ctrl+C to stop)\n")
        sys.stdout.flush()
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        server.run(sockets=[sock])
