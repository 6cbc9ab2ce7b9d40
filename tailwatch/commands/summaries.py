"""``tailwatch summaries``: build the per-minute summaries analyses read, and show what they cover."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import click

from storage import TailwatchError
from tailwatch.commands._common import (
    ISO_TIME,
    OutputFormat,
    command_config,
    format_option,
    require_traces,
    store_config_options,
)
from tailwatch.remote import RemoteService, store_or_service


@click.group("summaries")
def summaries() -> None:
    """The per-minute summaries of the spans: what every analysis (alerts, dashboards, the API,
    `tailwatch analyze`) reads instead of the span table where they reach. `tailwatch serve`
    builds them every minute (the rollup job); build them by hand on a store without a service."""


def _remote(target: object) -> None:
    if isinstance(target, RemoteService):
        raise TailwatchError(
            "a service owns this store and builds its summaries every minute (the rollup job); "
            "stop it to build them by hand, or read them with `tailwatch analyze`"
        )


@summaries.command("build")
@store_config_options
@click.option(
    "--until",
    type=ISO_TIME,
    default=None,
    help="Summarise up to this minute [default: now − the trace margin − 1 min].",
)
def build(store_dsn: str | None, config_path: Path | None, until: datetime | None) -> None:
    """Summarise every minute since the last build (all of them the first time, with progress),
    and again the recent minutes whose spans changed (late or repeated exports).

    The store and the span conventions (analysis.conventions) come from the configuration."""
    from analytics import build_summaries

    config = command_config(store_dsn, config_path)
    target = store_or_service(config.store)
    _remote(target)
    assert not isinstance(target, RemoteService)
    with target as store:
        require_traces(store)
        report = build_summaries(
            store,
            until=until,
            conventions=config.analysis.conventions_object(),
            progress=lambda line: click.echo(f"tailwatch: {line}", err=True),
        )
    click.echo(report.describe())


@summaries.command("status")
@store_config_options
@format_option()
def status(store_dsn: str | None, config_path: Path | None, output_format: OutputFormat) -> None:
    """The time the summaries cover, as ranges of whole minutes (UTC)."""
    from analytics import summary_coverage

    target = store_or_service(command_config(store_dsn, config_path).store)
    _remote(target)
    assert not isinstance(target, RemoteService)
    with target as store:
        covered = summary_coverage(store)
    if output_format == "json":
        click.echo(json.dumps([{"from": a.isoformat(), "until": b.isoformat()} for a, b in covered]))
        return
    if not covered:
        click.echo("no summaries yet: `tailwatch summaries build` (or `tailwatch serve`) makes them")
        return
    for a, b in covered:
        click.echo(
            f"{a:%Y-%m-%d %H:%M} .. {b:%Y-%m-%d %H:%M} UTC  ({int((b - a).total_seconds() // 60):,} minutes)"
        )
