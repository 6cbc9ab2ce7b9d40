"""``tailwatch schema print|apply|inspect``."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import click

# Importing a stage registers its tables with storage; the wiring package is where all of them meet.
import analytics  # noqa: F401
import collectors  # noqa: F401
import slo_rules  # noqa: F401
import tailwatch.service_schema  # noqa: F401
from collectors import TRACES_TABLE, TracesLayout, inspect_traces
from storage import (
    DDLContext,
    SchemaError,
    Store,
    TailwatchError,
    ensure_schema,
    migration_state,
    parse_dsn,
    registered_migrations,
    render_ddl,
)
from tailwatch.commands._common import (
    DURATION,
    OutputFormat,
    check_traces,
    command_config,
    format_option,
    store_config_options,
)
from tailwatch.remote import RemoteService, store_or_service

# The span tables with a TTL, the time each one's TTL counts from and the migration that creates it,
# as collectors/schema.py creates them (the trace-id lookup is filled from the spans by a view).
TTL_COLUMNS = ((TRACES_TABLE, "Timestamp", 1), ("otel_traces_trace_id_ts", "Start", 2))

_VERSION = re.compile(r"^(\d+)\.(\d+)")


@click.group()
def schema() -> None:
    """Create, print or inspect the ClickHouse schema (otel_traces and tailwatch_* tables)."""


def _ttl(ttl: timedelta | None, ttl_days: int | None) -> tuple[timedelta | None, int | None]:
    if ttl is not None and ttl_days is not None:
        raise click.UsageError("give --ttl or --ttl-days, not both")
    return ttl, ttl_days


def _server_version(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    match = _VERSION.match(text.strip())
    if not match:
        raise click.BadParameter(f"{text!r} is not a version such as 26.2", param_hint="--server-version")
    return int(match.group(1)), int(match.group(2))


def _context(**kwargs: Any) -> DDLContext:
    try:
        return DDLContext(**kwargs)
    except SchemaError as exc:
        raise click.UsageError(str(exc)) from exc


_variant_option = click.option(
    "--variant",
    type=click.Choice(["map", "json"]),
    default="map",
    show_default=True,
    help="The span table's attribute columns: Map (the Collector's default) or JSON (its `json: true`).",
)
_ttl_option = click.option(
    "--ttl",
    type=DURATION,
    default=None,
    help="Drop spans older than this (30m, 72h, 7d); on existing span tables the TTL is changed.",
)
_ttl_days_option = click.option(
    "--ttl-days", type=click.IntRange(min=1), help="Like --ttl, in days (--ttl-days 7 = --ttl 7d)."
)
_layout_choice = click.Choice(["distributed", "collector"])


@schema.command("print")
@click.option(
    "--cluster", metavar="NAME", help="Emit ON CLUSTER and Replicated*MergeTree engines for cluster NAME."
)
@click.option(
    "--cluster-layout",
    type=_layout_choice,
    default="distributed",
    show_default=True,
    help="With --cluster: distributed = <table>_local + a Distributed <table> for large tables; "
    "collector = every table under its own name, as the Collector's exporter makes them.",
)
@_variant_option
@_ttl_option
@_ttl_days_option
@click.option(
    "--server-version",
    metavar="X.Y",
    default=None,
    help="Render for this ClickHouse version (text indexes from 26.2) [default: what every version accepts].",
)
@click.option(
    "--database", default=None, help="Database name [default: the database of the store, else 'default']."
)
@store_config_options
def print_ddl(
    cluster: str | None,
    cluster_layout: str,
    variant: str,
    ttl: timedelta | None,
    ttl_days: int | None,
    server_version: str | None,
    database: str | None,
    store_dsn: str | None,
    config_path: Path | None,
) -> None:
    """Print the DDL without touching any store."""
    ttl, ttl_days = _ttl(ttl, ttl_days)
    db = database or parse_dsn(command_config(store_dsn, config_path).store).database
    ctx = _context(
        database=db,
        cluster=cluster,
        cluster_layout=cluster_layout,
        variant=variant,
        ttl=ttl,
        ttl_days=ttl_days,
        server_version=_server_version(server_version),
    )
    click.echo(render_ddl(registered_migrations(), ctx), nl=False)


def cluster_layout_for(layout: TracesLayout) -> str:
    """The cluster convention to follow on a store whose span table is ``layout``.

    A span table that is there and not ``Distributed`` was made the Collector's way (under its own
    name, ``ON CLUSTER``, replicated): tailwatch's tables are then made the same way, next to it,
    rather than a ``_local`` + ``Distributed`` pair that would leave an empty ``otel_traces_local``.
    Otherwise (no span table yet, or a ``Distributed`` one) tailwatch's own convention."""
    return "collector" if layout.exists and layout.engine != "Distributed" else "distributed"


@schema.command("apply")
@click.option("--cluster", metavar="NAME", help="Create the tables ON CLUSTER with replicated engines.")
@click.option(
    "--cluster-layout",
    type=_layout_choice,
    default=None,
    help="With --cluster [default: collector when otel_traces exists and is not Distributed, "
    "else distributed].",
)
@_variant_option
@_ttl_option
@_ttl_days_option
@click.option(
    "--yes",
    is_flag=True,
    help="Also change tables tailwatch did not create: attach the trace-id lookup to an existing "
    "otel_traces, change its TTL.",
)
@store_config_options
def apply(
    cluster: str | None,
    cluster_layout: str | None,
    variant: str,
    ttl: timedelta | None,
    ttl_days: int | None,
    yes: bool,
    store_dsn: str | None,
    config_path: Path | None,
) -> None:
    """Create the schema in the store (idempotent; records applied migrations).

    An otel_traces that exists already (made by the Collector, ClickStack…) is used as it is:
    without --yes nothing is attached to it and its TTL is left alone. With --ttl/--ttl-days, the
    span tables tailwatch created get that TTL whether they are created now or exist already.
    """
    ttl, ttl_days = _ttl(ttl, ttl_days)
    target = store_or_service(command_config(store_dsn, config_path).store, create=True)
    if isinstance(target, RemoteService):
        target.close()
        given = (("--cluster", cluster), ("--ttl", ttl), ("--ttl-days", ttl_days), ("--yes", yes))
        if any(v for _, v in given):
            options = " and ".join(o for o, v in given if v)
            raise TailwatchError(
                f"store {target.dsn} is owned by the running tailwatch service (pid "
                f"{target.endpoint.pid}), which applied the schema when it started; {options} change "
                "existing tables: stop the service, run this command, then start it again"
            )
        click.echo(
            f"the running tailwatch service (pid {target.endpoint.pid}) applied the schema of "
            f"store {target.dsn} when it started: nothing to do"
        )
        return
    with target as store:
        layout = inspect_traces(store, refresh=True)
        if cluster and cluster_layout is None:
            cluster_layout = cluster_layout_for(layout)
        ctx = _context(
            database=store.database,
            cluster=cluster,
            cluster_layout=cluster_layout or "distributed",
            variant=variant,
            ttl=ttl,
            ttl_days=ttl_days,
        )
        report = ensure_schema(store, context=ctx, alter_foreign=yes)
        changed = _set_ttl(store, ctx, yes) if ctx.ttl_seconds else []
        inspect_traces(store, refresh=True)
    if cluster:
        click.echo(f"cluster  {cluster}: {ctx.cluster_layout} layout")
    for label in report.applied:
        click.echo(f"applied  {label}")
    for label in report.found:
        click.echo(f"found    {label} (made by something else; used as it is)")
    for line in report.skipped:
        click.echo(f"skipped  {line}")
    for line in changed:
        click.echo(line)
    counts = f"{len(report.applied)} applied, {len(report.already)} already present"
    if report.found:
        counts += f", {len(report.found)} found"
    if report.skipped:
        counts += f", {len(report.skipped)} skipped"
    click.echo(f"{counts} in {store.location.redacted()}")


def _set_ttl(store: Store, ctx: DDLContext, yes: bool) -> list[str]:
    """``MODIFY TTL`` on the span tables that exist (created earlier, possibly without a TTL).

    A table created by this very run already has it, and the statement is then a no-op. A table
    tailwatch did not create keeps its TTL unless ``yes``."""
    interval = ctx.ttl_interval()
    seconds = ctx.ttl_seconds or 0
    age = f"{seconds // 86400} days" if seconds % 86400 == 0 else _age(seconds)
    lines = []
    for table, column, version in TTL_COLUMNS:
        local = ctx.local(table)
        if not store.table_exists(local):
            continue
        if migration_state(store, "collectors", version) != "applied" and not yes:
            lines.append(
                f"skipped  ttl of {local}: {local} was not created by tailwatch: its TTL is left as it "
                "is; rerun with --yes to change it"
            )
            continue
        ttl = f"toDateTime({column}) + {interval}"
        store.command(f"ALTER TABLE {ctx.name(local)}{ctx.on_cluster} MODIFY TTL {ttl}")
        lines.append(f"ttl      {local}: rows older than {age} are dropped (TTL {ttl})")
    return lines


def _age(seconds: int) -> str:
    return f"{seconds // 3600} hours" if seconds % 3600 == 0 else f"{seconds // 60} minutes"


def _tables_report(store: Store) -> list[dict[str, Any]]:
    """Each registered migration: how the store recorded it and whether its table is there."""
    rows = []
    for migration in registered_migrations():
        table = migration.name.split()[0]
        plain = re.fullmatch(r"\w+", table) is not None
        rows.append(
            {
                "migration": f"{migration.component} v{migration.version}",
                "name": migration.name,
                "state": migration_state(store, migration.component, migration.version) or "pending",
                "table": table if plain else None,
                "present": store.table_exists(table) if plain else None,
            }
        )
    return rows


@schema.command("inspect")
@format_option()
@store_config_options
def inspect_command(output_format: OutputFormat, store_dsn: str | None, config_path: Path | None) -> None:
    """Say which otel_traces the store holds (variant, how tailwatch reads it, what it lacks) and
    which of tailwatch's own tables exist. Exit status 2 when tailwatch cannot read the spans."""
    target = store_or_service(command_config(store_dsn, config_path).store)
    if isinstance(target, RemoteService):
        target.close()
        raise TailwatchError(
            f"store {target.dsn} is owned by the running tailwatch service (pid {target.endpoint.pid}); "
            "`tailwatch schema inspect` reads its system tables directly: stop the service to inspect "
            "an embedded store, or inspect a server store by its http:// DSN"
        )
    with target as store:
        layout = inspect_traces(store, refresh=True)
        tables = _tables_report(store)
        where = store.location.redacted()
    if output_format == "json":
        click.echo(json.dumps({"store": where, "traces": asdict(layout), "migrations": tables}, indent=2))
    else:
        for line in layout.describe():
            click.echo(line)
        own = [t for t in tables if t["table"] and t["table"].startswith("tailwatch_")]
        present = sorted({t["table"] for t in own if t["present"]})
        missing = sorted({t["table"] for t in own if not t["present"]})
        click.echo(f"tailwatch tables present: {', '.join(present) or 'none'}")
        click.echo(f"tailwatch tables missing: {', '.join(missing) or 'none'}")
        for t in tables:
            if t["state"] != "applied":
                click.echo(f"migration {t['migration']} {t['name']}: {t['state']}")
        if missing:
            click.echo(f"create the missing tables with: tailwatch schema apply --store {where}")
    # Last, after the report: the same check every command that reads spans makes at start-up.
    check_traces(layout, where)
