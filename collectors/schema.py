"""The OpenTelemetry Collector's ClickHouse trace schema, tailwatch's own tables, and migrations.

``otel_traces`` and ``otel_traces_trace_id_ts`` (+ its materialized view) are created exactly as the
Collector's ``clickhouseexporter`` creates them, so a table a Collector wrote is read unchanged and
tailwatch's writes look like the Collector's. Downstream stages declare their ``tailwatch_*`` tables
as :class:`Migration` objects in their own ``schema`` module (``MIGRATIONS``); :func:`apply_schema`
records each applied (component, version) in ``tailwatch_schema_migrations`` so applying twice is a
no-op.

With ``cluster`` set, every statement carries ``ON CLUSTER``, engines become ``Replicated*MergeTree``
and large tables get a ``Distributed`` table in front of a ``*_local`` one (sharded by TraceId, so a
trace's spans live on one shard).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from collectors.errors import SchemaError
from collectors.store import Store, quote_identifier

TRACES_TABLE = "otel_traces"
TRACE_ID_TS_TABLE = "otel_traces_trace_id_ts"
TRACE_ID_TS_VIEW = "otel_traces_trace_id_ts_mv"
MIGRATIONS_TABLE = "tailwatch_schema_migrations"

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


@dataclass(frozen=True)
class DDLContext:
    """Where and how DDL is rendered: database, optional cluster, optional TTL."""

    database: str = "default"
    cluster: str | None = None
    ttl_days: int | None = None

    def __post_init__(self) -> None:
        if self.ttl_days is not None and self.ttl_days <= 0:
            raise SchemaError(f"ttl_days must be a positive number of days, got {self.ttl_days}")

    @property
    def on_cluster(self) -> str:
        return f" ON CLUSTER {quote_identifier(self.cluster)}" if self.cluster else ""

    def name(self, table: str) -> str:
        return f"{quote_identifier(self.database)}.{quote_identifier(table)}"

    def local(self, table: str) -> str:
        """The table that holds the data: ``<table>_local`` on a cluster, ``<table>`` otherwise."""
        return f"{table}_local" if self.cluster else table

    def engine(self, kind: str = "MergeTree", args: str = "") -> str:
        if not self.cluster:
            return f"{kind}({args})" if args else kind
        path = "'/clickhouse/tables/{shard}/{database}/{table}', '{replica}'"
        return f"Replicated{kind}({path}{', ' + args if args else ''})"

    def create_table(
        self,
        table: str,
        body: str,
        *,
        kind: str = "MergeTree",
        engine_args: str = "",
        tail: str = "",
        shard_key: str | None = None,
    ) -> list[str]:
        """CREATE TABLE statements for one logical table.

        ``shard_key`` marks a large table: on a cluster it becomes ``<table>_local`` plus a
        ``Distributed`` ``<table>`` in front, sharded by that expression.
        """
        data_table = self.local(table) if shard_key else table
        statements = [
            f"CREATE TABLE IF NOT EXISTS {self.name(data_table)}{self.on_cluster}\n(\n{body}\n)\n"
            f"ENGINE = {self.engine(kind, engine_args)}\n{tail}".rstrip()
        ]
        if self.cluster and shard_key:
            statements.append(
                f"CREATE TABLE IF NOT EXISTS {self.name(table)}{self.on_cluster} AS {self.name(data_table)}\n"
                f"ENGINE = Distributed({quote_identifier(self.cluster)}, {quote_identifier(self.database)}, "
                f"{quote_identifier(data_table)}, {shard_key})"
            )
        return statements


@dataclass(frozen=True)
class Migration:
    """One versioned step of a component's schema. ``render`` returns idempotent statements."""

    component: str
    version: int
    name: str
    render: Callable[[DDLContext], list[str]]

    def statements(self, ctx: DDLContext) -> list[str]:
        return self.render(ctx)

    def checksum(self) -> str:
        text = "\n".join(self.render(DDLContext()))
        return hashlib.sha256(text.encode()).hexdigest()[:16]


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


def _migrations_table(ctx: DDLContext) -> list[str]:
    body = """    component LowCardinality(String),
    version UInt32,
    name String,
    checksum String,
    applied_at DateTime64(3, 'UTC')"""
    return ctx.create_table(
        MIGRATIONS_TABLE,
        body,
        kind="ReplacingMergeTree",
        engine_args="applied_at",
        tail="ORDER BY (component, version)",
    )


@dataclass
class SchemaReport:
    """What :func:`apply_schema` did: the migrations it applied and those already present."""

    applied: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)


def render_ddl(migrations: Sequence[Migration], ctx: DDLContext) -> str:
    """The DDL of the given migrations as one script (``tailwatch schema print``)."""
    out: list[str] = []
    for statement in _migrations_table(ctx):
        out.append(statement + ";")
    for migration in migrations:
        out.append(f"-- {migration.component} v{migration.version}: {migration.name}")
        out.extend(statement + ";" for statement in migration.statements(ctx))
    return "\n\n".join(out) + "\n"


def apply_schema(
    store: Store,
    migrations: Sequence[Migration] | None = None,
    *,
    cluster: str | None = None,
    ttl_days: int | None = None,
) -> SchemaReport:
    """Create what is missing, in order, recording each applied migration. Idempotent."""
    ctx = DDLContext(database=store.database, cluster=cluster, ttl_days=ttl_days)
    todo = list(TRACES_MIGRATIONS if migrations is None else migrations)
    for statement in _migrations_table(ctx):
        store.command(statement)
    done = {
        (component, int(version))
        for component, version in store.query_rows(
            f"SELECT component, version FROM {store.table(MIGRATIONS_TABLE)} FINAL"
        )
    }
    report = SchemaReport()
    for migration in todo:
        label = f"{migration.component} v{migration.version} {migration.name}"
        if (migration.component, migration.version) in done:
            report.already.append(label)
            continue
        for statement in migration.statements(ctx):
            try:
                store.command(statement)
            except Exception as exc:
                raise SchemaError(f"schema migration {label} failed: {exc}") from exc
        store.command(
            f"INSERT INTO {store.table(MIGRATIONS_TABLE)} (component, version, name, checksum, applied_at) "
            "VALUES ({component:String}, {version:UInt32}, {name:String}, {checksum:String}, now64(3))",
            {
                "component": migration.component,
                "version": migration.version,
                "name": migration.name,
                "checksum": migration.checksum(),
            },
        )
        report.applied.append(label)
    return report


def ensure_schema(store: Store) -> SchemaReport:
    """Apply the trace schema (``otel_traces`` and its lookup); later stages apply their own."""
    return apply_schema(store, TRACES_MIGRATIONS)
