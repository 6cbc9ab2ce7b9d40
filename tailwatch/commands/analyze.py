"""``tailwatch analyze``: every tail metric over a window, as JSON or a readable table."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import click

from analytics import render_table
from storage import TailwatchError
from tailwatch.commands._common import (
    ISO_TIME,
    OutputFormat,
    command_config,
    format_option,
    latency_targets,
    refresh_summaries,
    require_traces,
    resolve_window,
    store_config_options,
    window_options,
)
from tailwatch.remote import RemoteService, store_or_service


def _held_range(store: Any) -> tuple[int, datetime, datetime] | None:
    """How many spans the store holds and from when to when (None when it holds none)."""
    from collectors import TRACES_TABLE

    count, first, last = store.query_rows(
        f"SELECT count(), min(Timestamp), max(Timestamp) FROM {store.table(TRACES_TABLE)}"
    )[0]
    return (int(count), first, last) if count else None


@click.command("analyze")
@store_config_options
@window_options("analysis.window of the config, else 1h")
@click.option(
    "--baseline-start",
    type=ISO_TIME,
    default=None,
    help="Baseline start [default: analysis.baseline of the config before --start, else as long as "
    "the window].",
)
@click.option("--baseline-end", type=ISO_TIME, default=None, help="Baseline end [default: --start].")
@format_option(default="json", help="json: one object; table: readable text.")
@click.option(
    "--drift-days",
    type=click.IntRange(min=0),
    default=None,
    help="Days before --end the architecture drift report reads, by day (its own window, apart from "
    "the analysis window); 0 leaves the report out [default: analysis.conventions drift_days, 14].",
)
@click.option(
    "--no-summaries",
    is_flag=True,
    help="Read every span of the window, not the per-minute summaries (the same figures, slower).",
)
def analyze(
    store_dsn: str | None,
    config_path: Path | None,
    start: datetime | None,
    end: datetime | None,
    last: timedelta | None,
    baseline_start: datetime | None,
    baseline_end: datetime | None,
    output_format: OutputFormat,
    drift_days: int | None,
    no_summaries: bool,
) -> None:
    """Hot-path p99 vs releases, cold-path enqueue-to-ready, abandonment, retry amplification and
    LLM-vs-internal attribution over [--start, --end) against a baseline window, and the
    architecture drift report (a batch job drifting into an online service) over the --drift-days
    days before --end.

    The store, the span conventions (analysis.conventions), the window's length (analysis.window)
    and the baseline's (analysis.baseline) come from the configuration; options given here come
    first. While `tailwatch serve` owns the store, the service analyses with its own conventions.
    """
    from analytics import Conventions, DriftReport
    from analytics import analyze as run_analysis

    if (baseline_start is None) != (baseline_end is None):
        raise TailwatchError("give both --baseline-start and --baseline-end, or neither")
    config = command_config(store_dsn, config_path)
    window_start, window_end = resolve_window(start, end, last, timedelta(seconds=config.analysis.window))
    assert window_start is not None and window_end is not None
    start, end = window_start, window_end
    if start >= end:
        raise TailwatchError(
            f"the window is empty: --start {start.isoformat()} is not before --end {end.isoformat()}"
        )
    if baseline_start is None and config.analysis.baseline:
        baseline_start, baseline_end = start - timedelta(seconds=config.analysis.baseline), start
    conventions = config.analysis.conventions_object() or Conventions()
    days = conventions.drift_days if drift_days is None else drift_days
    target = store_or_service(config.store)
    if isinstance(target, RemoteService):
        # The service answers the analysis alone: the drift report reads the store directly.
        text = target.analyze_json(start, end, baseline_start, baseline_end)
        click.echo(text if output_format == "json" else render_table(json.loads(text)))
        return
    with target as store:
        require_traces(store)
        if not no_summaries:
            refresh_summaries(store, config)
        analysis = run_analysis(
            store,
            start,
            end,
            baseline_start,
            baseline_end,
            conventions=conventions,
            use_summaries=not no_summaries,
        )
        if days:
            analysis = analysis.with_drift(
                DriftReport.read(
                    store, end, conventions, days=days, covered=latency_targets(config.rules.files)
                )
            )
        shown = (analysis.hot_path, analysis.cold_path, analysis.llm_calls, analysis.retry_amplification)
        empty = all(frame.is_empty() for frame in shown)
        held = _held_range(store) if empty else None
    data = analysis.to_dict()
    if output_format == "json":
        click.echo(json.dumps(data, allow_nan=False))
    else:
        click.echo(render_table(data))
    if empty:
        # An empty report says why, on stderr (stdout stays the JSON or table asked for).
        window = f"{analysis.start:%Y-%m-%d %H:%M} .. {analysis.end:%Y-%m-%d %H:%M} UTC"
        if held is None:
            click.echo(f"tailwatch: no spans in {window}; the store holds no spans at all", err=True)
        else:
            count, first, final = held
            click.echo(
                f"tailwatch: no requests, jobs or model calls in {window}; the store holds "
                f"{count:,} spans from {first:%Y-%m-%d %H:%M} to {final:%Y-%m-%d %H:%M} UTC",
                err=True,
            )
