"""Versioned schema migrations for every stage's tables, and the registry that applies them once.

Each stage declares its tables as :class:`Migration` objects in its own ``schema`` module and
registers them on import (``register_migrations(MIGRATIONS)``), so the ground floor never names the
stages above it: importing a stage is what makes its tables part of :func:`ensure_schema`.
Registration order is import order, which follows the data (the span table before the analyses
that read it). :func:`apply_schema` records each applied (component, version) in
``tailwatch_schema_migrations``, so applying twice is a no-op; :func:`ensure_schema` also remembers,
per open store, what it applied, so stages may call it on every entry point for free.

With ``cluster`` set, every statement carries ``ON CLUSTER`` and engines become
``Replicated*MergeTree``. Two cluster layouts: ``distributed`` (tailwatch's own) puts a
``Distributed`` table in front of a ``*_local`` one for large tables (sharded by TraceId, so a
trace's spans live on one shard); ``collector`` makes every table under its own name, as the
OpenTelemetry Collector's exporter does on a cluster, with no ``Distributed`` table.

A table another tool may have created first (the span table the Collector made) is *found*, not
created: the migration that would create it is recorded with the state ``found``, and a migration
whose ``guard`` says it would change such a table (a materialized view attached to it) is skipped,
unrecorded, unless the caller passes ``alter_foreign=True``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

from storage.errors import SchemaError
from storage.store import Store, quote_identifier

__all__ = [
    "MIGRATIONS_TABLE",
    "DDLContext",
    "Migration",
    "SchemaReport",
    "apply_schema",
    "ensure_schema",
    "migration_state",
    "register_migrations",
    "registered_migrations",
    "render_ddl",
]

MIGRATIONS_TABLE = "tailwatch_schema_migrations"
# The checksum recorded for a migration whose tables were already there, made by something else.
FOUND = "found"

ClusterLayout = Literal["distributed", "collector"]
CLUSTER_LAYOUTS: tuple[str, ...] = ("distributed", "collector")
VARIANTS: tuple[str, ...] = ("map", "json")

_UNITS = ((86400, "Day"), (3600, "Hour"), (60, "Minute"))


@dataclass(frozen=True)
class DDLContext:
    """Where and how DDL is rendered.

    ``ttl`` (or ``ttl_days``, kept for callers that count in days) drops old rows; ``cluster_layout``
    picks the cluster convention (see the module docstring); ``variant`` the span table's attribute
    columns (``map`` or ``json``); ``server_version`` (major, minor) enables what newer servers
    support (None: render what every supported server accepts).
    """

    database: str = "default"
    cluster: str | None = None
    ttl_days: int | None = None
    ttl: timedelta | None = None
    cluster_layout: str = "distributed"
    variant: str = "map"
    server_version: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.ttl_days is not None and self.ttl_days <= 0:
            raise SchemaError(f"ttl_days must be a positive number of days, got {self.ttl_days}")
        if self.ttl_days is not None and self.ttl is not None:
            raise SchemaError("give a TTL once: ttl or ttl_days")
        if self.ttl is not None:
            seconds = self.ttl.total_seconds()
            if seconds < 60 or seconds % 60:
                raise SchemaError(
                    f"a TTL is a positive number of whole minutes (30m, 72h, 7d), not {self.ttl}"
                )
        if self.cluster_layout not in CLUSTER_LAYOUTS:
            raise SchemaError(
                f"cluster layout is one of {', '.join(CLUSTER_LAYOUTS)}, not {self.cluster_layout!r}"
            )
        if self.variant not in VARIANTS:
            raise SchemaError(f"span table variant is one of {', '.join(VARIANTS)}, not {self.variant!r}")

    @property
    def on_cluster(self) -> str:
        return f" ON CLUSTER {quote_identifier(self.cluster)}" if self.cluster else ""

    @property
    def distributed(self) -> bool:
        """Whether large tables get a ``Distributed`` table in front of a ``*_local`` one."""
        return bool(self.cluster) and self.cluster_layout == "distributed"

    @property
    def ttl_seconds(self) -> int | None:
        if self.ttl is not None:
            return int(self.ttl.total_seconds())
        return self.ttl_days * 86400 if self.ttl_days else None

    def ttl_interval(self) -> str | None:
        """The TTL as the Collector's exporter writes it: ``toIntervalDay(7)``, ``toIntervalHour(72)``…
        in the largest unit that divides it exactly."""
        seconds = self.ttl_seconds
        if seconds is None:
            return None
        for size, unit in _UNITS:
            if seconds % size == 0:
                return f"toInterval{unit}({seconds // size})"
        raise SchemaError(f"a TTL is a whole number of minutes, got {seconds} seconds")  # pragma: no cover

    def ttl_clause(self, column: str) -> str:
        """``TTL toDateTime(<column>) + <interval>`` and a newline, or '' without a TTL."""
        interval = self.ttl_interval()
        return f"TTL toDateTime({column}) + {interval}\n" if interval else ""

    def supports(self, major: int, minor: int) -> bool:
        """Whether the server is known to be at least ``major.minor``."""
        return self.server_version is not None and self.server_version >= (major, minor)

    def name(self, table: str) -> str:
        return f"{quote_identifier(self.database)}.{quote_identifier(table)}"

    def local(self, table: str) -> str:
        """The table that holds the data: ``<table>_local`` on a distributed cluster, else ``<table>``."""
        return f"{table}_local" if self.distributed else table

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

        ``shard_key`` marks a large table: on a distributed cluster it becomes ``<table>_local`` plus
        a ``Distributed`` ``<table>`` in front, sharded by that expression.
        """
        data_table = self.local(table) if shard_key else table
        statements = [
            f"CREATE TABLE IF NOT EXISTS {self.name(data_table)}{self.on_cluster}\n(\n{body}\n)\n"
            f"ENGINE = {self.engine(kind, engine_args)}\n{tail}".rstrip()
        ]
        if self.cluster and self.distributed and shard_key:
            statements.append(
                f"CREATE TABLE IF NOT EXISTS {self.name(table)}{self.on_cluster} AS {self.name(data_table)}\n"
                f"ENGINE = Distributed({quote_identifier(self.cluster)}, {quote_identifier(self.database)}, "
                f"{quote_identifier(data_table)}, {shard_key})"
            )
        return statements


@dataclass(frozen=True)
class Migration:
    """One versioned step of a component's schema. ``render`` returns idempotent statements.

    ``found``: tables this migration creates that another tool may have made first; when every one
    of them exists before it runs, it is recorded as :data:`FOUND` (tailwatch did not create them).
    ``guard``: why applying it would change a table tailwatch did not create (None: it would not);
    such a migration is skipped and left unrecorded, unless applied with ``alter_foreign=True``.
    """

    component: str
    version: int
    name: str
    render: Callable[[DDLContext], list[str]]
    found: tuple[str, ...] = ()
    guard: Callable[[Store, DDLContext], str | None] | None = None

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
    """What :func:`apply_schema` did: the migrations it applied, those already present, those whose
    tables it found made by something else (recorded, nothing created) and those it skipped, each
    with the reason (``label: reason``)."""

    applied: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    found: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def server_version(store: Store) -> tuple[int, int] | None:
    """The server's (major, minor) from ``SELECT version()``; None when it cannot be read."""
    try:
        text = str(store.query_value("SELECT version()"))
        major, minor = text.split(".")[:2]
        return int(major), int(minor)
    except Exception:
        return None


def migration_state(store: Store, component: str, version: int) -> Literal["applied", "found"] | None:
    """How ``store`` recorded a migration: ``applied`` (tailwatch created its tables), ``found`` (they
    were there already, made by something else) or None (not recorded)."""
    if not store.table_exists(MIGRATIONS_TABLE):
        return None
    rows = store.query_rows(
        f"SELECT checksum FROM {store.table(MIGRATIONS_TABLE)} FINAL "
        "WHERE component = {component:String} AND version = {version:UInt32}",
        {"component": component, "version": version},
    )
    if not rows:
        return None
    return "found" if rows[0][0] == FOUND else "applied"


def render_ddl(migrations: Sequence[Migration], ctx: DDLContext) -> str:
    """The DDL of the given migrations as one script (``tailwatch schema print``)."""
    out: list[str] = []
    for statement in _migrations_table(ctx):
        out.append(statement + ";")
    for migration in migrations:
        out.append(f"-- {migration.component} v{migration.version}: {migration.name}")
        out.extend(statement + ";" for statement in migration.statements(ctx))
    return "\n\n".join(out) + "\n"


def _context(
    store: Store, context: DDLContext | None, cluster: str | None, ttl_days: int | None
) -> DDLContext:
    ctx = context or DDLContext()
    if cluster is not None or ttl_days is not None:
        ctx = dataclasses.replace(ctx, cluster=cluster or ctx.cluster, ttl_days=ttl_days or ctx.ttl_days)
    version = ctx.server_version or server_version(store)
    return dataclasses.replace(ctx, database=store.database, server_version=version)


def apply_schema(
    store: Store,
    migrations: Sequence[Migration] | None = None,
    *,
    cluster: str | None = None,
    ttl_days: int | None = None,
    context: DDLContext | None = None,
    alter_foreign: bool = False,
) -> SchemaReport:
    """Create what is missing, in order, recording each applied migration. Idempotent.

    ``context`` sets the cluster layout, TTL and span-table variant (its database is always the
    store's, its server version read from the store when unset); ``cluster``/``ttl_days`` override
    it. ``alter_foreign`` applies migrations whose guard says they change a table tailwatch did not
    create; without it they are skipped and reported (and stay pending for a later run).
    """
    ctx = _context(store, context, cluster, ttl_days)
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
        if migration.found and all(store.table_exists(table) for table in migration.found):
            # Made by something else: nothing to create, and recorded so that tailwatch never treats
            # the table as its own (see ``migration_state``).
            _record(store, migration, FOUND)
            report.found.append(label)
            continue
        reason = migration.guard(store, ctx) if migration.guard is not None else None
        if reason is not None and not alter_foreign:
            report.skipped.append(f"{label}: {reason}")
            continue
        for statement in migration.statements(ctx):
            try:
                store.command(statement)
            except Exception as exc:
                raise SchemaError(f"schema migration {label} failed: {exc}") from exc
        _record(store, migration, migration.checksum())
        report.applied.append(label)
    return report


def _record(store: Store, migration: Migration, checksum: str) -> None:
    store.command(
        f"INSERT INTO {store.table(MIGRATIONS_TABLE)} (component, version, name, checksum, applied_at) "
        "VALUES ({component:String}, {version:UInt32}, {name:String}, {checksum:String}, now64(3))",
        {
            "component": migration.component,
            "version": migration.version,
            "name": migration.name,
            "checksum": checksum,
        },
    )


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
    context: DDLContext | None = None,
    alter_foreign: bool = False,
) -> SchemaReport:
    """Create what is missing of ``migrations`` (default: every registered one) on ``store``.

    A stage passes its own migrations, so it never creates another stage's tables (the rule engine
    does not make an empty ``otel_traces`` where the user's table is missing). The store object
    remembers what was applied through it: after the first call on a store this is a set lookup,
    not a query, so stages call it on every entry point. A migration skipped by its guard counts
    as done for the store object (asked again only with ``alter_foreign``).
    """
    todo = registered_migrations() if migrations is None else list(migrations)
    keys = {(m.component, m.version) for m in todo}
    with store.schema_lock:
        explicit = cluster is not None or ttl_days is not None or context is not None or alter_foreign
        if keys <= store.schema_applied and not explicit:
            return SchemaReport(already=[f"{m.component} v{m.version} {m.name}" for m in todo])
        report = apply_schema(
            store, todo, cluster=cluster, ttl_days=ttl_days, context=context, alter_foreign=alter_foreign
        )
        store.schema_applied |= keys
        return report
