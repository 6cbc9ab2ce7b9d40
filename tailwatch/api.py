"""The service's read API and dashboards, mounted on the OTLP/HTTP port.

While ``tailwatch serve`` owns an embedded store no other process can open it, so the read
commands come here instead (:mod:`tailwatch.remote`):

- ``GET /api/v1/analyze?start=ISO&end=ISO[&baseline_start=ISO&baseline_end=ISO]`` — the same JSON
  object as ``tailwatch analyze --format json``;
- ``GET /api/v1/alerts[?include_resolved_since=ISO][&format=json|arrow]`` — ``slo_rules.list_alerts``;
- ``POST /api/v1/dashboards/export`` (JSON body ``{"start", "end", "formats"}``) — a zip of the
  exported files;
- ``GET /api/v1/jobs`` — the newest job runs; ``POST /api/v1/jobs/{name}/run`` runs one now;
- ``GET /dashboards/`` — the on-call landing page, rendered on request: the alerts as they are now
  and the views of the latest scheduled analysis; before any analysis, what it waits for;
- ``GET /dashboards/…`` — the offline copy the scheduled export wrote (static files);
- ``GET /dashboards/runs/{run_id}/{view}.html`` — the views of one persisted analysis run, what an
  alert links to: rendered on first request from the run and kept under ``<out_dir>/runs/`` for
  ``dashboards.runs_max_age``, then pruned (and rendered again if asked for again);
- ``GET /dashboards/latest/{view}.html`` — a redirect to that view of the latest scheduled analysis;
- ``GET /dashboards/plotly-<version>.min.js`` — the one plotly.js every served page loads, from the
  installed plotly package, cacheable for a year;
- ``GET /`` — a redirect to ``/dashboards/``.

With a token configured every route requires it, compared in constant time: as
``Authorization: Bearer <token>``, or as the password of HTTP Basic auth so a browser opening a
dashboard link from an alert can prompt for it.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import io
import ipaddress
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import zipfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from storage import Store, TailwatchError, as_utc, parse_time
from tailwatch.commands._common import latency_targets
from tailwatch.config import TailwatchConfig
from tailwatch.remote import EXPORT_REPORT_HEADER
from tailwatch.service_schema import recent_job_runs

__all__ = ["ARROW_STREAM", "RunPages", "ServiceApi", "api_routes"]

ARROW_STREAM = "application/vnd.apache.arrow.stream"

log = logging.getLogger("tailwatch.service")

# Run ids are what ``analytics.persist_analysis`` makes (uuid4 hex): nothing else reaches the disk.
_RUN_ID = re.compile(r"[0-9a-f]{32}")
# plotly.js never changes under its versioned name: a browser keeps it for a year.
_IMMUTABLE = "public, max-age=31536000, immutable"
# Resolved alerts the live landing page lists.
RESOLVED_LOOKBACK = timedelta(days=1)
# Up to this many spans the waiting landing page gives their time range (beyond, only the count).
WAITING_RANGE_MAX_SPANS = 10_000_000


class _BadRequest(Exception):
    pass


def _time_param(value: str, name: str) -> datetime:
    try:
        return parse_time(value)
    except ValueError as exc:
        raise _BadRequest(f"{name}: {exc}") from None


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return as_utc(value).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json(body: object, status: int = 200) -> Response:
    return Response(json.dumps(body, default=_json_default), status, media_type="application/json")


def token_matches(header: str, token: str) -> bool:
    """``Bearer <token>`` or Basic auth with the token as password, compared in constant time."""
    scheme, _, value = header.strip().partition(" ")
    candidate = ""
    if scheme.lower() == "bearer":
        candidate = value.strip()
    elif scheme.lower() == "basic":
        try:
            candidate = base64.b64decode(value.strip(), validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            candidate = ""
    return hmac.compare_digest(candidate.encode(), token.encode())


def _unauthorized(browser: bool) -> Response:
    # Browsers prompt for Basic credentials only when asked to; API clients get the Bearer challenge.
    challenge = 'Basic realm="tailwatch", charset="UTF-8"' if browser else 'Bearer realm="tailwatch"'
    return JSONResponse({"error": "unauthorized"}, 401, headers={"WWW-Authenticate": challenge})


# API work (analyses, exports, jobs) runs in the thread pool the OTLP receiver decodes in: more
# than a few at once only queue on two cores, and dozens starved ingest (45 concurrent dashboard
# exports held an export for 50 s). Beyond the limit a request is answered 503 at once.
API_CONCURRENCY = 3


@dataclass
class ServiceApi:
    """What the routes need from the running service."""

    store: Store
    config: TailwatchConfig
    token: str | None = None
    run_job: Callable[[str], Any] | None = None
    # The run id of the latest scheduled analysis (what /dashboards/ shows), if any yet: an export
    # without a window exports that run.
    scheduled_run: Callable[[], str | None] | None = None
    # When a scheduled job runs next (None: not scheduled): what the landing page waits for.
    next_run: Callable[[str], datetime | None] | None = None
    # The service's rule evaluation as a dry run at an instant (None: now): why each rule is silent.
    explain: Callable[[datetime | None], Any] | None = None
    slots: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(API_CONCURRENCY)
    )
    pages: RunPages = field(init=False)

    def __post_init__(self) -> None:
        self.pages = RunPages(self, self.config.dashboards.out_dir / "runs")

    def authorized(self, request: Request) -> bool:
        return self.token is None or token_matches(request.headers.get("authorization", ""), self.token)


Handler = Callable[[Request, bytes], Response]


_LOCAL_HOSTNAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def _host_of(value: str) -> str:
    """The host of a ``Host`` header or an origin, lower-cased, without port or brackets."""
    value = value.strip().lower()
    if "://" in value:
        value = value.split("://", 1)[1]
    value = value.split("/", 1)[0]
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value[1:]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def refusal(api: ServiceApi, request: Request) -> str | None:
    """Why a request is refused before its handler runs, or None.

    A browser on the operator's machine can be made to send requests here by any web page: a form
    POST needs no CORS preflight, and a DNS name rebound to 127.0.0.1 makes even reads same-origin.
    So a request whose ``Origin`` is another site is refused, and without a token only the names
    that cannot be rebound are accepted as ``Host`` (IP literals, localhost, the configured public
    URL's host)."""
    host_header = request.headers.get("host", "")
    origin = request.headers.get("origin")
    if origin and origin != "null" and _host_of(origin) != _host_of(host_header):
        return f"cross-origin request from {origin} refused"
    if api.token is None and host_header:
        host = _host_of(host_header)
        public = api.config.dashboards.public_url
        allowed = {_host_of(public)} if public else set()
        if not (_is_ip(host) or host in _LOCAL_HOSTNAMES or host in allowed):
            return (
                f"Host {host!r} refused: without an API token only IP addresses, localhost and the "
                "dashboards.public_url host are served (set a token to serve other names)"
            )
    return None


def _refused(api: ServiceApi, request: Request, *, browser: bool) -> Response | None:
    """The origin check and the token, as every route applies them; ``None``: go ahead."""
    reason = refusal(api, request)
    if reason is not None:
        return _json({"error": reason}, 403)
    if not api.authorized(request):
        return _unauthorized(browser=browser)
    return None


def _guard(
    api: ServiceApi, handler: Handler, *, browser: bool = False
) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` behind the origin check, the token (``browser``: a page an alert links to,
    whose 401 asks for Basic credentials) and the API's concurrency limit."""

    async def endpoint(request: Request) -> Response:
        refused = _refused(api, request, browser=browser)
        if refused is not None:
            return refused
        body = await request.body() if request.method == "POST" else b""
        if not api.slots.acquire(blocking=False):
            return JSONResponse(
                {"error": f"the service is busy with {API_CONCURRENCY} API requests; retry shortly"},
                status_code=503,
                headers={"Retry-After": "2"},
            )
        try:
            # Store calls block: run them in the thread pool so the event loop that also serves
            # OTLP ingest never waits on an analysis.
            return await run_in_threadpool(handler, request, body)
        except _BadRequest as exc:
            return _json({"error": str(exc)}, 400)
        except TailwatchError as exc:
            return _json({"error": str(exc)}, 422)
        finally:
            api.slots.release()

    return endpoint


class _GuardedStatic:
    """``StaticFiles`` behind the token (Basic or Bearer)."""

    def __init__(self, api: ServiceApi, directory: Path) -> None:
        self.api = api
        self.files = StaticFiles(directory=directory, html=True, check_dir=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            reason = refusal(self.api, Request(scope))
            if reason is not None:
                await _json({"error": reason}, 403)(scope, receive, send)
                return
            if not self.api.authorized(Request(scope)):
                await _unauthorized(browser=True)(scope, receive, send)
                return
        await self.files(scope, receive, send)


def api_routes(api: ServiceApi) -> list[BaseRoute]:
    """The ``/api/v1`` routes and the ``/dashboards`` mount, for ``Receivers(extra_routes=...)``."""
    out_dir = api.config.dashboards.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)

    def analyze_route(request: Request, body: bytes) -> Response:
        q = request.query_params
        missing = [k for k in ("start", "end") if not q.get(k)]
        if missing:
            raise _BadRequest(f"missing query parameter {missing[0]!r}")
        if bool(q.get("baseline_start")) != bool(q.get("baseline_end")):
            raise _BadRequest("give both baseline_start and baseline_end, or neither")
        start, end = _time_param(q["start"], "start"), _time_param(q["end"], "end")
        if end <= start:
            raise _BadRequest("end must be after start")
        baseline = (
            (
                _time_param(q["baseline_start"], "baseline_start"),
                _time_param(q["baseline_end"], "baseline_end"),
            )
            if q.get("baseline_start")
            else (None, None)
        )
        from analytics import analyze

        analysis = analyze(api.store, start, end, baseline[0], baseline[1], conventions=_conventions(api))
        # Exactly the text `tailwatch analyze --format json` prints.
        return Response(analysis.to_json(), media_type="application/json")

    def alerts_route(request: Request, body: bytes) -> Response:
        q = request.query_params
        since = (
            _time_param(q["include_resolved_since"], "include_resolved_since")
            if q.get("include_resolved_since")
            else None
        )
        from slo_rules import list_alerts

        frame = list_alerts(api.store, include_resolved_since=since)
        if q.get("format", "json") == "arrow":
            sink = io.BytesIO()
            import pyarrow as pa

            table = frame.to_arrow()
            with pa.ipc.new_stream(sink, table.schema) as writer:
                writer.write_table(table)
            return Response(sink.getvalue(), media_type=ARROW_STREAM)
        return _json({"alerts": frame.to_dicts()})

    def explain_route(request: Request, body: bytes) -> Response:
        if api.explain is None:
            return _json({"error": "this service evaluates no rules"}, 404)
        q = request.query_params
        at = _time_param(q["at"], "at") if q.get("at") else None
        result = api.explain(at)
        return _json(
            {
                "at": result.at,
                "dry_run": True,
                "would_fire": [s.alertname for s in result.fired],
                "would_resolve": [s.alertname for s in result.resolved],
                "firing": [s.alertname for s in result.firing],
                "explanations": [e.to_dict() for e in result.explanations],
                "errors": result.errors,
            }
        )

    def export_route(request: Request, raw: bytes) -> Response:
        from dashboards import export_dashboards

        body = _request_json(raw)
        start = _time_param(body["start"], "start") if body.get("start") else None
        end = _time_param(body["end"], "end") if body.get("end") else None
        run_id = None
        if start is None and end is None and api.scheduled_run is not None:
            # No window: what /dashboards/ shows, not whichever run was persisted last.
            run_id = api.scheduled_run()
        formats = body.get("formats") or ["html"]
        if not isinstance(formats, list) or any(f not in ("html", "png") for f in formats):
            raise _BadRequest("formats: a list of 'html' and/or 'png'")
        # Never into dashboards.out_dir: an ad-hoc export does not replace what /dashboards/ serves.
        staging = Path(tempfile.mkdtemp(prefix="tailwatch-export-"))
        try:
            report = export_dashboards(
                api.store,
                staging,
                start,
                end,
                formats=tuple(formats),
                conventions=_conventions(api),
                trace_url=api.config.links.trace_url,
                run_id=run_id,
                latency_targets=latency_targets(api.config.rules.files, warn=log.warning),
            )
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
                for path in report.files:
                    archive.write(path, str(Path(path).relative_to(staging)))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        # The report rides in one header so the zip stays exactly the exported files.
        summary = {
            "analysis_run_id": report.analysis_run_id,
            "start": getattr(report, "start", None),
            "end": getattr(report, "end", None),
            "computed": bool(getattr(report, "computed", False)),
            "alerts": int(getattr(report, "alerts", 0)),
            "notes": list(getattr(report, "notes", [])),
        }
        return Response(
            buffer.getvalue(),
            media_type="application/zip",
            headers={EXPORT_REPORT_HEADER: json.dumps(summary, default=_json_default, ensure_ascii=True)},
        )

    def jobs_route(request: Request, body: bytes) -> Response:

        try:
            limit = int(request.query_params.get("limit", "100"))
        except ValueError:
            raise _BadRequest("limit: expected an integer") from None
        return _json({"runs": recent_job_runs(api.store, max(1, min(limit, 10_000)))})

    def run_job_route(request: Request, body: bytes) -> Response:
        name = request.path_params["name"]
        if api.run_job is None:
            return _json({"error": "scheduling is disabled on this instance"}, 409)
        try:
            run = api.run_job(name)
        except KeyError:
            return _json({"error": f"no scheduled job named {name!r}"}, 404)
        return _json({k: getattr(run, k) for k in run.__dataclass_fields__})

    pages = api.pages

    def run_page_route(request: Request, body: bytes) -> Response:
        run_id, page = request.path_params["run_id"], request.path_params.get("page") or "index.html"
        content = pages.read(run_id, page)
        if content is None:
            return _json({"error": f"no page {page!r} of an analysis run {run_id!r}"}, 404)
        return Response(content, media_type="text/html; charset=utf-8")

    async def run_dir(request: Request) -> Response:
        # Relative links between the views of a run need the trailing slash.
        return RedirectResponse(f"{request.path_params['run_id']}/", status_code=307)

    async def root(request: Request) -> Response:
        return RedirectResponse("/dashboards/", status_code=307)

    async def dashboards_dir(request: Request) -> Response:
        return RedirectResponse("dashboards/", status_code=307)

    landing = _Landing(api)

    def landing_route(request: Request, body: bytes) -> Response:
        return HTMLResponse(landing.render(), headers={"Cache-Control": "no-store"})

    async def latest_route(request: Request) -> Response:
        refused = _refused(api, request, browser=True)
        if refused is not None:
            return refused
        from dashboards import VIEWS

        view = request.path_params["view"]
        if view not in VIEWS:
            return _json({"error": f"no view {view!r}; views: {', '.join(VIEWS)}"}, 404)
        run_id = api.scheduled_run() if api.scheduled_run is not None else None
        # Before the first scheduled analysis, the landing page says what it waits for.
        target = f"../runs/{run_id}/{view}.html" if run_id else "../"
        return RedirectResponse(target, status_code=307, headers={"Cache-Control": "no-store"})

    from dashboards import PLOTLY_JS, plotly_js_source

    async def plotly_route(request: Request) -> Response:
        refused = _refused(api, request, browser=True)
        if refused is not None:
            return refused
        return FileResponse(
            plotly_js_source(),
            media_type="text/javascript; charset=utf-8",
            headers={"Cache-Control": _IMMUTABLE},
        )

    return [
        Route("/", root, methods=["GET", "HEAD"]),
        Route("/dashboards", dashboards_dir, methods=["GET", "HEAD"]),
        Route("/dashboards/", _guard(api, landing_route, browser=True), methods=["GET"]),
        Route(f"/dashboards/{PLOTLY_JS}", plotly_route, methods=["GET"]),
        Route("/dashboards/latest/{view}.html", latest_route, methods=["GET"]),
        Route("/dashboards/runs/{run_id}", run_dir, methods=["GET", "HEAD"]),
        Route("/dashboards/runs/{run_id}/", _guard(api, run_page_route, browser=True), methods=["GET"]),
        Route("/dashboards/runs/{run_id}/{page}", _guard(api, run_page_route, browser=True), methods=["GET"]),
        Route("/api/v1/analyze", _guard(api, analyze_route), methods=["GET"]),
        Route("/api/v1/alerts", _guard(api, alerts_route), methods=["GET"]),
        Route("/api/v1/alerts/explain", _guard(api, explain_route), methods=["GET"]),
        Route("/api/v1/dashboards/export", _guard(api, export_route), methods=["POST"]),
        Route("/api/v1/jobs", _guard(api, jobs_route), methods=["GET"]),
        Route("/api/v1/jobs/{name}/run", _guard(api, run_job_route), methods=["POST"]),
        Mount("/dashboards", app=_GuardedStatic(api, out_dir), name="dashboards"),
    ]


class RunPages:
    """The views of persisted analysis runs, rendered on first request and kept on disk a while.

    A run never changes once persisted, so its pages are written once, into a staging directory
    renamed to ``<root>/<run_id>`` (a reader never sees half a run), and served from there until
    :meth:`prune` deletes them, ``dashboards.runs_max_age`` after they were rendered; a page asked
    for after that is rendered again from the run, which the store keeps longer. The pages load
    the one plotly.js the service serves (``../../plotly-<version>.min.js``): about 100 KB a page
    rather than 4.8 MB.
    """

    # Pruning looks at the directory at most this often (seconds); renders and job runs ask.
    PRUNE_EVERY_S = 60.0

    def __init__(self, api: ServiceApi, root: Path) -> None:
        self.api = api
        self.root = root
        # One render, read or prune at a time: renders are rare (one per alert), reads are small
        # files, and a prune must not delete a run between a reader's check and its read.
        self._lock = threading.Lock()
        self._pruned_at = -float("inf")

    @property
    def max_age_s(self) -> float:
        return float(self.api.config.dashboards.runs_max_age)

    def read(self, run_id: str, page: str) -> bytes | None:
        """The bytes of ``page`` (``index.html`` or ``<view>.html``) of run ``run_id``, rendered
        now if it is not on disk; ``None`` when there is no such page or run."""
        from dashboards import VIEWS

        if not _RUN_ID.fullmatch(run_id) or page not in {"index.html", *(f"{v}.html" for v in VIEWS)}:
            return None
        self.prune_soon()
        path = self.root / run_id / page
        with self._lock:
            # Not rendered yet, pruned, or rendered before this view existed (an upgrade): render it.
            if not path.is_file() and not self._render(run_id):
                return None
            try:
                return path.read_bytes()
            except FileNotFoundError:
                return None

    def prune_soon(self) -> None:
        """:meth:`prune` unless it ran less than :attr:`PRUNE_EVERY_S` ago."""
        if time.monotonic() - self._pruned_at >= self.PRUNE_EVERY_S:
            self.prune()

    def prune(self, now: float | None = None) -> list[str]:
        """Delete the run directories rendered more than ``runs_max_age`` before ``now`` (Unix
        time, default the clock), and render leftovers as old; returns the run ids deleted."""
        now = time.time() if now is None else now
        cutoff = now - self.max_age_s
        deleted: list[str] = []
        with self._lock:
            self._pruned_at = time.monotonic()
            try:
                entries = list(self.root.iterdir())
            except FileNotFoundError:
                return deleted
            for entry in entries:
                name = entry.name
                if not (_RUN_ID.fullmatch(name) or name.startswith((".render-", ".outdated-", ".pruned-"))):
                    continue
                try:
                    if entry.stat().st_mtime >= cutoff:
                        continue
                    # Out of the way first, so the run is either whole or absent for any reader.
                    doomed = Path(tempfile.mkdtemp(prefix=".pruned-", dir=self.root)) / name
                    os.replace(entry, doomed)
                    shutil.rmtree(doomed.parent, ignore_errors=True)
                except OSError as exc:
                    log.warning("could not prune the run pages %s: %s", entry, exc)
                    continue
                if _RUN_ID.fullmatch(name):
                    deleted.append(name)
        if deleted:
            log.info("pruned the pages of %d analysis runs older than %.0fs", len(deleted), self.max_age_s)
        return deleted

    def _render(self, run_id: str) -> bool:
        from analytics import load_run
        from dashboards import (
            PLOTLY_JS,
            alerts_in_window,
            with_drift_report,
            write_dashboards,
            write_plotly_js,
        )

        analysis = load_run(self.api.store, run_id)
        if analysis is None:
            return False
        # Transitions stamped at the window's end (the evaluation that raised the alert) belong to it.
        alerts, _ = alerts_in_window(self.api.store, analysis.start, analysis.end)
        # The drift report is not persisted with the run: the one kept for its end's hour.
        targets = latency_targets(self.api.config.rules.files, warn=log.warning)
        analysis, _ = with_drift_report(
            self.api.store, analysis, _conventions(self.api), latency_targets=targets
        )
        self.root.mkdir(parents=True, exist_ok=True)
        # Served from the plotly package by the route; the copy makes <out_dir> browsable from disk.
        write_plotly_js(self.root.parent)
        staging = Path(tempfile.mkdtemp(prefix=".render-", dir=self.root))
        try:
            write_dashboards(
                analysis,
                staging,
                alerts=alerts,
                formats=("html",),
                # Another run over the very same window may be newer: the page names what it shows.
                run_id=analysis.run_id or run_id,
                trace_url=self.api.config.links.trace_url,
                plotly_js=f"../../{PLOTLY_JS}",
            )
            target = self.root / run_id
            if target.exists():
                outdated = Path(tempfile.mkdtemp(prefix=".outdated-", dir=self.root))
                os.replace(target, outdated / run_id)
                shutil.rmtree(outdated, ignore_errors=True)
            os.replace(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return True


class _Landing:
    """``/dashboards/``: the alerts as they are now and the latest scheduled analysis' views, or,
    before any analysis, what the page waits for. The analysis is loaded once per run id."""

    def __init__(self, api: ServiceApi) -> None:
        self.api = api
        self._cached: tuple[str, Any] | None = None
        self._lock = threading.Lock()

    def _analysis(self) -> tuple[Any, str | None, list[str]]:
        """The analysis to show, its run id, and notes on where it comes from."""
        from analytics import load_run, runs

        store = self.api.store
        scheduled = self.api.scheduled_run() if self.api.scheduled_run is not None else None
        notes: list[str] = []
        run_id = scheduled
        if run_id is None:
            # None yet in this process (just started): the newest persisted run, as /metrics does.
            newest = runs(store, limit=1)
            run_id = str(newest["run_id"][0]) if newest.height else None
            if run_id is not None:
                notes.append(
                    "The newest persisted analysis is shown until this service's first scheduled one"
                    + _next_run_text(self.api, "analyze")
                    + "."
                )
        if run_id is None:
            return None, None, notes
        with self._lock:
            if self._cached is not None and self._cached[0] == run_id:
                return self._cached[1], run_id, notes
        analysis = load_run(store, run_id)
        if analysis is None:
            return None, None, notes
        with self._lock:
            self._cached = (run_id, analysis)
        return analysis, run_id, notes

    def render(self) -> str:
        from dashboards import landing_page
        from slo_rules import list_alerts

        now = datetime.now(UTC)
        analysis, run_id, notes = self._analysis()
        since = now - RESOLVED_LOOKBACK
        alerts = list_alerts(self.api.store, include_resolved_since=since)
        waiting = "" if analysis is not None else _waiting_text(self.api)
        if (self.api.config.dashboards.out_dir / "index.html").is_file():
            notes.append("The hourly export (the offline copy of these pages) is index.html.")
        return landing_page(
            analysis, alerts, now=now, run_id=run_id, waiting=waiting, resolved_since=since, notes=notes
        )


def _next_run_text(api: ServiceApi, job: str) -> str:
    when = api.next_run(job) if api.next_run is not None else None
    if when is None:
        return " (the analyze job is not scheduled on this instance)"
    return f" at {as_utc(when).strftime('%H:%M:%S')} UTC"


def _waiting_text(api: ServiceApi) -> str:
    """What the landing page waits for before any analysis: the spans received so far and when
    the first analysis runs."""
    from collectors import TRACES_TABLE

    store = api.store
    table = store.table(TRACES_TABLE)
    count = int(store.query_value(f"SELECT count() FROM {table}") or 0)
    if not count:
        spans = "No spans received yet: point your OpenTelemetry exporters at this service's OTLP endpoints."
    elif count > WAITING_RANGE_MAX_SPANS:
        # A big table with no analysis yet (a new service on an old store): its range costs a scan.
        spans = f"{count:,} spans in the store."
    else:
        first, last = store.query_rows(f"SELECT min(Timestamp), max(Timestamp) FROM {table}")[0]
        fmt = "%Y-%m-%d %H:%M:%S"
        spans = (
            f"{count:,} spans received, from {as_utc(first).strftime(fmt)} to "
            f"{as_utc(last).strftime(fmt)} UTC."
        )
    return f"{spans} First analysis{_next_run_text(api, 'analyze')}."


def _request_json(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise _BadRequest("the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise _BadRequest("the body must be a JSON object")
    return body


def _conventions(api: ServiceApi) -> Any:
    return api.config.analysis.conventions_object()
