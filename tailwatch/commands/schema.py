"""``tailwatch schema print|apply``."""

from __future__ import annotations

import click

# Importing a stage registers its tables with storage; the wiring package is where all of them meet.
import analytics  # noqa: F401
import collectors  # noqa: F401
import slo_rules  # noqa: F401
import tailwatch.service_schema  # noqa: F401
from collectors import TRACES_TABLE
from storage import (
    DDLContext,
    Store,
    TailwatchError,
    ensure_schema,
    parse_dsn,
    registered_migrations,
    render_ddl,
)
from tailwatch.commands._common import store_option
from tailwatch.config import resolve_dsn
from tailwatch.remote import RemoteService, store_or_service

# The span tables with a TTL and the time each one's TTL counts from, as collectors/schema.py
# creates them (the trace-id lookup table is filled from the spans by a materialized view).
TTL_COLUMNS = ((TRACES_TABLE, "Timestamp"), ("otel_traces_trace_id_ts", "Start"))


@click.group()
def schema() -> None:
    """Create or print the ClickHouse schema (otel_traces and tailwatch_* tables)."""


@schema.command("print")
@click.option(
    "--cluster", metavar="NAME", help="Emit ON CLUSTER, Replicated*MergeTree and Distributed tables."
)
@click.option("--ttl-days", type=click.IntRange(min=1), help="Drop spans older than N days (TTL).")
@click.option("--database", default=None, help="Database name [default: the store DSN's, else 'default'].")
@store_option
def print_ddl(cluster: str | None, ttl_days: int | None, database: str | None, store_dsn: str | None) -> None:
    """Print the DDL without touching any store."""
    db = database or parse_dsn(resolve_dsn(store_dsn)).database
    click.echo(
        render_ddl(registered_migrations(), DDLContext(database=db, cluster=cluster, ttl_days=ttl_days)),
        nl=False,
    )


@schema.command("apply")
@click.option("--cluster", metavar="NAME", help="Create the tables ON CLUSTER with replicated engines.")
@click.option(
    "--ttl-days",
    type=click.IntRange(min=1),
    help="Drop spans older than N days (TTL); on existing span tables the TTL is changed to N days.",
)
@store_option
def apply(cluster: str | None, ttl_days: int | None, store_dsn: str | None) -> None:
    """Create the schema in the store (idempotent; records applied migrations).

    With --ttl-days, the span tables get that TTL whether they are created now or exist already.
    """
    target = store_or_service(store_dsn, create=True)
    if isinstance(target, RemoteService):
        target.close()
        if cluster or ttl_days:
            options = " and ".join(o for o, v in (("--cluster", cluster), ("--ttl-days", ttl_days)) if v)
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
        report = ensure_schema(store, cluster=cluster, ttl_days=ttl_days)
        changed = _set_ttl(store, cluster, ttl_days) if ttl_days else []
    for label in report.applied:
        click.echo(f"applied  {label}")
    for line in changed:
        click.echo(line)
    click.echo(
        f"{len(report.applied)} applied, {len(report.already)} already present in {store.location.redacted()}"
    )


def _set_ttl(store: Store, cluster: str | None, ttl_days: int) -> list[str]:
    """``MODIFY TTL`` on the span tables that exist (created earlier, possibly without a TTL).

    A table created by this very run already has it, and the statement is then a no-op."""
    ctx = DDLContext(database=store.database, cluster=cluster, ttl_days=ttl_days)
    lines = []
    for table, column in TTL_COLUMNS:
        local = ctx.local(table)
        if not store.table_exists(local):
            continue
        ttl = f"toDateTime({column}) + toIntervalDay({int(ttl_days)})"
        store.command(f"ALTER TABLE {ctx.name(local)}{ctx.on_cluster} MODIFY TTL {ttl}")
        lines.append(f"ttl      {local}: rows older than {ttl_days} days are dropped (TTL {ttl})")
    return lines
