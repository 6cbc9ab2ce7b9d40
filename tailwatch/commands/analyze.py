"""``tailwatch analyze``: every tail metric over a window, as JSON or a readable table."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal, get_args

import click

from analytics import render_table
from storage import TailwatchError
from tailwatch.commands._common import ISO_TIME, require_traces, store_option
from tailwatch.remote import RemoteService, store_or_service

OutputFormat = Literal["json", "table"]


def _held_range(store: Any) -> tuple[int, datetime, datetime] | None:
    """How many spans the store holds and from when to when (None when it holds none)."""
    from collectors import TRACES_TABLE

    count, first, last = store.query_rows(
        f"SELECT count(), min(Timestamp), max(Timestamp) FROM {store.table(TRACES_TABLE)}"
    )[0]
    return (int(count), first, last) if count else None


@click.command("analyze")
@store_option
@click.option("--start", type=ISO_TIME, required=True, help="Window start (ISO 8601; UTC if no offset).")
@click.option("--end", type=ISO_TIME, required=True, help="Window end, exclusive.")
@click.option(
    "--baseline-start", type=ISO_TIME, default=None, help="Baseline start [default: end − 2×length]."
)
@click.option("--baseline-end", type=ISO_TIME, default=None, help="Baseline end [default: --start].")
@click.option(
    "--format",
    "output_format",
    type=click.Choice(list(get_args(OutputFormat))),
    default="json",
    show_default=True,
    help="json: one object; table: readable text.",
)
@click.option(
    "--no-summaries",
    is_flag=True,
    help="Read every span of the window, not the per-minute summaries (the same figures, slower).",
)
def analyze(
    store_dsn: str | None,
    start: datetime,
    end: datetime,
    baseline_start: datetime | None,
    baseline_end: datetime | None,
    output_format: OutputFormat,
    no_summaries: bool,
) -> None:
    """Hot-path p99 vs releases, cold-path enqueue-to-ready, abandonment, retry amplification and
    LLM-vs-internal attribution over [--start, --end) against a baseline window."""
    from analytics import analyze as run_analysis

    if (baseline_start is None) != (baseline_end is None):
        raise TailwatchError("give both --baseline-start and --baseline-end, or neither")
    target = store_or_service(store_dsn)
    if isinstance(target, RemoteService):
        text = target.analyze_json(start, end, baseline_start, baseline_end)
        click.echo(text if output_format == "json" else render_table(json.loads(text)))
        return
    with target as store:
        require_traces(store)
        analysis = run_analysis(
            store, start, end, baseline_start, baseline_end, use_summaries=not no_summaries
        )
        shown = (analysis.hot_path, analysis.cold_path, analysis.llm_calls, analysis.retry_amplification)
        empty = all(frame.is_empty() for frame in shown)
        held = _held_range(store) if empty else None
    if output_format == "json":
        click.echo(analysis.to_json())
    else:
        click.echo(render_table(analysis.to_dict()))
    if empty:
        # An empty report says why, on stderr (stdout stays the JSON or table asked for).
        window = f"{analysis.start:%Y-%m-%d %H:%M} .. {analysis.end:%Y-%m-%d %H:%M} UTC"
        if held is None:
            click.echo(f"tailwatch: no spans in {window}; the store holds no spans at all", err=True)
        else:
            count, first, last = held
            click.echo(
                f"tailwatch: no requests, jobs or model calls in {window}; the store holds "
                f"{count:,} spans from {first:%Y-%m-%d %H:%M} to {last:%Y-%m-%d %H:%M} UTC",
                err=True,
            )
