"""collectors: span ingest — OTLP receivers, the pipeline and spool, files, and the trace schema.

Public surface::

    from collectors import IngestRuntime, PipelineSettings              # receivers + pipeline
    with IngestRuntime(store, PipelineSettings(), http="127.0.0.1:4318", grpc=None) as runtime: ...
    from collectors import ClickHouseSpanExporter, ingest_files         # the SDK exporter, OTLP files
    from collectors import SpanRow, insert_spans, read_spans, inspect_traces, TRACES_TABLE
    inspect_traces(store).adapt(sql)       # the span table's layout; a Map-layout read made to fit it

The store itself (``open_store``, ``Store``, errors, migrations) is the ground floor, :mod:`storage`.
"""

import importlib
from typing import TYPE_CHECKING, Any

from collectors.layout import TracesLayout, distributed_parts, inspect_traces, json_first, json_lookups
from collectors.schema import (
    TRACES_ARROW_SCHEMA,
    TRACES_MIGRATIONS,
    TRACES_TABLE,
    span_kind_sql,
    status_code_sql,
)
from collectors.settings import (
    DEFAULT_GRPC_ADDRESS,
    DEFAULT_HTTP_ADDRESS,
    PipelineSettings,
    SettingsError,
    parse_address,
)
from collectors.spans import (
    SpanEvent,
    SpanLink,
    SpanRow,
    insert_spans,
    read_spans,
    spans_to_arrow,
)

# The ingest runtime (receivers, grpc, the SDK exporter) imports heavy libraries; load it on first
# use so `import collectors` stays cheap for the commands that only read the store.
_LAZY = {
    "ClickHouseSpanExporter": "collectors.exporter",
    "FileReport": "collectors.files",
    "IngestReport": "collectors.files",
    "ingest_files": "collectors.files",
    "read_export_requests": "collectors.files",
    "OtlpDecodeError": "collectors.otlp_decode",
    "IngestPipeline": "collectors.pipeline",
    "SubmitResult": "collectors.pipeline",
    "Receivers": "collectors.receivers",
    "IngestRuntime": "collectors.runtime",
}

if TYPE_CHECKING:
    from collectors.exporter import ClickHouseSpanExporter
    from collectors.files import FileReport, IngestReport, ingest_files, read_export_requests
    from collectors.pipeline import IngestPipeline, SubmitResult
    from collectors.receivers import Receivers
    from collectors.runtime import IngestRuntime


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'collectors' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "DEFAULT_GRPC_ADDRESS",
    "DEFAULT_HTTP_ADDRESS",
    "TRACES_ARROW_SCHEMA",
    "TRACES_MIGRATIONS",
    "TRACES_TABLE",
    "ClickHouseSpanExporter",
    "FileReport",
    "IngestPipeline",
    "IngestReport",
    "IngestRuntime",
    "PipelineSettings",
    "Receivers",
    "SettingsError",
    "SpanEvent",
    "SpanLink",
    "SpanRow",
    "SubmitResult",
    "TracesLayout",
    "distributed_parts",
    "ingest_files",
    "insert_spans",
    "inspect_traces",
    "json_first",
    "json_lookups",
    "parse_address",
    "read_export_requests",
    "read_spans",
    "span_kind_sql",
    "spans_to_arrow",
    "status_code_sql",
]
