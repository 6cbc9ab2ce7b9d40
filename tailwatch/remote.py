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
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import polars as pl

from dashboards import ExportReport
from storage import Store, StoreInUseError, open_store, parse_dsn, parse_time
from tailwatch.config import INGEST_TOKEN_ENV, resolve_dsn

__all__ = ["RemoteService", "ServiceUnavailableError", "find_service", "for_store", "store_or_service"]

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

    def close(self) -> None:
        self._client.close()


def for_store(dsn: str | None, cause: StoreInUseError | None = None) -> RemoteService:
    """The running service's API for this store, or :class:`ServiceUnavailableError` (one line)."""
    resolved = resolve_dsn(dsn)
    endpoint = find_service(resolved)
    if endpoint is None:
        raise ServiceUnavailableError(
            f"store {resolved} is in use by another process and no tailwatch service API is "
            f"announced for it ({SERVICE_FILE} missing or stale); stop that process, or run "
            "`tailwatch serve` with OTLP/HTTP enabled so read commands can go through its API"
        ) from cause
    return RemoteService(endpoint, resolved)


def store_or_service(dsn: str | None) -> Store | RemoteService:
    """What a read command reads: the store (never created by a read), or the service that owns it."""
    resolved = resolve_dsn(dsn)
    try:
        return open_store(resolved, create=False)
    except StoreInUseError as exc:
        return for_store(resolved, exc)
