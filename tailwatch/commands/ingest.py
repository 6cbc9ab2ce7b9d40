"""``tailwatch ingest FILE...``: import OTLP trace files into the store."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from collectors import FileReport, IngestReport, PipelineSettings, ingest_files, read_export_requests
from tailwatch.commands._common import command_config, store_option
from tailwatch.remote import RemoteService, store_or_service


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

    While `tailwatch serve` owns the store, the spans are exported to its OTLP/HTTP receiver
    instead, which acknowledges them once spooled and inserts them shortly after.

    Invalid spans are rejected and counted; an unreadable file is reported and skipped (exit 1).
    """
    show = sys.stderr.isatty() if progress is None else progress
    config = command_config(store_dsn)
    native = config.ingest.native_insert  # TAILWATCH_NATIVE_INSERT=false → the Arrow path
    target = store_or_service(config.store, create=True)
    if isinstance(target, RemoteService):
        try:
            report = _through_service(target, files, batch_rows)
        finally:
            target.close()
        where = f" through the tailwatch service at {target.endpoint.api_url}"
    else:
        with target as store:
            report = ingest_files(
                store, files, batch_rows=batch_rows, progress=show, progress_file=sys.stderr, native=native
            )
        where = ""
    for f in report.files:
        click.echo(
            f"{f.path}: {f.format or 'unknown'}, {f.accepted} accepted, {f.rejected} rejected", err=True
        )
        for why in f.rejections:  # the first reasons, so a bad exporter can be fixed
            click.echo(f"  rejected: {why}", err=True)
    for error in report.errors:
        click.echo(f"tailwatch: warning: {error}", err=True)
    click.echo(
        f"ingested {report.accepted} spans ({report.rejected} rejected) from {len(report.files)} files{where}"
    )
    if report.errors:
        sys.exit(1)


def _through_service(service: RemoteService, files: tuple[Path, ...], batch_rows: int) -> IngestReport:
    """Each file's spans exported to the service's receiver, counted per file as it answered."""
    report = IngestReport()
    for path in files:
        file_report = FileReport(path)
        report.files.append(file_report)
        sent = service.send_spans(read_export_requests(path, file_report), batch_spans=batch_rows)
        file_report.accepted, file_report.rejected = sent.accepted, sent.rejected
        file_report.errors += [f"refused by the service: {e}" for e in sent.errors]
        for reason in sent.rejections:
            click.echo(f"{path}: {reason}", err=True)
    return report
