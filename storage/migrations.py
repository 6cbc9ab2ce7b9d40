"""Versioned schema migrations for every stage's tables, and the registry that applies them once.

Each stage declares its tables as :class:`Migration` objects in its own ``schema`` module and
registers them on import (``register_migrations(MIGRATIONS)``), so the ground floor never names the
stages above it: importing a stage is what makes its tables part of :func:`ensure_schema`.
Registration order is import order, which follows the data (the span table before the analyses
that read it). :func:`apply_schema` records each applied (component, version) in
``tailwatch_schema_migrations``, so applying twice is a no-op; :func:`ensure_schema` also remembers,
per open store, what it applied, so stages may call it on every entry point for free.

With ``cluster`` set, every statement carries ``ON CLUSTER``, engines become ``Replicated*MergeTree``
and large tables get a ``Distributed`` table in front of a ``*_local`` one (sharded by TraceId, so a
trace's spans live on one shard).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from storage.errors import SchemaError
from storage.store import Store, quote_identifier

__all__ = [
    "MIGRATIONS_TABLE",
    "DDLContext",
    "Migration",
    "SchemaReport",
    "apply_schema",
    "ensure_schema",
    "register_migrations",
    "registered_migrations",
    "render_ddl",
]

MIGRATIONS_TABLE = "tailwatch_schema_migrations"


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
    todo = list(registered_migrations() if migrations is None else migrations)
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


_registry: list[Migration] = []
_registry_lock = threading.Lock()


def register_migrations(migrations: Iterable[Migration]) -> None:
    """Add a stage's migrations to what :func:`ensure_schema` applies (idempotent per migration)."""
    with _registry_lock:
        known = {(m.component, m.version) for m in _registry}
        for migration in migrations:
            if (migration.component, migration.version) not in known:
                _registry.append(migration)
                known.add((migration.component, migration.version))


def registered_migrations() -> list[Migration]:
    """Every migration registered so far, in registration (data-flow) order."""
    with _registry_lock:
        return list(_registry)


def ensure_schema(
    store: Store,
    migrations: Sequence[Migration] | None = None,
    *,
    cluster: str | None = None,
    ttl_days: int | None = None,
) -> SchemaReport:
    """Create what is missing of ``migrations`` (default: every registered one) on ``store``.

    A stage passes its own migrations, so it never creates another stage's tables (the rule engine
    does not make an empty ``otel_traces`` where the user's table is missing). The store object
    remembers what was applied through it: after the first call on a store this is a set lookup,
    not a query, so stages call it on every entry point.
    """
    todo = registered_migrations() if migrations is None else list(migrations)
    keys = {(m.component, m.version) for m in todo}
    with store.schema_lock:
        if keys <= store.schema_applied and cluster is None and ttl_days is None:
            return SchemaReport(already=[f"{m.component} v{m.version} {m.name}" for m in todo])
        report = apply_schema(store, todo, cluster=cluster, ttl_days=ttl_days)
        store.schema_applied |= keys
        return report
