"""The log viewer's web app: a JSON API over the catalog, and the page that draws it.

    GET /                    the page (static/index.html; app.js and app.css beside it)
    GET /api/runs            the runs under the root, each with its step files
    GET /api/metrics?run=    a run's charts (reward, success, validation accuracy over steps)
    GET /api/episodes?file=  one page of a step's episode table: filter (also by policy=), sort, search; no token arrays
    GET /api/episode?file=&index=   one episode's full record, as written to the rollout log

Model text only ever reaches the page as JSON; the page puts it into the DOM as text. The
Content-Security-Policy forbids inline scripts as a second line of defence, and a Host and Origin
check (`agenttune.web.requests.HostCheck`, shared with `agenttune serve`) stops other web sites
from reading a loopback viewer through DNS rebinding.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from starlette.applications import Starlette
from starlette.datastructures import QueryParams
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agenttune.logview.catalog import Catalog, NotFound, PathRefused, TooLarge
from agenttune.logview.run_metrics import MetricsReader, charts
from agenttune.logview.step_index import FAILED, SORT_KEYS, IndexCache, Query
from agenttune.web.requests import HostCheck

STATIC = Path(__file__).parent / "static"
MAX_PAGE = 1000
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
     b"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]


class BadRequest(Exception):
    pass


def create_app(root: Path, *, allowed_hosts: Iterable[str] | None = None) -> Starlette:
    """The viewer over `root`. `allowed_hosts`: the Host (and Origin) names it answers to (None: any)."""
    viewer = Viewer(Catalog(root))
    routes = [
        Route("/", viewer.page),
        Route("/api/runs", viewer.runs),
        Route("/api/metrics", viewer.metrics),
        Route("/api/episodes", viewer.episodes),
        Route("/api/episode", viewer.episode),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    handlers = {PathRefused: _error(403), NotFound: _error(404), BadRequest: _error(400), TooLarge: _error(413)}
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.state.viewer = viewer
    app.add_middleware(SecurityHeaders)
    if allowed_hosts is not None:
        app.add_middleware(HostCheck, allowed=allowed_hosts)
    return app


class Viewer:
    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self.indexes = IndexCache()
        self.metrics_reader = MetricsReader()

    def page(self, request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    def runs(self, request: Request) -> Response:
        root = self.catalog.root
        return JSONResponse({"root": str(root), "exists": root.exists(),
                             "runs": [run.as_json() for run in self.catalog.runs()]})

    def metrics(self, request: Request) -> Response:
        path = self.catalog.metrics_file(_required(request.query_params, "run"))
        records = self.metrics_reader.records(path)
        return JSONResponse({"steps": len(records), "charts": charts(records)})

    def episodes(self, request: Request) -> Response:
        params = request.query_params
        index = self.indexes.get(self.catalog.rollout_file(_required(params, "file")))
        query = _query(params)
        rows, matched = index.select(query)
        return JSONResponse({"total": len(index), "matched": matched, "offset": query.offset,
                             "statuses": index.status_counts(), "policies": index.policy_counts(),
                             "failed_statuses": sorted(FAILED),
                             "episodes": rows})

    def episode(self, request: Request) -> Response:
        params = request.query_params
        index = self.indexes.get(self.catalog.rollout_file(_required(params, "file")))
        number = _integer(params, "index", 0)
        if not 0 <= number < len(index):
            raise NotFound(f"No episode {number} in this file ({len(index)} episodes).")
        summary = index.entries[number].summary
        if summary.get("unreadable"):
            return JSONResponse({"unreadable": True, "error": summary["error"], "index": number})
        # The line is sent as written: it is JSON already, and parsing it here would only cost time.
        return Response(index.record_bytes(number), media_type="application/json")


def _query(params: QueryParams) -> Query:
    sort = params.get("sort", "index")
    if sort not in SORT_KEYS:
        raise BadRequest(f"Cannot sort by {sort!r}; choose one of {', '.join(sorted(SORT_KEYS))}.")
    success = params.get("success", "")
    return Query(
        status=params.get("status") or None,
        success={"": None, "true": True, "false": False}.get(success.lower()),
        policy=params.get("policy") or None,
        min_reward=_number(params, "min_reward"),
        max_reward=_number(params, "max_reward"),
        text=params.get("q", "").strip(),
        sort=sort,
        descending=params.get("order", "asc") == "desc",
        offset=max(0, _integer(params, "offset", 0)),
        limit=min(MAX_PAGE, max(1, _integer(params, "limit", 100))),
    )


def _required(params: QueryParams, name: str) -> str:
    value = params.get(name)
    if not value:
        raise BadRequest(f"The query parameter {name!r} is required.")
    return value


def _integer(params: QueryParams, name: str, default: int) -> int:
    try:
        return int(params.get(name, default))
    except ValueError:
        raise BadRequest(f"{name} must be a whole number, not {params.get(name)!r}.") from None


def _number(params: QueryParams, name: str) -> float | None:
    value = params.get(name, "")
    if value == "":
        return None
    try:
        return float(value)
    except ValueError:
        raise BadRequest(f"{name} must be a number, not {value!r}.") from None


def _error(status: int):
    async def handler(request: Request, error: Exception) -> Response:
        return JSONResponse({"error": str(error)}, status_code=status)

    return handler


class SecurityHeaders:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in SECURITY_HEADERS}
                headers = [(n, v) for n, v in message.get("headers", []) if n.lower() not in names]
                message = {**message, "headers": headers + SECURITY_HEADERS}
            await send(message)

        await self.app(scope, receive, send_with_headers)
