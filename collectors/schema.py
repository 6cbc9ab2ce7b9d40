"""The OpenTelemetry Collector's ClickHouse trace schema: ``otel_traces`` and its trace-id lookup.

``otel_traces`` and ``otel_traces_trace_id_ts`` (+ its materialized view) are created exactly as the
Collector's ``clickhouseexporter`` creates them today (its Map layout, or its JSON one with the
``json`` variant), so a table a Collector wrote is read unchanged and tailwatch's writes look like
the Collector's. A span table that exists already is never changed without consent: the lookup's
view is attached to it only with ``alter_foreign`` (``schema apply --yes``). Both are migrations
registered with the ground floor (:mod:`storage`) on import, so ``storage.ensure_schema`` creates
them before any stage's own tables.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa

from storage import DDLContext, Migration, Store, migration_state, register_migrations

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


# Each column's COMMENT: what it holds, for whoever reads the table in a SQL client.
_COMMENTS = {
    "Timestamp": "Span start time, UTC, nanoseconds",
    "TraceId": "Trace id: 32 lowercase hex digits",
    "SpanId": "Span id: 16 lowercase hex digits",
    "ParentSpanId": "Parent span id; empty for a root span",
    "TraceState": "W3C tracestate of the span context",
    "SpanName": "Span name: the operation",
    "SpanKind": "Server, Client, Producer, Consumer, Internal or Unspecified",
    "ServiceName": "The service.name resource attribute",
    "ResourceAttributes": "Attributes of the process that made the span",
    "ScopeName": "Instrumentation scope (library) name",
    "ScopeVersion": "Instrumentation scope (library) version",
    "SpanAttributes": "Attributes of the span",
    "Duration": "Span duration, nanoseconds",
    "StatusCode": "Unset, Ok or Error",
    "StatusMessage": "Status description, set with Error",
    "Events": "Span events: time, name, attributes",
    "Links": "Links to other spans: trace id, span id, trace state, attributes",
    "ResourceAttributeItems": "ResourceAttributes as key=value strings, for the attribute index",
    "SpanAttributeItems": "SpanAttributes as key=value strings, for the attribute index",
    "ResourceAttributesKeys": "The names of ResourceAttributes, for the key index",
    "SpanAttributesKeys": "The names of SpanAttributes, for the key index",
}


def _column(name: str, definition: str, codec: str = "CODEC(ZSTD(1))") -> str:
    # The comments are constants above (no quotes in them), never user input.
    return f"    {name} {definition} COMMENT '{_COMMENTS[name]}'" + (f" {codec}" if codec else "")


def _traces_body(ctx: DDLContext) -> list[str]:
    """The columns and indexes of ``otel_traces`` as the Collector's exporter creates them today:
    its Map layout (``traces_table.sql``) or, for the ``json`` variant, its JSON one."""
    json = ctx.variant == "json"
    attributes = "JSON" if json else "Map(LowCardinality(String), String)"
    lines = [
        _column("Timestamp", "DateTime64(9)", "CODEC(Delta(8), ZSTD(1))"),
        _column("TraceId", "String"),
        _column("SpanId", "String"),
        _column("ParentSpanId", "String"),
        _column("TraceState", "String"),
        _column("SpanName", "LowCardinality(String)"),
        _column("SpanKind", "LowCardinality(String)"),
        _column("ServiceName", "LowCardinality(String)"),
        _column("ResourceAttributes", attributes),
        _column("ScopeName", "String"),
        _column("ScopeVersion", "String"),
        _column("SpanAttributes", attributes),
        _column("Duration", "UInt64", "CODEC(ZSTD(1))" if json else "CODEC(T64, ZSTD(1))"),
        _column("StatusCode", "LowCardinality(String)"),
        _column("StatusMessage", "String"),
        _column(
            "Events",
            "Nested (\n        Timestamp DateTime64(9),\n        Name LowCardinality(String),\n"
            f"        Attributes {attributes}\n    )",
        ),
        _column(
            "Links",
            "Nested (\n        TraceId String,\n        SpanId String,\n        TraceState String,\n"
            f"        Attributes {attributes}\n    )",
        ),
    ]
    if json:
        # The exporter writes each map's key list beside it, for its bloom filters; a writer that
        # leaves them out (tailwatch's own inserts) gets them from the JSON paths.
        keys = [
            _column(
                f"{scope}AttributesKeys",
                f"Array(LowCardinality(String)) DEFAULT JSONAllPaths({scope}Attributes)",
            )
            for scope in ("Resource", "Span")
        ]
        lines = [*lines[:9], keys[0], *lines[9:12], keys[1], *lines[12:]]
        return [
            *lines,
            "    INDEX idx_res_attr_keys ResourceAttributesKeys TYPE bloom_filter(0.01) GRANULARITY 1",
            "    INDEX idx_span_attr_keys SpanAttributesKeys TYPE bloom_filter(0.01) GRANULARITY 1",
            "    INDEX idx_duration Duration TYPE minmax GRANULARITY 1",
        ]
    for scope in ("Resource", "Span"):
        lines.append(
            _column(
                f"{scope}AttributeItems",
                f"Array(String) ALIAS arrayMap(kv -> concat(kv.1, '=', kv.2), "
                f"CAST({scope}Attributes, 'Array(Tuple(String, String))'))",
                "",
            )
        )
    if ctx.supports(26, 2):
        # Full-text (``text``) indexes, as the exporter makes them from ClickHouse 26.2 on.
        lines += [
            "    INDEX idx_trace_id TraceId TYPE text(tokenizer = 'array')",
            "    INDEX idx_res_attr_key mapKeys(ResourceAttributes) TYPE text(tokenizer = 'array')",
            "    INDEX idx_res_attr_items ResourceAttributeItems TYPE text(tokenizer = 'array')",
            "    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE text(tokenizer = 'array')",
            "    INDEX idx_span_attr_items SpanAttributeItems TYPE text(tokenizer = 'array')",
        ]
    else:
        lines += [
            "    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1",
            *(
                f"    INDEX idx_{short}_attr_{part} {fn}({scope}Attributes) "
                "TYPE bloom_filter(0.01) GRANULARITY 1"
                for scope, short in (("Resource", "res"), ("Span", "span"))
                for part, fn in (("key", "mapKeys"), ("value", "mapValues"))
            ),
        ]
    return [
        *lines,
        "    INDEX idx_duration Duration TYPE minmax GRANULARITY 1",
        "    INDEX idx_lower_span_name lower(SpanName) TYPE tokenbf_v1(32768, 3, 0) GRANULARITY 8",
    ]


def _traces_table(ctx: DDLContext) -> list[str]:
    json = ctx.variant == "json"
    settings = "index_granularity = 8192, ttl_only_drop_parts = 1"
    if json and not ctx.supports(25, 3):
        # The JSON type is generally available from 25.3; before, the CREATE must enable it.
        settings += ", enable_json_type = 1"
    tail = (
        "PARTITION BY toDate(Timestamp)\n"
        + ("" if json else "PRIMARY KEY (ServiceName, SpanName, toDateTime(Timestamp))\n")
        + "ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)\n"
        + ctx.ttl_clause("Timestamp")
        + f"SETTINGS {settings}"
    )
    body = ",\n".join(_traces_body(ctx))
    return ctx.create_table(TRACES_TABLE, body, tail=tail, shard_key="cityHash64(TraceId)")


def _trace_id_ts(ctx: DDLContext) -> list[str]:
    body = """    TraceId String CODEC(ZSTD(1)),
    Start SimpleAggregateFunction(min, DateTime) CODEC(ZSTD(1)),
    End SimpleAggregateFunction(max, DateTime) CODEC(ZSTD(1))"""
    tail = (
        "PARTITION BY toStartOfWeek(Start)\nORDER BY (TraceId)\n"
        f"{ctx.ttl_clause('Start')}SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1"
    )
    statements = ctx.create_table(
        TRACE_ID_TS_TABLE, body, kind="AggregatingMergeTree", tail=tail, shard_key="cityHash64(TraceId)"
    )
    # On a distributed cluster the view reads each shard's local span table and writes its local
    # lookup table; in the collector layout both are the tables themselves.
    statements.append(
        f"CREATE MATERIALIZED VIEW IF NOT EXISTS {ctx.name(ctx.local(TRACE_ID_TS_VIEW))}{ctx.on_cluster}\n"
        f"TO {ctx.name(ctx.local(TRACE_ID_TS_TABLE))}\n"
        "AS SELECT\n    TraceId,\n    min(Timestamp) AS Start,\n    max(Timestamp) AS End\n"
        f"FROM {ctx.name(ctx.local(TRACES_TABLE))}\nWHERE TraceId != ''\nGROUP BY TraceId"
    )
    return statements


NOT_CREATED = (
    f"{TRACES_TABLE} was not created by tailwatch: not adding the trace-id lookup "
    "(a materialized view on it); rerun with --yes to add it"
)


def _lookup_guard(store: Store, ctx: DDLContext) -> str | None:
    """Why adding the lookup would change a span table tailwatch did not create (None: it would not).

    The view is attached to the span table: every insert into it then also writes the lookup, a
    change to the ingest of whoever made the table."""
    if migration_state(store, "collectors", 1) == "applied":
        return None
    if not store.table_exists(ctx.local(TRACES_TABLE)):
        return None  # nothing to attach to: the view's CREATE fails and says so
    return NOT_CREATED


# A table another tool made first is found, not created (recorded as such, see storage.migrations):
# the Collector creates both the span table and, in its Map layouts, the lookup table and view.
# These migrations render the layout current when a store is created; stores made earlier keep the
# tables they have (a recorded migration never runs again; the checksum is informational).
TRACES_MIGRATIONS: tuple[Migration, ...] = (
    Migration("collectors", 1, "otel_traces", _traces_table, found=(TRACES_TABLE,)),
    Migration(
        "collectors",
        2,
        "otel_traces_trace_id_ts",
        _trace_id_ts,
        found=(TRACE_ID_TS_TABLE, TRACE_ID_TS_VIEW),
        guard=_lookup_guard,
    ),
)

register_migrations(TRACES_MIGRATIONS)
