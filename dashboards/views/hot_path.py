"""Hot path: p50/p95/p99 per operation over time, a marker at every release, sync LLM calls per request.

Latency is in milliseconds; the synchronous LLM calls per request are on a second y axis.
"""

from __future__ import annotations

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
    empty_figure,
    fmt_ms,
    left_out,
    naive_times,
    op_label,
    operations_by,
    rows_of,
    window_subtitle,
)

__all__ = ["hot_path_figure"]


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
        c = rows_of(coupling, service, operation)
        if c.height and c["coupled"][0]:
            title += (
                f"<br><b>p99 coupled to releases</b>: ρ={c['spearman_rho'][0]:.2f}, "
                f"{c['p99_slope_ms_per_release'][0]:+,.0f} ms/release"
            )
        titles.append(title)
    fig = make_subplots(
        rows=len(ops),
        cols=1,
        specs=[[{"secondary_y": True}] for _ in ops],
        subplot_titles=titles,
        vertical_spacing=ROW_GAP / (ROW_HEIGHT * len(ops)),
    )
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
        # A version first seen before the window (still running in it) is not a release *in* it.
        releases = (
            rows_of(analysis.releases, service, operation)
            .filter((pl.col("released_at") >= analysis.start) & (pl.col("released_at") <= analysis.end))
            .sort("released_at")
        )
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
    fig.update_xaxes(type="date", range=[naive_utc(analysis.start), naive_utc(analysis.end)])
    fig.update_xaxes(title_text="time (UTC)", row=len(ops), col=1)
    extra = left_out(len(ops), len(ops_all), "operations")
    height = 140 + ROW_HEIGHT * len(ops)
    fig.update_layout(**style.base_layout(VIEW_TITLES["hot_path"], window_subtitle(analysis, extra), height))
    return fig


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
