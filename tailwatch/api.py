"""The service's read API and dashboards, mounted on the OTLP/HTTP port.

While ``tailwatch serve`` owns an embedded store no other process can open it, so the read
commands come here instead (:mod:`tailwatch.remote`):

- ``GET /api/v1/analyze?start=ISO&end=ISO[&baseline_start=ISO&baseline_end=ISO]`` — the same JSON
  object as ``tailwatch analyze --format json``;
- ``GET /api/v1/alerts[?include_resolved_since=ISO][&format=json|arrow]`` — ``slo_rules.list_alerts``;
- ``POST /api/v1/dashboards/export`` (JSON body ``{"start", "end", "formats"}``) — a zip of the
  exported files;
- ``GET /api/v1/jobs`` — the newest job runs; ``POST /api/v1/jobs/{name}/run`` runs one now;
- ``GET /dashboards/…`` — the latest dashboards the scheduled export wrote (static files).

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
import shutil
import tempfile
import threading
import zipfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from storage import Store, TailwatchError, as_utc, parse_time
from tailwatch.config import TailwatchConfig
from tailwatch.remote import EXPORT_REPORT_HEADER
from tailwatch.service_schema import recent_job_runs

__all__ = ["ARROW_STREAM", "ServiceApi", "api_routes"]

ARROW_STREAM = "application/vnd.apache.arrow.stream"


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
    slots: threading.BoundedSemaphore = field(
        default_factory=lambda: threading.BoundedSemaphore(API_CONCURRENCY)
    )

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


def _guard(api: ServiceApi, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        reason = refusal(api, request)
        if reason is not None:
            return _json({"error": reason}, 403)
        if not api.authorized(request):
            return _unauthorized(browser=False)
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

    def export_route(request: Request, raw: bytes) -> Response:
        from dashboards import export_dashboards

        body = _request_json(raw)
        start = _time_param(body["start"], "start") if body.get("start") else None
        end = _time_param(body["end"], "end") if body.get("end") else None
        formats = body.get("formats") or ["html"]
        if not isinstance(formats, list) or any(f not in ("html", "png") for f in formats):
            raise _BadRequest("formats: a list of 'html' and/or 'png'")
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

    return [
        Route("/api/v1/analyze", _guard(api, analyze_route), methods=["GET"]),
        Route("/api/v1/alerts", _guard(api, alerts_route), methods=["GET"]),
        Route("/api/v1/dashboards/export", _guard(api, export_route), methods=["POST"]),
        Route("/api/v1/jobs", _guard(api, jobs_route), methods=["GET"]),
        Route("/api/v1/jobs/{name}/run", _guard(api, run_job_route), methods=["POST"]),
        Mount("/dashboards", app=_GuardedStatic(api, out_dir), name="dashboards"),
    ]


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
