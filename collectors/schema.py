"""The OpenTelemetry Collector's ClickHouse trace schema: ``otel_traces`` and its trace-id lookup.

``otel_traces`` and ``otel_traces_trace_id_ts`` (+ its materialized view) are created exactly as the
Collector's ``clickhouseexporter`` creates them, so a table a Collector wrote is read unchanged and
tailwatch's writes look like the Collector's. Both are migrations registered with the ground floor
(:mod:`storage`) on import, so ``storage.ensure_schema`` creates them before any stage's own tables.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from storage import DDLContext, Migration, register_migrations

TRACES_TABLE = "otel_traces"
TRACE_ID_TS_TABLE = "otel_traces_trace_id_ts"
TRACE_ID_TS_VIEW = "otel_traces_trace_id_ts_mv"

# Column order as the Collector inserts them. Nested columns are flattened the way ClickHouse
# stores them (``Events.Timestamp`` …), which is also how Arrow inserts address them.
_MAP = pa.map_(pa.string(), pa.string())
_TS = pa.timestamp("ns", tz="UTC")
TRACES_ARROW_SCHEMA = pa.schema(
    [
        pa.field("Timestamp", _TS, nullable=False),
        pa.field("TraceId", pa.string(), nullable=False),
        pa.field("SpanId", pa.string(), nullable=False),
        pa.field("ParentSpanId", pa.string(), nullable=False),
        pa.field("TraceState", pa.string(), nullable=False),
        pa.field("SpanName", pa.string(), nullable=False),
        pa.field("SpanKind", pa.string(), nullable=False),
        pa.field("ServiceName", pa.string(), nullable=False),
        pa.field("ResourceAttributes", _MAP, nullable=False),
        pa.field("ScopeName", pa.string(), nullable=False),
        pa.field("ScopeVersion", pa.string(), nullable=False),
        pa.field("SpanAttributes", _MAP, nullable=False),
        pa.field("Duration", pa.uint64(), nullable=False),
        pa.field("StatusCode", pa.string(), nullable=False),
        pa.field("StatusMessage", pa.string(), nullable=False),
        pa.field("Events.Timestamp", pa.list_(_TS), nullable=False),
        pa.field("Events.Name", pa.list_(pa.string()), nullable=False),
        pa.field("Events.Attributes", pa.list_(_MAP), nullable=False),
        pa.field("Links.TraceId", pa.list_(pa.string()), nullable=False),
        pa.field("Links.SpanId", pa.list_(pa.string()), nullable=False),
        pa.field("Links.TraceState", pa.list_(pa.string()), nullable=False),
        pa.field("Links.Attributes", pa.list_(_MAP), nullable=False),
    ]
)

SPAN_KINDS = ("Unspecified", "Internal", "Server", "Client", "Producer", "Consumer")
STATUS_CODES = ("Unset", "Ok", "Error")
_LEGACY_KINDS = tuple("SPAN_KIND_" + k.upper() for k in SPAN_KINDS)
_LEGACY_STATUS = tuple("STATUS_CODE_" + s.upper() for s in STATUS_CODES)


def _sql_list(values: Iterable[str]) -> str:
    # Constant enum spellings defined above, never user input.
    return "[" + ",".join(f"'{v}'" for v in values) + "]"


def span_kind_sql(column: str = "SpanKind") -> str:
    """A SQL expression giving the current spelling (``Server``) for both current and pre-2024 rows."""
    return f"transform({column}, {_sql_list(_LEGACY_KINDS)}, {_sql_list(SPAN_KINDS)}, {column})"


def status_code_sql(column: str = "StatusCode") -> str:
    """Like :func:`span_kind_sql` for ``StatusCode`` (``STATUS_CODE_ERROR`` → ``Error``)."""
    return f"transform({column}, {_sql_list(_LEGACY_STATUS)}, {_sql_list(STATUS_CODES)}, {column})"


def _traces_table(ctx: DDLContext) -> list[str]:
    ttl = f"TTL toDateTime(Timestamp) + toIntervalDay({int(ctx.ttl_days)})\n" if ctx.ttl_days else ""
    body = """    Timestamp DateTime64(9) CODEC(Delta, ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration UInt64 CODEC(ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_res_attr_value mapValues(ResourceAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_value mapValues(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1"""
    tail = (
        "PARTITION BY toDate(Timestamp)\n"
        "ORDER BY (ServiceName, SpanName, toDateTime(Timestamp))\n"
        f"{ttl}SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1"
    )
    return ctx.create_table(TRACES_TABLE, body, tail=tail, shard_key="cityHash64(TraceId)")


def _trace_id_ts(ctx: DDLContext) -> list[str]:
    ttl = f"TTL toDateTime(Start) + toIntervalDay({int(ctx.ttl_days)})\n" if ctx.ttl_days else ""
    body = """    TraceId String CODEC(ZSTD(1)),
    Start DateTime CODEC(Delta, ZSTD(1)),
    End DateTime CODEC(Delta, ZSTD(1)),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.01) GRANULARITY 1"""
    tail = f"PARTITION BY toDate(Start)\nORDER BY (TraceId, Start)\n{ttl}SETTINGS index_granularity = 8192"
    statements = ctx.create_table(TRACE_ID_TS_TABLE, body, tail=tail, shard_key="cityHash64(TraceId)")
    # On a cluster the view reads each shard's local span table and writes its local lookup table.
    statements.append(
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {ctx.name(ctx.local(TRACE_ID_TS_VIEW))}{ctx.on_cluster}\n"
        f"TO {ctx.name(ctx.local(TRACE_ID_TS_TABLE))}\n"
        "AS SELECT\n    TraceId,\n    min(Timestamp) AS Start,\n    max(Timestamp) AS End\n"
        f"FROM {ctx.name(ctx.local(TRACES_TABLE))}\nWHERE TraceId != ''\nGROUP BY TraceId"
    )
    return statements


TRACES_MIGRATIONS: tuple[Migration, ...] = (
    Migration("collectors", 1, "otel_traces", _traces_table),
    Migration("collectors", 2, "otel_traces_trace_id_ts", _trace_id_ts),
)

register_migrations(TRACES_MIGRATIONS)
