"""collectors: the store, the OpenTelemetry Collector trace schema, and span ingest.

Public surface::

    from collectors import open_store, ensure_schema, SpanRow, insert_spans, read_spans
    from collectors import IngestPipeline, PipelineSettings, Receivers      # OTLP receivers
    from collectors import ClickHouseSpanExporter, ingest_files             # SDK exporter, files
"""

import importlib
from typing import TYPE_CHECKING, Any

from collectors.schema import TRACES_ARROW_SCHEMA, TRACES_TABLE, span_kind_sql, status_code_sql
from collectors.spans import (
    SpanEvent,
    SpanLink,
    SpanRow,
    insert_spans,
    new_span_id,
    new_trace_id,
    read_spans,
    spans_to_arrow,
)
from storage import (
    DDLContext,
    Migration,
    SchemaError,
    Store,
    StoreError,
    StoreInUseError,
    TailwatchError,
    apply_schema,
    default_store_dsn,
    ensure_schema,
    open_store,
    parse_dsn,
    render_ddl,
)

# The ingest runtime (receivers, grpc, the SDK exporter) imports heavy libraries; load it on first
# use so `import collectors` stays cheap for the commands that only read the store.
_LAZY = {
    "ClickHouseSpanExporter": "collectors.exporter",
    "GrpcReceiver": "collectors.grpc_receiver",
    "IngestReport": "collectors.ingest_files",
    "ingest_files": "collectors.ingest_files",
    "DecodedSpans": "collectors.otlp_decode",
    "OtlpDecodeError": "collectors.otlp_decode",
    "request_to_arrow": "collectors.otlp_decode",
    "IngestPipeline": "collectors.pipeline",
    "SubmitResult": "collectors.pipeline",
    "create_http_app": "collectors.receiver",
    "Receivers": "collectors.receivers",
    "PipelineSettings": "collectors.settings",
    "SettingsError": "collectors.settings",
}

if TYPE_CHECKING:
    from collectors.exporter import ClickHouseSpanExporter
    from collectors.grpc_receiver import GrpcReceiver
    from collectors.ingest_files import IngestReport, ingest_files
    from collectors.otlp_decode import DecodedSpans, OtlpDecodeError, request_to_arrow
    from collectors.pipeline import IngestPipeline, SubmitResult
    from collectors.receiver import create_http_app
    from collectors.receivers import Receivers
    from collectors.settings import PipelineSettings, SettingsError


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'collectors' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "TRACES_ARROW_SCHEMA",
    "TRACES_TABLE",
    "ClickHouseSpanExporter",
    "DDLContext",
    "DecodedSpans",
    "GrpcReceiver",
    "IngestPipeline",
    "IngestReport",
    "Migration",
    "OtlpDecodeError",
    "PipelineSettings",
    "Receivers",
    "SchemaError",
    "SettingsError",
    "SpanEvent",
    "SpanLink",
    "SpanRow",
    "Store",
    "StoreError",
    "StoreInUseError",
    "SubmitResult",
    "TailwatchError",
    "apply_schema",
    "create_http_app",
    "default_store_dsn",
    "ensure_schema",
    "ingest_files",
    "insert_spans",
    "new_span_id",
    "new_trace_id",
    "open_store",
    "parse_dsn",
    "read_spans",
    "render_ddl",
    "request_to_arrow",
    "span_kind_sql",
    "spans_to_arrow",
    "status_code_sql",
]
