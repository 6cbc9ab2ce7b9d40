"""How a read command reaches the running service that owns an embedded store.

``tailwatch serve`` with a ``chdb://`` store writes ``<store dir>/tailwatch-service.json`` (its API
URL, pid and the name of the token variable) once listening, and removes it at exit. A command
opens its store through :func:`store_or_service`, the one place that decides between the two: the
store itself, or — when a running service holds it — a :class:`RemoteService` answering the same
operation over HTTP::

    target = store_or_service(dsn)              # or raises one line saying why neither works
    if isinstance(target, RemoteService):
        payload = target.analyze_json(start, end)
    else:
        with target as store:
            ...

The commands that write (``ingest``, ``alerts evaluate|deliver``, ``schema apply``) take the same
route: spans go to the service's OTLP/HTTP receiver, which acknowledges them into its spool, and
evaluation and delivery are its ``evaluate`` job, run now (``POST /api/v1/jobs/evaluate/run``).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import time
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import polars as pl

from dashboards import ExportReport
from storage import Store, StoreInUseError, open_store, parse_dsn, parse_time
from tailwatch.config import INGEST_TOKEN_ENV, resolve_dsn

__all__ = [
    "RemoteService",
    "ServiceUnavailableError",
    "SpanSendResult",
    "find_service",
    "for_store",
    "store_or_service",
]

SERVICE_FILE = "tailwatch-service.json"
# The summary of a dashboard export the API sends beside the zip of its files.
EXPORT_REPORT_HEADER = "X-Tailwatch-Export-Report"


def _time(value: object) -> datetime | None:
    return parse_time(value) if isinstance(value, str) and value else None


class ServiceUnavailableError(StoreInUseError):
    """The store is held by another process and no service API answers for it."""


@dataclass(frozen=True)
class ServiceEndpoint:
    api_url: str
    pid: int
    token_env: str = INGEST_TOKEN_ENV


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by another user
    return True


def find_service(dsn: str | None) -> ServiceEndpoint | None:
    """The service that announced itself for this embedded store, if its process is alive."""
    location = parse_dsn(resolve_dsn(dsn))
    if not location.embedded:
        return None
    path = Path(location.path) / SERVICE_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        endpoint = ServiceEndpoint(
            api_url=str(data["api_url"]).rstrip("/"),
            pid=int(data["pid"]),
            token_env=str(data.get("token_env") or INGEST_TOKEN_ENV),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return endpoint if _alive(endpoint.pid) else None


class RemoteService:
    """The read operations of a running service, over its HTTP API."""

    def __init__(self, endpoint: ServiceEndpoint, dsn: str, timeout_s: float = 600.0) -> None:
        self.endpoint = endpoint
        self.dsn = dsn
        token = os.environ.get(endpoint.token_env) or None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(base_url=endpoint.api_url, headers=headers, timeout=timeout_s)

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ServiceUnavailableError(
                f"store {self.dsn} is in use by the tailwatch service (pid {self.endpoint.pid}) "
                f"but its API at {self.endpoint.api_url} did not answer: {exc}"
            ) from None
        if response.status_code == 401:
            raise ServiceUnavailableError(
                f"the tailwatch service at {self.endpoint.api_url} requires its token: "
                f"set {self.endpoint.token_env}"
            )
        if response.status_code >= 400:
            try:
                message = response.json().get("error", response.text)
            except ValueError:
                message = response.text
            raise ServiceUnavailableError(
                f"the tailwatch service at {self.endpoint.api_url} answered {response.status_code}: "
                f"{' '.join(str(message).split())[:300]}"
            )
        return response

    def analyze_json(
        self,
        start: datetime,
        end: datetime,
        baseline_start: datetime | None = None,
        baseline_end: datetime | None = None,
    ) -> str:
        """The ``tailwatch analyze --format json`` text for this window, as the service printed it."""
        params = {"start": start.isoformat(), "end": end.isoformat()}
        if baseline_start is not None and baseline_end is not None:
            params |= {"baseline_start": baseline_start.isoformat(), "baseline_end": baseline_end.isoformat()}
        return self._request("GET", "/api/v1/analyze", params=params).text

    def analyze(
        self,
        start: datetime,
        end: datetime,
        baseline_start: datetime | None = None,
        baseline_end: datetime | None = None,
    ) -> dict[str, Any]:
        """The ``tailwatch analyze --format json`` object for this window."""
        body = json.loads(self.analyze_json(start, end, baseline_start, baseline_end))
        assert isinstance(body, dict)
        return body

    def list_alerts(self, include_resolved_since: datetime | None = None) -> pl.DataFrame:
        """``slo_rules.list_alerts`` as the service computes it (same columns and types)."""
        import pyarrow as pa

        params = {"format": "arrow"}
        if include_resolved_since is not None:
            params["include_resolved_since"] = include_resolved_since.isoformat()
        raw = self._request("GET", "/api/v1/alerts", params=params).content
        table = pa.ipc.open_stream(raw).read_all()
        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        return frame

    def export_dashboards(
        self,
        out_dir: Path,
        start: datetime | None = None,
        end: datetime | None = None,
        formats: Sequence[str] = ("html",),
    ) -> ExportReport:
        """Export through the service and unpack the files into ``out_dir``."""
        body = {
            "start": start.isoformat() if start else None,
            "end": end.isoformat() if end else None,
            "formats": list(formats),
        }
        response = self._request("POST", "/api/v1/dashboards/export", json=body)
        summary = json.loads(response.headers.get(EXPORT_REPORT_HEADER, "{}"))
        out_dir.mkdir(parents=True, exist_ok=True)
        root = out_dir.resolve()
        files: list[Path] = []
        with zipfile.ZipFile(io.BytesIO(response.content)) as archive:
            for name in archive.namelist():
                target = (root / name).resolve()
                # Never write outside out_dir, whatever names the archive carries.
                if root not in target.parents:
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(name))
                files.append(out_dir / target.relative_to(root))
        return ExportReport(
            files=files,
            analysis_run_id=summary.get("analysis_run_id"),
            start=_time(summary.get("start")),
            end=_time(summary.get("end")),
            computed=bool(summary.get("computed")),
            alerts=int(summary.get("alerts") or 0),
            notes=[str(n) for n in summary.get("notes") or []],
        )

    def run_job(self, name: str) -> dict[str, Any]:
        """Run one of the service's scheduled jobs now; the run as ``GET /api/v1/jobs`` lists it."""
        body = self._request("POST", f"/api/v1/jobs/{name}/run").json()
        assert isinstance(body, dict)
        return body

    def send_spans(
        self, requests: Iterable[Any], batch_spans: int = 5_000, result: SpanSendResult | None = None
    ) -> SpanSendResult:
        """Export decoded ``ExportTraceServiceRequest`` s to the service's ``POST /v1/traces``.

        Small requests (a JSON-lines file holds one per line) are merged up to ``batch_spans``
        spans per export. A 429/503 is retried after its ``Retry-After`` for up to a minute: the
        receiver says so when its queue is full, and the spans are not lost by waiting.
        ``result``, when given, is filled as the exports are answered (what an interrupted caller
        reads; ``in_flight`` is the export under way).
        """
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        result = SpanSendResult() if result is None else result
        pending = ExportTraceServiceRequest()
        count = 0
        for request in requests:
            pending.resource_spans.extend(request.resource_spans)
            count += _span_count(request)
            if count >= batch_spans:
                self._export(pending, count, result)
                pending, count = ExportTraceServiceRequest(), 0
        if count or pending.resource_spans:
            self._export(pending, count, result)
        return result

    def _export(self, request: Any, spans: int, result: SpanSendResult) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

        body = gzip.compress(request.SerializeToString(), compresslevel=1)
        headers = {"Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"}
        deadline = time.monotonic() + 60.0
        result.in_flight = spans  # until the receiver answers, acknowledged or not is unknown
        while True:
            try:
                response = self._client.post("/v1/traces", content=body, headers=headers)
            except httpx.HTTPError as exc:
                raise ServiceUnavailableError(
                    f"the tailwatch service's OTLP/HTTP receiver at {self.endpoint.api_url}/v1/traces "
                    f"did not answer: {exc}"
                ) from None
            wait = _retry_after(response)
            if response.status_code in (429, 503) and time.monotonic() + wait < deadline:
                time.sleep(wait)
                continue
            break
        result.in_flight = 0
        answer = ExportTraceServiceResponse()
        status_message = ""
        if response.status_code == 200:
            answer.ParseFromString(response.content)
        else:
            status_message = _status_message(response)
        if response.status_code == 401:
            raise ServiceUnavailableError(
                f"the tailwatch service at {self.endpoint.api_url} requires its token: "
                f"set {self.endpoint.token_env}"
            )
        if response.status_code != 200:
            # The whole export was refused (malformed, too large, or the service stopping).
            result.rejected += spans
            result.errors.append(f"{response.status_code}: {status_message}")
            return
        rejected = int(answer.partial_success.rejected_spans)
        result.accepted += spans - rejected
        result.rejected += rejected
        if answer.partial_success.error_message:
            result.rejections.append(answer.partial_success.error_message)

    def close(self) -> None:
        self._client.close()


@dataclass
class SpanSendResult:
    """What the service's receiver acknowledged (into its spool) and rejected, with its reasons."""

    accepted: int = 0
    rejected: int = 0
    # Spans of the export under way (0 once answered).
    in_flight: int = 0
    # Exports refused whole (the file's spans did not get in), and why spans were rejected.
    errors: list[str] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)


def _span_count(request: Any) -> int:
    return sum(len(scope.spans) for resource in request.resource_spans for scope in resource.scope_spans)


def _retry_after(response: httpx.Response) -> float:
    try:
        return max(0.1, min(float(response.headers.get("retry-after", "1")), 30.0))
    except ValueError:
        return 1.0


def _status_message(response: httpx.Response) -> str:
    """The message of the receiver's ``google.rpc.Status`` body (protobuf), else the text."""
    from google.rpc import status_pb2

    status = status_pb2.Status()
    try:
        status.ParseFromString(response.content)
    except Exception:  # any undecodable body is shown as text
        return " ".join(response.text.split())[:300]
    return status.message or " ".join(response.text.split())[:300]


def for_store(dsn: str | None, cause: StoreInUseError | None = None) -> RemoteService:
    """The running service's API for this store, or :class:`ServiceUnavailableError` (one line)."""
    resolved = resolve_dsn(dsn)
    endpoint = find_service(resolved)
    if endpoint is None:
        raise ServiceUnavailableError(
            f"store {resolved} is in use by another process and no tailwatch service API is "
            f"announced for it ({SERVICE_FILE} missing or stale); stop that process, or run "
            "`tailwatch serve` with OTLP/HTTP enabled so commands can go through its API"
        ) from cause
    return RemoteService(endpoint, resolved)


def store_or_service(dsn: str | None, *, create: bool = False) -> Store | RemoteService:
    """What a command works on: the store, or the service that owns it.

    A read never creates the store (``create=False``); ``ingest`` and ``schema apply`` do."""
    resolved = resolve_dsn(dsn)
    try:
        return open_store(resolved, create=create)
    except StoreInUseError as exc:
        return for_store(resolved, exc)
