"""``tailwatch schema print|apply``."""

from __future__ import annotations

import click

from collectors.schema import DDLContext, render_ddl
from collectors.store import open_store, parse_dsn, resolve_dsn
from tailwatch.commands._common import store_option
from tailwatch.schema import all_migrations, ensure_all


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
        render_ddl(all_migrations(), DDLContext(database=db, cluster=cluster, ttl_days=ttl_days)),
        nl=False,
    )


@schema.command("apply")
@click.option("--cluster", metavar="NAME", help="Create the tables ON CLUSTER with replicated engines.")
@click.option("--ttl-days", type=click.IntRange(min=1), help="Drop spans older than N days (TTL).")
@store_option
def apply(cluster: str | None, ttl_days: int | None, store_dsn: str | None) -> None:
    """Create the schema in the store (idempotent; records applied migrations)."""
    with open_store(store_dsn) as store:
        report = ensure_all(store, cluster=cluster, ttl_days=ttl_days)
    for label in report.applied:
        click.echo(f"applied  {label}")
    click.echo(
        f"{len(report.applied)} applied, {len(report.already)} already present in {store.location.redacted()}"
    )
