"""Spans as typed rows of ``otel_traces``: build them, turn them into Arrow, read them back.

:class:`SpanRow` is the column-for-column shape the Collector writes. It is how tests and tools
create traces with a known ground truth; the receivers build the same Arrow columns straight from
OTLP without going through Python objects.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa

from collectors.layout import inspect_traces
from collectors.schema import TRACES_ARROW_SCHEMA, TRACES_TABLE, span_kind_sql, status_code_sql
from collectors.writer import insert_traces_arrow
from storage import Store

__all__ = [
    "SpanEvent",
    "SpanLink",
    "SpanRow",
    "insert_spans",
    "new_span_id",
    "new_trace_id",
    "read_spans",
    "spans_to_arrow",
]


def new_trace_id() -> str:
    return secrets.token_hex(16)


def new_span_id() -> str:
    return secrets.token_hex(8)


@dataclass(frozen=True)
class SpanEvent:
    timestamp_ns: int
    name: str
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SpanLink:
    trace_id: str
    span_id: str
    trace_state: str = ""
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SpanRow:
    """One row of ``otel_traces``. Times are integer nanoseconds since the Unix epoch (UTC)."""

    trace_id: str
    span_id: str
    name: str
    start_ns: int
    duration_ns: int
    parent_span_id: str = ""
    kind: str = "Internal"
    service: str = ""
    resource_attributes: Mapping[str, str] = field(default_factory=dict)
    attributes: Mapping[str, str] = field(default_factory=dict)
    status_code: str = "Unset"
    status_message: str = ""
    scope_name: str = ""
    scope_version: str = ""
    trace_state: str = ""
    events: Sequence[SpanEvent] = ()
    links: Sequence[SpanLink] = ()

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns


def spans_to_arrow(spans: Iterable[SpanRow]) -> pa.Table:
    """Arrow columns in the Collector's insert order (:data:`TRACES_ARROW_SCHEMA`)."""
    cols: dict[str, list[Any]] = {name: [] for name in TRACES_ARROW_SCHEMA.names}
    for s in spans:
        resource = dict(s.resource_attributes)
        if s.service and "service.name" not in resource:
            resource["service.name"] = s.service
        cols["Timestamp"].append(s.start_ns)
        cols["TraceId"].append(s.trace_id)
        cols["SpanId"].append(s.span_id)
        cols["ParentSpanId"].append(s.parent_span_id)
        cols["TraceState"].append(s.trace_state)
        cols["SpanName"].append(s.name)
        cols["SpanKind"].append(s.kind)
        cols["ServiceName"].append(s.service)
        cols["ResourceAttributes"].append(list(resource.items()))
        cols["ScopeName"].append(s.scope_name)
        cols["ScopeVersion"].append(s.scope_version)
        cols["SpanAttributes"].append(list(dict(s.attributes).items()))
        cols["Duration"].append(s.duration_ns)
        cols["StatusCode"].append(s.status_code)
        cols["StatusMessage"].append(s.status_message)
        cols["Events.Timestamp"].append([e.timestamp_ns for e in s.events])
        cols["Events.Name"].append([e.name for e in s.events])
        cols["Events.Attributes"].append([list(dict(e.attributes).items()) for e in s.events])
        cols["Links.TraceId"].append([link.trace_id for link in s.links])
        cols["Links.SpanId"].append([link.span_id for link in s.links])
        cols["Links.TraceState"].append([link.trace_state for link in s.links])
        cols["Links.Attributes"].append([list(dict(link.attributes).items()) for link in s.links])
    arrays = [pa.array(cols[f.name], type=f.type) for f in TRACES_ARROW_SCHEMA]
    return pa.Table.from_arrays(arrays, schema=TRACES_ARROW_SCHEMA)


def insert_spans(store: Store, spans: Iterable[SpanRow] | pa.Table, table: str = TRACES_TABLE) -> int:
    """Insert spans (rows or an Arrow table in the trace schema); returns the number of rows.

    Works on the Map and the JSON (``json: true``) variants of the Collector's table alike."""
    data = spans if isinstance(spans, pa.Table) else spans_to_arrow(spans)
    insert_traces_arrow(store, table, data, inspect_traces(store, table=table).json)
    return data.num_rows


# Columns every reader selects by name, so extra columns (ClickStack's) never matter.
_READ_COLUMNS = ", ".join(
    [
        "Timestamp",
        "TraceId",
        "SpanId",
        "ParentSpanId",
        "TraceState",
        "SpanName",
        f"{span_kind_sql()} AS SpanKind",
        "ServiceName",
        "ResourceAttributes",
        "ScopeName",
        "ScopeVersion",
        "SpanAttributes",
        "Duration",
        f"{status_code_sql()} AS StatusCode",
        "StatusMessage",
        "`Events.Timestamp`",
        "`Events.Name`",
        "`Events.Attributes`",
        "`Links.TraceId`",
        "`Links.SpanId`",
        "`Links.TraceState`",
        "`Links.Attributes`",
    ]
)


def read_spans(
    store: Store,
    start: datetime | None = None,
    end: datetime | None = None,
    *,
    trace_id: str | None = None,
    dedupe: bool = True,
) -> pa.Table:
    """Spans with ``start <= Timestamp < end``, spellings normalized, one row per (TraceId, SpanId)."""
    where = ["1"]
    params: dict[str, Any] = {}
    if start is not None:
        where.append("Timestamp >= {start:DateTime64(9)}")
        params["start"] = start
    if end is not None:
        where.append("Timestamp < {end:DateTime64(9)}")
        params["end"] = end
    if trace_id is not None:
        where.append("TraceId = {trace_id:String}")
        params["trace_id"] = trace_id
    limit_by = "LIMIT 1 BY TraceId, SpanId" if dedupe else ""
    sql = (
        f"SELECT {_READ_COLUMNS} FROM {store.table(TRACES_TABLE)} WHERE {' AND '.join(where)} "
        f"ORDER BY Timestamp, TraceId, SpanId {limit_by}"
    )
    return store.query_arrow(sql, params)
