"""collectors: the store, the OpenTelemetry Collector trace schema, and span ingest.

Public surface::

    from collectors import open_store, ensure_schema, SpanRow, insert_spans, read_spans
"""

from collectors.errors import SchemaError, StoreError, StoreInUseError, TailwatchError
from collectors.schema import (
    TRACES_ARROW_SCHEMA,
    TRACES_TABLE,
    DDLContext,
    Migration,
    apply_schema,
    ensure_schema,
    render_ddl,
    span_kind_sql,
    status_code_sql,
)
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
from collectors.store import Store, default_store_dsn, open_store, parse_dsn, resolve_dsn

__all__ = [
    "TRACES_ARROW_SCHEMA",
    "TRACES_TABLE",
    "DDLContext",
    "Migration",
    "SchemaError",
    "SpanEvent",
    "SpanLink",
    "SpanRow",
    "Store",
    "StoreError",
    "StoreInUseError",
    "TailwatchError",
    "apply_schema",
    "default_store_dsn",
    "ensure_schema",
    "insert_spans",
    "new_span_id",
    "new_trace_id",
    "open_store",
    "parse_dsn",
    "read_spans",
    "render_ddl",
    "resolve_dsn",
    "span_kind_sql",
    "spans_to_arrow",
    "status_code_sql",
]
