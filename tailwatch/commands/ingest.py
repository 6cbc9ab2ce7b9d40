"""``tailwatch ingest FILE...``: import OTLP trace files into the store."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from collectors import PipelineSettings, ingest_files
from storage import open_store
from tailwatch.commands._common import command_config, store_option


@click.command()
@store_option
@click.argument(
    # Existence is not checked here: a missing file is reported and skipped like an unreadable one,
    # and the others still import (exit 1).
    "files",
    nargs=-1,
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
)
@click.option(
    "--batch-rows", type=click.IntRange(min=1), default=PipelineSettings.batch_rows, show_default=True
)
@click.option(
    "--progress/--no-progress", default=None, help="Progress bar [default: when stderr is a terminal]."
)
def ingest(store_dsn: str | None, files: tuple[Path, ...], batch_rows: int, progress: bool | None) -> None:
    """Import OTLP files: protobuf ExportTraceServiceRequest, OTLP/JSON, or JSON lines as the
    Collector's file exporter writes them; each may be gzipped.

    Invalid spans are rejected and counted; an unreadable file is reported and skipped (exit 1).
    """
    show = sys.stderr.isatty() if progress is None else progress
    config = command_config(store_dsn)
    native = config.ingest.native_insert  # TAILWATCH_NATIVE_INSERT=false → the Arrow path
    with open_store(config.store) as store:
        report = ingest_files(
            store, files, batch_rows=batch_rows, progress=show, progress_file=sys.stderr, native=native
        )
    for f in report.files:
        click.echo(
            f"{f.path}: {f.format or 'unknown'}, {f.accepted} accepted, {f.rejected} rejected", err=True
        )
    for error in report.errors:
        click.echo(f"tailwatch: warning: {error}", err=True)
    click.echo(
        f"ingested {report.accepted} spans ({report.rejected} rejected) from {len(report.files)} files"
    )
    if report.errors:
        sys.exit(1)
