"""Send ground-truth ``SpanRow`` s through the official OTLP/HTTP exporter, and a loopback webhook.

The rows go through the OpenTelemetry SDK's own ``ReadableSpan`` and ``OTLPSpanExporter``, so a
test exercises exactly what an instrumented application sends.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from collectors.spans import SpanRow

_KINDS = {
    "Internal": SpanKind.INTERNAL,
    "Server": SpanKind.SERVER,
    "Client": SpanKind.CLIENT,
    "Producer": SpanKind.PRODUCER,
    "Consumer": SpanKind.CONSUMER,
}
_STATUS = {"Unset": StatusCode.UNSET, "Ok": StatusCode.OK, "Error": StatusCode.ERROR}


def _context(trace_id: str, span_id: str) -> SpanContext:
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=False, trace_flags=TraceFlags(1))


def to_readable(row: SpanRow) -> ReadableSpan:
    resource = {**row.resource_attributes}
    if row.service:
        resource.setdefault("service.name", row.service)
    return ReadableSpan(
        name=row.name,
        context=_context(row.trace_id, row.span_id),
        parent=_context(row.trace_id, row.parent_span_id) if row.parent_span_id else None,
        resource=Resource(resource),
        attributes=dict(row.attributes),
        events=[Event(e.name, dict(e.attributes), e.timestamp_ns) for e in row.events],
        links=[Link(_context(lk.trace_id, lk.span_id), dict(lk.attributes)) for lk in row.links],
        kind=_KINDS[row.kind],
        status=Status(_STATUS[row.status_code], row.status_message or None),
        start_time=row.start_ns,
        end_time=row.end_ns,
        instrumentation_scope=InstrumentationScope(row.scope_name or "tests", row.scope_version or None),
    )


def export_rows(endpoint: str, rows: Sequence[SpanRow], token: str | None = None, batch: int = 512) -> int:
    """Export through ``OTLPSpanExporter`` in SDK-sized batches; the number of spans acknowledged."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    exporter = OTLPSpanExporter(endpoint=endpoint.rstrip("/") + "/v1/traces", headers=headers, timeout=30)
    acknowledged = 0
    try:
        for i in range(0, len(rows), batch):
            chunk = [to_readable(r) for r in rows[i : i + batch]]
            if exporter.export(chunk) == SpanExportResult.SUCCESS:
                acknowledged += len(chunk)
    finally:
        exporter.shutdown()
    return acknowledged


class WebhookSink:
    """Bodies POSTed to a loopback HTTP server, with their arrival times (monotonic)."""

    def __init__(self) -> None:
        self.received: list[tuple[float, dict[str, Any], dict[str, str]]] = []
        self.lock = threading.Lock()
        self.url = ""

    def bodies(self) -> list[dict[str, Any]]:
        with self.lock:
            return [body for _, body, _ in self.received]


@contextmanager
def webhook_sink() -> Iterator[WebhookSink]:
    import time

    sink = WebhookSink()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            raw = self.rfile.read(length)
            with sink.lock:
                sink.received.append((time.monotonic(), json.loads(raw), dict(self.headers)))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    sink.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        yield sink
    finally:
        server.shutdown()
        server.server_close()
