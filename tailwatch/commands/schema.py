"""``tailwatch schema print|apply``."""

from __future__ import annotations

import click

# Importing a stage registers its tables with storage; the wiring package is where all of them meet.
import analytics  # noqa: F401
import collectors  # noqa: F401
import slo_rules  # noqa: F401
import tailwatch.service_schema  # noqa: F401
from storage import DDLContext, ensure_schema, open_store, parse_dsn, registered_migrations, render_ddl
from tailwatch.commands._common import store_option
from tailwatch.config import resolve_dsn


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
@click.option("--ttl-days", type=click.IntRange(min=1), help="Drop spans older than N days (TTL).")
@store_option
def apply(cluster: str | None, ttl_days: int | None, store_dsn: str | None) -> None:
    """Create the schema in the store (idempotent; records applied migrations)."""
    with open_store(resolve_dsn(store_dsn)) as store:
        report = ensure_schema(store, cluster=cluster, ttl_days=ttl_days)
    for label in report.applied:
        click.echo(f"applied  {label}")
    click.echo(
        f"{len(report.applied)} applied, {len(report.already)} already present in {store.location.redacted()}"
    )
