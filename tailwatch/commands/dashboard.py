"""``tailwatch dashboard export``: the Plotly views as self-contained HTML (and PNG) files."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import click

from tailwatch.commands._common import ISO_TIME, command_config, require_traces, store_option
from tailwatch.remote import RemoteService, store_or_service


@click.group()
def dashboard() -> None:
    """Plotly dashboards of every tail metric."""


@dashboard.command("export")
@store_option
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory for <view>.html and index.html (created if missing).",
)
@click.option("--start", type=ISO_TIME, default=None, help="Window start (ISO 8601; UTC if no offset).")
@click.option("--end", type=ISO_TIME, default=None, help="Window end (ISO 8601) [default: now].")
@click.option(
    "--format",
    "formats",
    type=click.Choice(["html", "png"]),
    multiple=True,
    default=("html",),
    show_default=True,
    help="html: one offline page per view; png: images through kaleido and Chromium (repeatable).",
)
def export(
    store_dsn: str | None,
    out_dir: Path,
    start: datetime | None,
    end: datetime | None,
    formats: tuple[str, ...],
) -> None:
    """Write one self-contained HTML page per view plus index.html.

    Without --start/--end: the latest persisted analysis, else the last 24 hours. A window no
    persisted analysis covers is analysed (and persisted) first. PNG needs Chromium: BROWSER_PATH
    or chromium on PATH.
    """
    from dashboards import check_formats, check_window, export_dashboards

    chosen = check_formats(formats)
    check_window(start, end)
    if "png" in chosen:
        # Rendering every view in headless Chromium takes seconds; say so before the wait.
        click.echo("rendering the views as PNG in headless Chromium (about 10 s)…", err=True)
    target = store_or_service(store_dsn)
    if isinstance(target, RemoteService):
        # A running `tailwatch serve` owns the embedded store: it exports, we unpack the files.
        report = target.export_dashboards(out_dir, start, end, chosen)
    else:
        with target as store:
            require_traces(store)
            trace_url = command_config(store_dsn).links.trace_url  # TAILWATCH_TRACE_URL or the file
            report = export_dashboards(store, out_dir, start, end, formats=chosen, trace_url=trace_url)
    for path in report.files:
        click.echo(str(path))
    window = f"{report.start:%Y-%m-%dT%H:%M:%SZ} → {report.end:%Y-%m-%dT%H:%M:%SZ}" if report.start else "?"
    how = "analysed now" if report.computed else "persisted analysis"
    run = f" {report.analysis_run_id}" if report.analysis_run_id else ""
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"{len(report.files)} files in {out_dir} · window {window} · {how}{run}", err=True)
