"""``tailwatch ingest FILE...``: import OTLP trace files into the store."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import click

from collectors import FileReport, IngestReport, PipelineSettings, ingest_files, read_export_requests
from tailwatch.commands._common import (
    EXIT_INTERRUPTED,
    EXIT_PROBLEM,
    command_config,
    store_config_options,
)
from tailwatch.remote import RemoteService, SpanSendResult, store_or_service


@click.command()
@store_config_options
@click.argument(
    # Existence is not checked here: a missing file is reported and skipped like an unreadable one,
    # and the others still import (exit 1).
    "files",
    nargs=-1,
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
)
@click.option(
    "--batch-rows",
    type=click.IntRange(min=1),
    default=None,
    help="Spans per insert [env TAILWATCH_BATCH_ROWS; default: ingest.batch_rows of the config, else "
    f"{PipelineSettings.batch_rows}].",
)
@click.option(
    "--progress/--no-progress", default=None, help="Progress bar [default: when stderr is a terminal]."
)
def ingest(
    store_dsn: str | None,
    config_path: Path | None,
    files: tuple[Path, ...],
    batch_rows: int | None,
    progress: bool | None,
) -> None:
    """Import OTLP files: protobuf ExportTraceServiceRequest, OTLP/JSON, or JSON lines as the
    Collector's file exporter writes them; each may be gzipped.

    The store and the [ingest] settings (batch_rows, native_insert) come from the configuration;
    options given here come first. While `tailwatch serve` owns the store, the spans are exported
    to its OTLP/HTTP receiver instead, which acknowledges them once spooled and inserts them
    shortly after.

    Invalid spans are rejected and counted; an unreadable file is reported and skipped (exit 1).
    Ctrl-C stops reading, inserts what was read and says what is in the store and what is left
    (exit 130); a second Ctrl-C stops at once.
    """
    show = sys.stderr.isatty() if progress is None else progress
    config = command_config(store_dsn, config_path)
    rows = batch_rows or config.ingest.batch_rows
    native = config.ingest.native_insert  # TAILWATCH_NATIVE_INSERT=false → the Arrow path
    report = IngestReport()
    where = "the store"
    service_url: str | None = None
    hard_stop = False
    with _CtrlC() as ctrl_c:
        try:
            target = store_or_service(config.store, create=True)
            if isinstance(target, RemoteService):
                service_url = target.endpoint.api_url
                where = f"the tailwatch service at {service_url} (acknowledged into its spool)"
                try:
                    _through_service(target, files, rows, ctrl_c.stop, report)
                finally:
                    target.close()
            else:
                where = f"the store {target.location.redacted()}"
                with target as store:
                    ingest_files(
                        store,
                        files,
                        batch_rows=rows,
                        progress=show,
                        progress_file=sys.stderr,
                        native=native,
                        stop=ctrl_c.stop.is_set,
                        report=report,
                    )
        except KeyboardInterrupt:
            hard_stop = True
        ctrl_c.reporting = True
        for f in report.files:
            click.echo(
                f"{f.path}: {f.format or 'unknown'}, {f.accepted} accepted, {f.rejected} rejected", err=True
            )
            for why in f.rejections:  # the first reasons, so a bad exporter can be fixed
                click.echo(f"  rejected: {why}", err=True)
        for error in report.errors:
            click.echo(f"tailwatch: warning: {error}", err=True)
        if hard_stop or report.interrupted:
            for line in _interrupted(report, files, where, hard_stop):
                click.echo(f"tailwatch: {line}", err=True)
            sys.exit(EXIT_INTERRUPTED)
        through = f" through the tailwatch service at {service_url}" if service_url else ""
        counts = f"{report.accepted} spans ({report.rejected} rejected) from {len(report.files)} files"
        click.echo(f"ingested {counts}{through}")
        if report.errors:
            sys.exit(EXIT_PROBLEM)


class _CtrlC:
    """Ctrl-C during an ingest: the first sets ``stop`` (the ingest inserts what it read, then
    ends), a second raises KeyboardInterrupt (the ingest ends at once), and once the report is
    being written (``reporting``) further ones are ignored so that it is written whole. Only the
    main thread takes signals; elsewhere nothing is installed."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.reporting = False
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> _CtrlC:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._on_sigint)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        if self.reporting:
            return
        if self.stop.is_set():
            raise KeyboardInterrupt
        self.stop.set()
        click.echo(
            "\ntailwatch: interrupted: inserting the spans read so far, then stopping "
            "(Ctrl-C again to stop at once)",
            err=True,
        )


def _interrupted(report: IngestReport, files: tuple[Path, ...], where: str, hard: bool) -> list[str]:
    """What an interrupted ingest says: what is in the store, what is left, and whether re-running
    is safe (it is: readers deduplicate spans, see collectors.pipeline)."""
    # A file read to its end whose last batch was cut short is not done either.
    done = [f for f in report.files if f.finished and f.committed == f.accepted]
    partly = [f for f in report.files if not (f.finished and f.committed == f.accepted)]
    left = [str(f.path) for f in partly] + [str(p) for p in files[len(report.files) :]]
    parts = [f"{f.path} whole ({f.committed:,} spans)" for f in done]
    parts += [f"{f.path} in part (its first {f.committed:,} spans)" for f in partly if f.committed]
    committed = report.committed
    lines = [
        f"interrupted: {committed:,} span{'' if committed == 1 else 's'} committed to {where}"
        + (f": {', '.join(parts)}" if parts else "")
    ]
    if hard and report.in_flight:
        lines.append(
            f"{report.in_flight:,} more spans were being inserted when it stopped: they may or may not "
            "be in the store"
        )
    if left:
        lines.append(f"not ingested whole: {' '.join(left)}")
    rerun = (
        "re-running the same command is safe: a span inserted again is a duplicate row of the same "
        "(TraceId, SpanId), which every analysis counts once"
    )
    if left and done:
        rerun += "; to insert fewer duplicate rows, run it with only the files not ingested whole: "
        rerun += " ".join(left)
    lines.append(rerun)
    return lines


def _until_stopped(stop: threading.Event, requests: Iterable[Any], file_report: FileReport) -> Iterator[Any]:
    """The file's requests until ``stop`` is set; the file is ``finished`` when read to its end."""
    for request in requests:
        yield request
        if stop.is_set():
            return
    file_report.finished = True


def _through_service(
    service: RemoteService,
    files: tuple[Path, ...],
    batch_rows: int,
    stop: threading.Event,
    report: IngestReport,
) -> None:
    """Each file's spans exported to the service's receiver, counted per file as it answered."""
    for path in files:
        if stop.is_set():
            report.interrupted = True
            return
        file_report = FileReport(path)
        report.files.append(file_report)
        sent = SpanSendResult()
        try:
            service.send_spans(
                _until_stopped(stop, read_export_requests(path, file_report), file_report),
                batch_spans=batch_rows,
                result=sent,
            )
        finally:
            # Acknowledged by the receiver = in its fsync'd spool: committed.
            file_report.accepted = file_report.committed = sent.accepted
            file_report.rejected = sent.rejected
            report.in_flight = sent.in_flight
        file_report.errors += [f"refused by the service: {e}" for e in sent.errors]
        for reason in sent.rejections:
            click.echo(f"{path}: {reason}", err=True)
        if not file_report.finished:
            report.interrupted = True
            return
