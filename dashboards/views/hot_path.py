"""Hot path: p50/p95/p99 per operation over time, a marker at every release, sync LLM calls per request;
a streamed endpoint's title gives its time to first byte's p99 beside its duration's, and a dotted
line draws it over time.

Latency is in milliseconds; the synchronous LLM calls per request are on a second y axis.

The series cover the current window only, so each panel also shows the baseline: a grey band left of
the window start standing for the baseline window, and the operation's baseline p99 (from the
attribution frame) as a dashed reference line across the panel. A release at the window's start
then steps visibly from the baseline level, and each release draws its own p99 step, before → after.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from analytics import Analysis
from dashboards import style
from dashboards.style import esc, naive_utc
from dashboards.views._common import (
    DT_HOVER,
    MAX_PANELS,
    ROW_GAP,
    ROW_HEIGHT,
    VIEW_TITLES,
    add_vline,
    axis_refs,
    empty_figure,
    fmt_ms,
    left_out,
    naive_times,
    op_label,
    operations_by,
    rows_of,
    window_subtitle,
)

__all__ = ["BASELINE_LEAD", "hot_path_figure"]

# How much of the axis, as a share of the window, the baseline band takes left of the window start.
BASELINE_LEAD: Final = 0.2


def hot_path_figure(analysis: Analysis) -> go.Figure:
    """p50/p95/p99 over time per operation, a marker at every release, sync LLM calls on a 2nd axis."""
    ops_all = operations_by(analysis.hot_path, "requests") if analysis.hot_path.height else []
    if not ops_all:
        return empty_figure("hot_path", analysis, "no hot-path requests in this window")
    ops = ops_all[:MAX_PANELS]
    coupling = analysis.release_coupling
    titles = []
    for service, operation in ops:
        summary = rows_of(analysis.hot_path, service, operation).row(0, named=True)
        title = (
            f"{op_label(service, operation)} — {summary['requests']:,} requests, "
            f"p99 {fmt_ms(summary['p99_ms'])}, "
            f"{summary['sync_llm_calls_per_request']:.2f} sync LLM calls/req"
        )
        if summary.get("streamed_requests") and summary.get("ttfb_p99_ms") is not None:
            # A streamed answer's user reads from its first byte: the wait that matters beside p99.
            title += f", first byte p99 {fmt_ms(summary['ttfb_p99_ms'])} (streamed)"
        c = rows_of(coupling, service, operation)
        if c.height and c["coupled"][0]:
            title += (
                f"<br><b>p99 rises with releases</b>: ρ={c['spearman_rho'][0]:.2f}, "
                f"{c['p99_slope_ms_per_release'][0]:+,.0f} ms/release"
            )
        titles.append(title)
    lead_start = naive_utc(
        analysis.start
        - min(analysis.end - analysis.start, analysis.baseline_end - analysis.baseline_start) * BASELINE_LEAD
    )
    fig = make_subplots(
        rows=len(ops),
        cols=1,
        specs=[[{"secondary_y": True}] for _ in ops],
        subplot_titles=titles,
        vertical_spacing=ROW_GAP / (ROW_HEIGHT * len(ops)),
    )
    first_byte_shown = False
    for row, (service, operation) in enumerate(ops, start=1):
        series = rows_of(analysis.hot_path_series, service, operation).sort("bucket_start")
        x = naive_times(series, "bucket_start")
        who = [esc(service), esc(operation)]
        custom = [[*who, n] for n in series["requests"].to_list()]
        for pct in ("p50", "p95", "p99"):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=series[f"{pct}_ms"].to_list(),
                    mode="lines",
                    name=pct,
                    legendgroup=pct,
                    showlegend=row == 1,
                    line={"color": style.PERCENTILE_COLOURS[pct], "width": 2.5 if pct == "p99" else 1.5},
                    customdata=custom,
                    hovertemplate=(
                        "%{customdata[0]} · %{customdata[1]}<br>"
                        + DT_HOVER
                        + f"<br>{pct} %{{y:,.0f}} ms<br>%{{customdata[2]:,}} requests<extra></extra>"
                    ),
                ),
                row=row,
                col=1,
                secondary_y=False,
            )
        summary = rows_of(analysis.hot_path, service, operation).row(0, named=True)
        if summary.get("streamed_requests") and "ttfb_p99_ms" in series.columns:
            # A streamed endpoint: what its users wait for before the first words, beside the p99
            # of the last byte.
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=series["ttfb_p99_ms"].to_list(),
                    mode="lines",
                    name="first byte p99",
                    legendgroup="first_byte",
                    showlegend=not first_byte_shown,
                    line={"color": style.PERCENTILE_COLOURS["p99"], "width": 1.5, "dash": "dot"},
                    customdata=custom,
                    hovertemplate=(
                        "%{customdata[0]} · %{customdata[1]}<br>"
                        + DT_HOVER
                        + "<br>first byte p99 %{y:,.0f} ms<extra></extra>"
                    ),
                ),
                row=row,
                col=1,
                secondary_y=False,
            )
            first_byte_shown = True
        fig.add_trace(
            go.Scatter(
                x=x,
                y=series["sync_llm_calls_per_request"].to_list(),
                mode="lines",
                name="sync LLM calls / request",
                legendgroup="llm_calls",
                showlegend=row == 1,
                line={"color": style.LLM, "width": 1.5, "dash": "dash", "shape": "hv"},
                customdata=custom,
                hovertemplate=(
                    "%{customdata[0]} · %{customdata[1]}<br>"
                    + DT_HOVER
                    + "<br>%{y:.2f} synchronous LLM calls per request<extra></extra>"
                ),
            ),
            row=row,
            col=1,
            secondary_y=True,
        )
        # A version first seen before the window (still running in it) is not a release *in* it, nor
        # is a service's first version (nothing before it to step from) or an unnamed one.
        releases = (
            rows_of(analysis.releases, service, operation)
            .filter(
                (pl.col("released_at") >= analysis.start)
                & (pl.col("released_at") <= analysis.end)
                & (pl.col("requests_before") > 0)
                & (pl.col("version") != "")
            )
            .sort("released_at")
        )
        baseline = _baseline_p99(analysis, service, operation)
        if baseline is not None:
            _baseline(fig, row, analysis, lead_start, baseline, who)
        if releases.height:
            _release_markers(fig, row, releases)
        fig.update_yaxes(title_text="latency (ms)", rangemode="tozero", row=row, col=1, secondary_y=False)
        fig.update_yaxes(
            title_text="sync LLM calls / req",
            rangemode="tozero",
            showgrid=False,
            tickmode="auto",
            color=style.LLM,
            row=row,
            col=1,
            secondary_y=True,
        )
    fig.update_xaxes(type="date", range=[lead_start, naive_utc(analysis.end)])
    fig.update_xaxes(title_text="time (UTC)", row=len(ops), col=1)
    extra = left_out(len(ops), len(ops_all), "operations")
    height = 140 + ROW_HEIGHT * len(ops)
    fig.update_layout(**style.base_layout(VIEW_TITLES["hot_path"], window_subtitle(analysis, extra), height))
    return fig


def _baseline_p99(analysis: Analysis, service: str, operation: str) -> float | None:
    """The operation's p99 over the baseline window: the attribution's, else the p99 before the first
    release of the window (the release frame's "before" side starts in the baseline)."""
    a = rows_of(analysis.attribution, service, operation)
    if a.height and a["baseline_p99_ms"][0] is not None:
        return float(a["baseline_p99_ms"][0])
    first = (
        rows_of(analysis.releases, service, operation)
        .filter(pl.col("released_at") >= analysis.start)
        .sort("released_at")
    )
    if first.height and first["p99_before_ms"][0] is not None:
        return float(first["p99_before_ms"][0])
    return None


def _baseline(
    fig: go.Figure, row: int, analysis: Analysis, lead_start: datetime, p99: float, who: list[str]
) -> None:
    """The baseline band left of the window start and the baseline p99 across the panel."""
    xref, yref = axis_refs(fig, row, 1)
    start, end = naive_utc(analysis.start), naive_utc(analysis.end)
    fig.add_shape(
        type="rect",
        xref=xref,
        yref=f"{yref} domain",
        x0=lead_start,
        x1=start,
        y0=0,
        y1=1,
        fillcolor=style.BASELINE_BAND,
        line={"width": 0},
        layer="below",
    )
    fig.add_annotation(
        x=lead_start,
        y=0.02,
        xref=xref,
        yref=f"{yref} domain",
        text=f"baseline p99 {fmt_ms(p99)}",
        showarrow=False,
        xanchor="left",
        yanchor="bottom",
        font={"size": 10, "color": style.BASELINE},
    )
    window = style.fmt_window(analysis.baseline_start, analysis.baseline_end)
    fig.add_trace(
        go.Scatter(
            x=[lead_start, start, end],
            y=[p99, p99, p99],
            mode="lines",
            name="baseline p99",
            legendgroup="baseline",
            showlegend=row == 1,
            line={"color": style.BASELINE, "width": 1.5, "dash": "dash"},
            customdata=[[*who, window]] * 3,
            hovertemplate=(
                "%{customdata[0]} · %{customdata[1]}<br>baseline p99 %{y:,.0f} ms"
                "<br>over the baseline window %{customdata[2]}<extra></extra>"
            ),
        ),
        row=row,
        col=1,
        secondary_y=False,
    )


def _release_markers(fig: go.Figure, row: int, releases: pl.DataFrame) -> None:
    """A dotted line and the version at every release; a triangle on the p99 with the numbers."""
    x = naive_times(releases, "released_at")
    for when, rel in zip(x, releases.iter_rows(named=True), strict=True):
        significant = bool(rel["significant"])
        label = esc(rel["version"])
        if significant and rel["p99_delta_ms"] is not None:
            label = f"<b>{label} {rel['p99_delta_ms']:+,.0f} ms</b>"
        add_vline(
            fig,
            row,
            1,
            when,
            label,
            style.RELEASE_SIGNIFICANT if significant else style.RELEASE,
            label_y=0.98,
        )
    custom = [
        [
            esc(r["version"]),
            fmt_ms(r["p99_before_ms"]),
            fmt_ms(r["p99_after_ms"]),
            "n/a" if r["p99_delta_ms"] is None else f"{r['p99_delta_ms']:+,.0f} ms",
            "significant" if r["significant"] else "not significant",
            r["requests_before"],
            r["requests_after"],
            _fmt_float(r["sync_llm_calls_per_request_before"]),
            _fmt_float(r["sync_llm_calls_per_request_after"]),
        ]
        for r in releases.iter_rows(named=True)
    ]
    # The p99 step each release made, before → after, drawn at the release: visible even when the
    # release sits at the window's edge.
    for significant, colour in ((True, style.RELEASE_SIGNIFICANT), (False, style.RELEASE)):
        step_x: list[datetime | None] = []
        step_y: list[float | None] = []
        for when, r in zip(x, releases.iter_rows(named=True), strict=True):
            if bool(r["significant"]) == significant and None not in (r["p99_before_ms"], r["p99_after_ms"]):
                step_x += [when, when, None]
                step_y += [r["p99_before_ms"], r["p99_after_ms"], None]
        if not step_x:
            continue
        fig.add_trace(
            go.Scatter(
                x=step_x,
                y=step_y,
                mode="lines+markers",
                name="p99 step at release (before → after)",
                legendgroup="release_step",
                showlegend=row == 1 and significant,
                line={"color": colour, "width": 3},
                marker={"symbol": "line-ew", "size": 14, "line": {"width": 3, "color": colour}},
                hoverinfo="skip",
            ),
            row=row,
            col=1,
            secondary_y=False,
        )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=releases["p99_after_ms"].to_list(),
            mode="markers",
            name="release",
            legendgroup="release",
            showlegend=row == 1,
            marker={
                "symbol": "triangle-up",
                "size": 11,
                "color": [
                    style.RELEASE_SIGNIFICANT if s else style.RELEASE
                    for s in releases["significant"].to_list()
                ],
                "line": {"color": "white", "width": 1},
            },
            customdata=custom,
            hovertemplate=(
                "release %{customdata[0]} at " + DT_HOVER + "<br>"
                "p99 %{customdata[1]} → %{customdata[2]} (%{customdata[3]}, %{customdata[4]})<br>"
                "requests %{customdata[5]:,} before / %{customdata[6]:,} after<br>"
                "sync LLM calls/req %{customdata[7]} → %{customdata[8]}<extra></extra>"
            ),
        ),
        row=row,
        col=1,
        secondary_y=False,
    )


def _fmt_float(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"
