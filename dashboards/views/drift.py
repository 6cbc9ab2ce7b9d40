"""Architecture drift: per finding of the drift report (analytics.drift), the per-day series it rests
on, titled with the finding's sentence (the one its alert leads with).

Read each panel left to right over the drift window (days, UTC): the grey band on the left is "then"
(the first ``edge_days`` days), the one on the right "now" (the last ones), and the dashed red line
the day the trend began (``since``, with the release it arrived with when one did). The line on the
left axis is the measure that drifted — the hot-path share of a shared function, items per run,
tokens per unit of work, the backlog, items reprocessed, the p99 with no target — with its then and
now values drawn across their bands; the bars or dotted line on the right axis are the volume
behind it (calls, runs, units, jobs, requests).
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analytics import Analysis, DriftFinding
from dashboards import style
from dashboards.style import esc, naive_utc
from dashboards.views._common import (
    MAX_PANELS,
    ROW_GAP,
    ROW_HEIGHT,
    VIEW_TITLES,
    axis_refs,
    count_of,
    empty_figure,
    left_out,
    window_subtitle,
)
from slo_rules import drift_symptom

__all__ = ["DRIFT_SERIES", "NO_DRIFT_REPORT_TEXT", "DriftSeries", "drift_figure", "no_drift_text"]

NO_DRIFT_REPORT_TEXT: Final = (
    "no drift report with this analysis: `tailwatch dashboard export` reads one for a window it analyses"
)
# Characters per line of a panel title (the finding's sentence) at 1280 px.
TITLE_WIDTH: Final = 130
DRIFTED: Final = "#1d3557"  # the measure that drifted
VOLUME: Final = "#b0b0b0"  # the volume behind it
VOLUME_OTHER: Final = "#f4a261"
SINCE: Final = "#e4572e"
EDGE_BAND: Final = "rgba(108,117,125,0.12)"


@dataclass(frozen=True)
class DriftSeries:
    """What a kind of finding draws: the measure that drifted (left axis; its evidence's then/now
    keys) and the volumes behind it (right axis), each a key of ``DriftFinding.by_day``."""

    measure: str
    measure_title: str
    then_key: str | None
    now_key: str | None
    volumes: tuple[tuple[str, str], ...]  # (by_day key, legend name)
    volume_title: str
    percent: bool = False
    bars: bool = True


def _key(colour: str) -> str:
    """A coloured square naming a series in an axis title (the view has no legend)."""
    return f'<span style="color:{colour}">■</span>'


DRIFT_SERIES: Final[dict[str, DriftSeries]] = {
    "shared_operation": DriftSeries(
        "hot_share",
        "hot-path share of calls",
        "hot_share_then",
        "hot_share_now",
        (("hot_calls", "hot-path calls"), ("cold_calls", "batch-job calls")),
        f"calls a day {_key(VOLUME)} hot {_key(VOLUME_OTHER)} batch",
        percent=True,
    ),
    "batch_shrinking": DriftSeries(
        "items_per_run",
        "items per run",
        "items_per_run_then",
        "items_per_run_now",
        (("runs", "runs"),),
        "runs a day",
    ),
    "unit_cost_rising": DriftSeries(
        "tokens_per_unit",
        "tokens per unit",
        "tokens_per_unit_then",
        "tokens_per_unit_now",
        (("calls_per_unit", "model calls per unit"),),
        f"model calls per unit {_key(VOLUME_OTHER)}",
        bars=False,
    ),
    "queue_unbounded": DriftSeries(
        "backlog",
        "backlog (jobs)",
        None,
        "backlog_now",
        (("enqueued", "enqueued"), ("completed", "completed")),
        f"jobs a day {_key(VOLUME)} in {_key(VOLUME_OTHER)} done",
    ),
    "whole_batch_retry": DriftSeries(
        "items_reprocessed",
        "items reprocessed",
        None,
        None,
        (("retried_jobs", "retried jobs"),),
        "retried jobs a day",
    ),
    "no_latency_target": DriftSeries(
        "p99_ms",
        "p99 (ms), no target",
        None,
        "p99_ms_now",
        (("requests", "requests reaching shared code"),),
        "requests a day",
    ),
}


def no_drift_text(analysis: Analysis) -> str:
    """The view's words when there is nothing to draw."""
    report = analysis.drift
    if report is None:
        return NO_DRIFT_REPORT_TEXT
    end = naive_utc(report.end).strftime("%Y-%m-%d %H:%M")
    return f"no sign of drift in the {count_of(report.days, 'day')} before {end} UTC"


def _title(finding: DriftFinding) -> str:
    """The finding's sentence, escaped and wrapped (Plotly breaks lines at ``<br>`` only)."""
    lines = textwrap.wrap(drift_symptom(finding), TITLE_WIDTH)
    head = f"[{finding.severity}] {finding.kind}: "
    return "<br>".join(esc(line) if i else esc(head) + esc(line) for i, line in enumerate(lines))


def drift_figure(analysis: Analysis) -> go.Figure:
    """Per finding: the measure that drifted by day, with its then/now edges and ``since`` marked,
    and the volume behind it; an empty state in words when there is none."""
    report = analysis.drift
    if report is None or not report.findings:
        fig = empty_figure("drift", analysis, no_drift_text(analysis))
        if report is not None:
            fig.update_xaxes(range=[naive_utc(report.start), naive_utc(report.end)])
        return fig
    findings = list(report.findings)
    # Critical first (two or more kinds in one service), then the report's own order (by kind).
    shown = sorted(findings, key=lambda f: f.severity != "critical")[:MAX_PANELS]
    rows = len(shown)
    # Each title has up to three lines above its panel: the gap between rows makes room for them.
    gap = ROW_GAP + 30
    fig = make_subplots(
        rows=rows,
        cols=1,
        specs=[[{"secondary_y": True}] for _ in range(rows)],
        subplot_titles=[_title(f) for f in shown],
        vertical_spacing=gap / ((ROW_HEIGHT + 30) * rows),
    )
    # The titles are sentences: read from the left edge, not centred over the panel.
    for annotation in fig.layout.annotations:
        annotation.update(font={"size": 12}, align="left", x=0.0, xanchor="left")
    for row, finding in enumerate(shown, start=1):
        _panel(fig, row, finding, report.edge_days)
    extra = f"drift window {style.fmt_window(report.start, report.end)}, by day · " + count_of(
        len(findings), "finding"
    )
    more = left_out(rows, len(findings), "findings")
    fig.update_layout(
        **style.base_layout(
            VIEW_TITLES["drift"],
            window_subtitle(analysis, f"{extra}{' · ' + more if more else ''}"),
            160 + (ROW_HEIGHT + 30) * rows,
        ),
        barmode="group",
        showlegend=False,
    )
    return fig


def _panel(fig: go.Figure, row: int, finding: DriftFinding, edge_days: int) -> None:
    """One finding's row: its axis titles name the series (no legend: each row has its own)."""
    spec = DRIFT_SERIES[finding.kind]
    days = [naive_utc(r["day"]) for r in finding.by_day]
    measure = [r.get(spec.measure) for r in finding.by_day]
    hover_fmt = "%{y:.1%}" if spec.percent else "%{y:,.4~g}"
    for index, (key, name) in enumerate(spec.volumes):
        values = [r.get(key) for r in finding.by_day]
        colour = VOLUME if index == 0 else VOLUME_OTHER
        trace: go.Bar | go.Scatter
        if spec.bars:
            trace = go.Bar(
                x=days,
                y=values,
                name=name,
                marker_color=colour,
                opacity=0.6,
                hovertemplate=f"%{{x|%Y-%m-%d}}: %{{y:,.4~g}} {name}<extra></extra>",
            )
        else:
            trace = go.Scatter(
                x=days,
                y=values,
                name=name,
                mode="lines+markers",
                line={"color": VOLUME_OTHER, "dash": "dot"},
                hovertemplate=f"%{{x|%Y-%m-%d}}: %{{y:,.4~g}} {name}<extra></extra>",
            )
        fig.add_trace(trace, row=row, col=1, secondary_y=True)
    fig.add_trace(
        go.Scatter(
            x=days,
            y=measure,
            name=spec.measure_title,
            mode="lines+markers",
            line={"color": DRIFTED, "width": 2.5},
            connectgaps=False,
            hovertemplate=f"%{{x|%Y-%m-%d}}: {hover_fmt} {spec.measure_title}<extra></extra>",
        ),
        row=row,
        col=1,
        secondary_y=False,
    )
    _edges(fig, row, finding, spec, edge_days)
    fig.update_yaxes(
        title_text=spec.measure_title,
        tickformat=".0%" if spec.percent else None,
        rangemode="tozero",
        row=row,
        col=1,
        secondary_y=False,
    )
    fig.update_yaxes(
        title_text=spec.volume_title, rangemode="tozero", showgrid=False, row=row, col=1, secondary_y=True
    )
    # One tick per day of the window, on its mark (a report ends on the hour, not at midnight).
    label = "%m-%d" if all(d.hour == 0 for d in days) else "%m-%d %H:%M"
    fig.update_xaxes(type="date", tickvals=days, ticktext=[d.strftime(label) for d in days], row=row, col=1)


def _edges(fig: go.Figure, row: int, finding: DriftFinding, spec: DriftSeries, edge_days: int) -> None:
    """The then and now bands, each with the evidence's value across it, and the ``since`` line."""
    if not finding.by_day:
        return
    xref, yref = axis_refs(fig, row, 1)
    # Each day's mark sits on its date: a day spans from half a day before it to half a day after.
    half = timedelta(hours=12)
    first = naive_utc(finding.by_day[0]["day"]) - half
    last = naive_utc(finding.by_day[-1]["day"]) + half
    bands = (
        ("then", first, first + timedelta(days=edge_days), spec.then_key),
        ("now", last - timedelta(days=edge_days), last, spec.now_key),
    )
    for label, x0, x1, key in bands:
        fig.add_shape(
            type="rect",
            xref=xref,
            yref=f"{yref} domain",
            x0=x0,
            x1=x1,
            y0=0,
            y1=1,
            fillcolor=EDGE_BAND,
            line={"width": 0},
            layer="below",
        )
        value = finding.evidence.get(key) if key else None
        text = label if value is None else f"{label}: {_value(value, spec.percent)}"
        fig.add_annotation(
            x=x0,
            y=1.0,
            xref=xref,
            yref=f"{yref} domain",
            text=text,
            showarrow=False,
            xanchor="left",
            yanchor="top",
            font={"size": 10, "color": style.BASELINE},
        )
        if value is not None:
            fig.add_shape(
                type="line",
                xref=xref,
                yref=yref,
                x0=x0,
                x1=x1,
                y0=value,
                y1=value,
                line={"color": DRIFTED, "width": 1.5, "dash": "dash"},
            )
    since = naive_utc(finding.since) - half
    fig.add_shape(
        type="line",
        xref=xref,
        yref=f"{yref} domain",
        x0=since,
        x1=since,
        y0=0,
        y1=1,
        line={"color": SINCE, "width": 1.5, "dash": "dash"},
    )
    fig.add_annotation(
        x=since,
        y=0.85,
        xref=xref,
        yref=f"{yref} domain",
        text=f"since {naive_utc(finding.since):%Y-%m-%d}"
        + (f" · {esc(finding.since_release)}" if finding.since_release else ""),
        showarrow=False,
        xanchor="left",
        yanchor="top",
        font={"size": 10, "color": SINCE},
        bgcolor="rgba(255,255,255,0.7)",
    )


def _value(value: Any, percent: bool) -> str:
    return f"{value:.1%}" if percent else f"{value:,.4g}"
