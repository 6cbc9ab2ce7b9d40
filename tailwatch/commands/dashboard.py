"""``tailwatch dashboard export``: the Plotly views as self-contained HTML (and PNG) files."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import click

from tailwatch.commands._common import (
    command_config,
    latency_targets,
    refresh_summaries,
    require_traces,
    resolve_window,
    store_config_options,
    window_options,
)
from tailwatch.remote import RemoteService, store_or_service


@click.group()
def dashboard() -> None:
    """Plotly dashboards of every tail metric."""


@dashboard.command("export")
@store_config_options
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory for <view>.html and index.html, created if missing "
    "[default: dashboards.out_dir of the config, else .tailwatch/dashboards].",
)
@window_options(
    "dashboards.window of the config; without it, the latest persisted analysis, else the last 24 hours"
)
@click.option(
    "--format",
    "formats",
    type=click.Choice(["html", "png"]),
    multiple=True,
    default=None,
    help="html: one offline page per view; png: images through kaleido and Chromium (repeatable) "
    "[default: dashboards.formats of the config, else html].",
)
def export(
    store_dsn: str | None,
    config_path: Path | None,
    out_dir: Path | None,
    start: datetime | None,
    end: datetime | None,
    last: timedelta | None,
    formats: tuple[str, ...],
) -> None:
    """Write one self-contained HTML page per view plus index.html.

    The window: --start/--end, or --last DURATION ending at --end (else now); without any of them
    dashboards.window of the configuration ending now, else the latest persisted analysis, else the
    last 24 hours. A window no persisted analysis covers is analysed (and persisted) first, with the
    configuration's span conventions; exemplar traces link to links.trace_url. PNG needs Chromium:
    BROWSER_PATH or chromium on PATH.
    """
    from dashboards import check_formats, check_window, export_dashboards

    config = command_config(store_dsn, config_path)
    chosen = check_formats(formats or config.dashboards.formats)
    length = config.dashboards.window
    start, end = resolve_window(start, end, last, timedelta(seconds=length) if length else None)
    check_window(start, end)
    out_dir = out_dir or config.dashboards.out_dir
    if "png" in chosen:
        # Rendering every view in headless Chromium takes seconds; say so before the wait.
        click.echo("rendering the views as PNG in headless Chromium (about 10 s)…", err=True)
    target = store_or_service(config.store)
    if isinstance(target, RemoteService):
        # A running `tailwatch serve` owns the embedded store: it exports, we unpack the files.
        report = target.export_dashboards(out_dir, start, end, chosen)
    else:
        with target as store:
            require_traces(store)
            refresh_summaries(store, config)
            report = export_dashboards(
                store,
                out_dir,
                start,
                end,
                formats=chosen,
                conventions=config.analysis.conventions_object(),
                trace_url=config.links.trace_url,
                latency_targets=latency_targets(config.rules.files),
            )
    for path in report.files:
        click.echo(str(path))
    window = f"{report.start:%Y-%m-%dT%H:%M:%SZ} → {report.end:%Y-%m-%dT%H:%M:%SZ}" if report.start else "?"
    how = "analysed now" if report.computed else "persisted analysis"
    run = f" {report.analysis_run_id}" if report.analysis_run_id else ""
    for note in report.notes:
        click.echo(f"note: {note}", err=True)
    click.echo(f"{len(report.files)} files in {out_dir} · window {window} · {how}{run}", err=True)
