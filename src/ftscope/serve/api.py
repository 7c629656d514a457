"""The JSON API behind the page: the public functions the CLI calls (`ftscope.estimate`, `plan`, `recommend`,
`emit_recommendation`) and the CLI's JSON text (`report.contract.to_json`), so `/api/estimate` answers the
bytes `ftscope estimate FILE --json` prints.

A scenario comes in as a JSON body (POST) or as the page's URL query (GET, `key.path=value` pairs). Bad input
is an answer, never a crash: `{"error": <the CLI's one-line message>, "field": <the key it is about>}` with
HTTP 400 (413 for a body over its limit). The page asks with `_errors=inline` and gets the same object with
HTTP 200: a value being typed is a normal page state, and Chromium logs every 4xx answer as a console error.
Anything else is a bug: HTTP 500, a one-line message, the traceback in the server's log only.
"""
from __future__ import annotations

import functools
import io
import logging
import tempfile
import zipfile
from pathlib import Path
from typing import Any, Awaitable, Callable

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import FtscopeError
from ..estimate.result import TIGHT_MARGIN
from ..report.contract import to_json
from ..spec.scenario import Scenario
from .choices import page_choices
from .fields import error_body
from .scenarios import from_query, resolve, scenario_yaml
from .store import StoreCharts
from .uploads import LIMITS, TooLarge, Uploads, dataset_stats, json_object

log = logging.getLogger("ftscope.serve")
BODY_LIMIT = 1 * 2**20
"""A scenario is a few hundred bytes; a larger JSON body is not one."""
TOP_RECOMMENDATIONS = 5

Handler = Callable[[Request], Awaitable[Response]]


def answers(handler: Handler) -> Handler:
    """Turn bad input into `{"error", "field"}` and anything unexpected into a one-line 500."""

    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        inline = request.query_params.get("_errors") == "inline"
        try:
            return await handler(request)
        except TooLarge as exc:
            return JSONResponse(error_body(exc), status_code=200 if inline else 413)
        except FtscopeError as exc:
            return JSONResponse(error_body(exc), status_code=200 if inline else 400)
        except Exception:  # a bug in ftscope: log it here, never send a traceback to the client
            log.exception("ftscope serve: %s %s failed", request.method, request.url.path)
            return JSONResponse({"error": f"internal error in ftscope serve ({request.url.path}); the server's log has "
                                          "the details", "field": None}, status_code=200 if inline else 500)

    return wrapped


async def read_body(request: Request, limit: int, what: str = "a request body") -> bytes:
    """The request body, refused past `limit` bytes before it is all read."""
    too_large = TooLarge(f"{what} is limited to {limit // 2**20} MiB")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def contract(data: Any, download: str | None = None) -> Response:
    """The CLI's `--json` text, as an answer or as a file to save."""
    headers = {"Content-Disposition": f'attachment; filename="{download}"'} if download else None
    return Response(to_json(data), media_type="application/json", headers=headers)


class Api:
    """The routes of one server: its upload store and its profile store."""

    def __init__(self, uploads: Uploads, store: StoreCharts):
        self.uploads = uploads
        self.store = store

    def routes(self) -> list[Route]:
        return [
            Route("/api/choices", answers(self.choices)),
            Route("/api/estimate", answers(self.estimate), methods=["GET", "POST"]),
            Route("/api/plan", answers(self.plan), methods=["GET", "POST"]),
            Route("/api/recommend", answers(self.recommend), methods=["GET", "POST"]),
            Route("/api/scenario.yaml", answers(self.scenario_yaml)),
            Route("/api/launch.zip", answers(self.launch_zip)),
            Route("/api/upload/config", answers(self.upload_config), methods=["POST"]),
            Route("/api/upload/tokenizer", answers(self.upload_tokenizer), methods=["POST"]),
            Route("/api/dataset", answers(self.dataset), methods=["POST"]),
            Route("/api/store", answers(self.store_charts)),
        ]

    async def raw_scenario(self, request: Request) -> dict[str, Any]:
        """The scenario mapping of a request: its JSON body (POST) or its URL query (GET)."""
        if request.method == "GET":
            return from_query(request.query_params.multi_items())
        return json_object(await read_body(request, BODY_LIMIT), "the request body is not JSON",
                           "a scenario must be a mapping with model, hardware, mix and workload")

    async def choices(self, request: Request) -> Response:
        data = await run_in_threadpool(page_choices)
        data["store"] = self.store.db is not None
        return JSONResponse(data)

    async def estimate(self, request: Request) -> Response:
        from .. import estimate

        scn = resolve(await self.raw_scenario(request), self.uploads)
        return contract(estimate(scn).to_dict(), _download(request, "ftscope-estimate.json"))

    async def plan(self, request: Request) -> Response:
        from ..plan.search import plan

        scn = resolve(await self.raw_scenario(request), self.uploads)
        by = request.query_params.get("_by", "cost")
        result = await run_in_threadpool(plan, scn, by=by, margin=TIGHT_MARGIN)  # the CLI's default margin
        return contract(result.to_dict(), _download(request, "ftscope-plan.json"))

    async def recommend(self, request: Request) -> Response:
        """The top recommendations with their explanations (`recommend --json`, its rows cut to the top)."""
        from ..plan.recommend import recommend

        scn = resolve(await self.raw_scenario(request), self.uploads)
        rec = await run_in_threadpool(recommend, scn, by=request.query_params.get("_by", "time"), top=TOP_RECOMMENDATIONS,
                                      margin=TIGHT_MARGIN)  # the CLI's default margin
        data = {"rows": [c.to_dict() for c in rec.rows[:TOP_RECOMMENDATIONS]],
                "best": rec.best.to_dict() if rec.best else None, "by": rec.by, "explanation": rec.explanation,
                "counts": rec.summary.counts(), "search": rec.summary.search()}
        return contract(data)

    async def scenario_yaml(self, request: Request) -> Response:
        raw = await self.raw_scenario(request)
        resolve(raw, self.uploads)  # a file the CLI would refuse is not offered
        return Response(scenario_yaml(raw), media_type="application/yaml",
                        headers={"Content-Disposition": 'attachment; filename="ftscope-scenario.yaml"'})

    async def launch_zip(self, request: Request) -> Response:
        """What `ftscope recommend SCENARIO --emit DIR` writes, as one zip (paths inside it relative to it)."""
        scn = resolve(await self.raw_scenario(request), self.uploads)
        data = await run_in_threadpool(_launch_zip, scn)
        return Response(data, media_type="application/zip",
                        headers={"Content-Disposition": 'attachment; filename="ftscope-launch.zip"'})

    async def upload_config(self, request: Request) -> Response:
        data = await read_body(request, LIMITS["config"], "a config.json upload")
        return JSONResponse(self.uploads.save_config(data))

    async def upload_tokenizer(self, request: Request) -> Response:
        data = await read_body(request, LIMITS["tokenizer"], "a tokenizer.json upload")
        return JSONResponse({"ref": self.uploads.save("tokenizer", data)})

    async def dataset(self, request: Request) -> Response:
        """Token-length statistics of a JSONL sample (the body) under an uploaded tokenizer or the model's own."""
        sample = self.uploads.path("sample", self.uploads.save("sample", await read_body(request, LIMITS["sample"], "a JSONL sample")))
        q = request.query_params
        tokenizer = self._tokenizer(q.get("tokenizer", ""), q.get("model", ""))
        stats = await run_in_threadpool(dataset_stats, sample, tokenizer, q.get("field") or "text")
        return JSONResponse(stats)

    def _tokenizer(self, ref: str, model: str) -> Path:
        if ref:
            return self.uploads.path("tokenizer", ref)
        from .scenarios import check_model_ref
        from ..spec.resolve import load_model

        if model:
            folder = Path(load_model(check_model_ref(model, self.uploads)).source)
            if (folder / "tokenizer.json").is_file():  # a model folder in the local HF cache
                return folder / "tokenizer.json"
        raise FtscopeError("tokenizer: drop the model's tokenizer.json (this model has none in the local HF cache)")

    async def store_charts(self, request: Request) -> Response:
        return JSONResponse({"db": str(self.store.db) if self.store.db else None,
                             "sections": await run_in_threadpool(self.store.sections)})


def _download(request: Request, name: str) -> str | None:
    return name if request.query_params.get("_download") else None


def _launch_zip(scn: Scenario) -> bytes:
    from ..plan.emit import emit_recommendation
    from ..plan.recommend import recommend

    rec = recommend(scn)
    if rec.best is None:
        first = rec.rows[0].reason if rec.rows else "no candidates"
        raise FtscopeError(f"nothing fits, so there is no launch config to write (first rejected: {first})")
    buf = io.BytesIO()
    with tempfile.TemporaryDirectory(prefix="ftscope-emit-") as tmp:
        root = Path(tmp).resolve()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for path in emit_recommendation(rec, root):  # paths inside are relative to their folder
                zf.writestr(str(path.relative_to(root)), path.read_text())
    return buf.getvalue()
