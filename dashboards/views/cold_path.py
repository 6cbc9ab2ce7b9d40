"""Cold path: enqueue-to-ready per queue over time, its distribution, queue wait vs processing, backlog.

Latency is in seconds; the time series and the distribution are on log scales. Each panel shows the
baseline window beside the current one: the queue's baseline p99 across the time series (dotted),
its baseline distribution (dotted) and its baseline wait and processing p99 (pale bars), so a
queue that got slower stands out from one that was always slow.
"""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from analytics import Analysis
from dashboards import style
from dashboards.style import esc, esc_all
from dashboards.views._common import (
    DT_HOVER,
    MAX_PANELS,
    VIEW_TITLES,
    axis_refs,
    empty_figure,
    left_out,
    naive_times,
    window_subtitle,
)

__all__ = ["cold_path_figure"]


def cold_path_figure(analysis: Analysis) -> go.Figure:
    """Enqueue-to-ready p50/p99 over time, the CDF, queue wait vs processing and the pending backlog."""
    summary = analysis.cold_path.sort(["jobs", "queue"], descending=[True, False])
    if not summary.height:
        return empty_figure("cold_path", analysis, "no cold-path jobs in this window")
    queues = summary["queue"].to_list()[:MAX_PANELS]
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=[
            "Enqueue-to-ready over time: p99 solid, p50 dashed, baseline p99 dotted (s, log)",
            "Enqueue-to-ready distribution (CDF, log x): baseline dotted",
            "Queue wait vs processing, p99 (s): baseline pale",
            "Pending backlog (jobs not ready)",
        ],
        vertical_spacing=0.16,
        horizontal_spacing=0.1,
    )
    series_all = analysis.cold_path_series
    cdf_all = analysis.cold_path_cdf
    for i, queue in enumerate(queues):
        colour = style.palette(i)
        name = esc(queue)
        series = series_all.filter(pl.col("queue") == queue).sort("bucket_start")
        x = naive_times(series, "bucket_start")
        custom = [[name, n] for n in series["jobs"].to_list()]
        for pct, dash in (("p99", "solid"), ("p50", "dash")):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=series[f"{pct}_s"].to_list(),
                    mode="lines",
                    name=name,
                    legendgroup=f"q{i}",
                    showlegend=pct == "p99",
                    line={"color": colour, "dash": dash},
                    customdata=custom,
                    hovertemplate=(
                        "%{customdata[0]}<br>"
                        + DT_HOVER
                        + f"<br>enqueue-to-ready {pct} %{{y:,.2f}} s<br>%{{customdata[1]:,}} jobs"
                        "<extra></extra>"
                    ),
                ),
                row=1,
                col=1,
            )
        row = summary.filter(pl.col("queue") == queue).row(0, named=True)
        if row["baseline_p99_s"] is not None and series.height:
            # The baseline p99 across the panel: the level the current p99 is read against.
            fig.add_trace(
                go.Scatter(
                    x=[x[0], x[-1]],
                    y=[row["baseline_p99_s"]] * 2,
                    mode="lines",
                    name=name,
                    legendgroup=f"q{i}",
                    showlegend=False,
                    line={"color": colour, "dash": "dot", "width": 1.5},
                    customdata=[[name, row["baseline_jobs"]]] * 2,
                    hovertemplate=(
                        "%{customdata[0]}<br>baseline p99 %{y:,.2f} s (%{customdata[1]:,} jobs)"
                        "<extra></extra>"
                    ),
                ),
                row=1,
                col=1,
            )
        for window, dash, opacity in (("current", "solid", 1.0), ("baseline", "dot", 0.7)):
            cdf = cdf_all.filter((pl.col("queue") == queue) & (pl.col("window") == window)).sort(
                "enqueue_to_ready_s"
            )
            if not cdf.height:
                continue
            fig.add_trace(
                go.Scatter(
                    x=cdf["enqueue_to_ready_s"].to_list(),
                    y=cdf["cdf"].to_list(),
                    mode="lines",
                    name=name,
                    legendgroup=f"q{i}",
                    showlegend=False,
                    opacity=opacity,
                    line={"color": colour, "shape": "hv", "dash": dash},
                    customdata=[[name, window]] * cdf.height,
                    hovertemplate=(
                        "%{customdata[0]} (%{customdata[1]})<br>%{y:.1%} of jobs ready within %{x:,.2f} s"
                        "<extra></extra>"
                    ),
                ),
                row=1,
                col=2,
            )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=series["pending"].to_list(),
                mode="lines",
                name=name,
                legendgroup=f"q{i}",
                showlegend=False,
                line={"color": colour, "shape": "hv"},
                customdata=custom,
                hovertemplate="%{customdata[0]}<br>" + DT_HOVER + "<br>%{y:,} jobs pending<extra></extra>",
            ),
            row=2,
            col=2,
        )
    shown = summary.head(MAX_PANELS)
    labels = esc_all(shown["queue"].to_list())
    verdicts = [
        f"STARVED · p99/p50 {r['p99_over_p50']:,.0f}×"
        if r["starved"]
        else f"p99/p50 {r['p99_over_p50']:,.1f}×"
        if r["p99_over_p50"] is not None
        # A queue whose jobs in the window are all still pending has no ready time to compare.
        else "p99/p50 n/a"
        for r in shown.iter_rows(named=True)
    ]
    custom = [
        [lbl, v, r["jobs"], r["completed"], r["pending"], r["p50_s"], r["p99_s"]]
        for lbl, v, r in zip(labels, verdicts, shown.iter_rows(named=True), strict=True)
    ]
    hover_tail = (
        "<br>%{customdata[1]}<br>%{customdata[2]:,} jobs, %{customdata[3]:,} completed, "
        "%{customdata[4]:,} pending<br>enqueue-to-ready p50 %{customdata[5]:,.2f} s, "
        "p99 %{customdata[6]:,.2f} s<extra></extra>"
    )
    has_baseline = shown["baseline_jobs"].is_not_null().any()
    for column, label, colour in (
        ("queue_wait_p99_s", "queue wait p99", style.QUEUE_WAIT),
        ("processing_p99_s", "processing p99", style.QUEUE_PROCESSING),
    ):
        if has_baseline:
            # Each bar's baseline beside it, pale: what the queue's wait and processing were.
            fig.add_trace(
                go.Bar(
                    x=labels,
                    y=shown[f"baseline_{column}"].to_list(),
                    name=f"{label}, baseline",
                    legendgroup=column,
                    marker={"color": colour},
                    opacity=0.35,
                    customdata=[
                        [lbl, n] for lbl, n in zip(labels, shown["baseline_jobs"].to_list(), strict=True)
                    ],
                    hovertemplate=(
                        "%{customdata[0]}<br>baseline " + label + " %{y:,.2f} s (%{customdata[1]:,} jobs)"
                        "<extra></extra>"
                    ),
                ),
                row=2,
                col=1,
            )
        fig.add_trace(
            go.Bar(
                x=labels,
                y=shown[column].to_list(),
                name=label,
                legendgroup=column,
                marker={"color": colour},
                customdata=custom,
                hovertemplate="%{customdata[0]}<br>" + label + " %{y:,.2f} s" + hover_tail,
            ),
            row=2,
            col=1,
        )
    for label, verdict, r in zip(labels, verdicts, shown.iter_rows(named=True), strict=True):
        top = max(
            r["queue_wait_p99_s"] or 0.0,
            r["processing_p99_s"] or 0.0,
            r["baseline_queue_wait_p99_s"] or 0.0,
            r["baseline_processing_p99_s"] or 0.0,
        )
        xref, yref = axis_refs(fig, 2, 1)
        fig.add_annotation(
            x=label,
            y=top,
            xref=xref,
            yref=yref,
            text=f"<b>{verdict}</b>" if r["starved"] else verdict,
            showarrow=False,
            yanchor="bottom",
            font={"size": 10, "color": style.ALERT_FIRING if r["starved"] else "#555"},
        )
    fig.update_layout(barmode="group")
    # One tick per power of ten (1, 10, 100 …): plotly's default log ticks read "…9 10 2 3 4…".
    log_ticks = {
        "dtick": 1,
        "tickformat": "~g",
        "minor": {"ticks": "inside", "ticklen": 3, "showgrid": False},
    }
    fig.update_yaxes(type="log", title_text="seconds", row=1, col=1, **log_ticks)
    fig.update_xaxes(type="date", title_text="time (UTC)", row=1, col=1)
    fig.update_xaxes(type="log", title_text="enqueue-to-ready (s)", row=1, col=2, **log_ticks)
    fig.update_yaxes(title_text="share of jobs", tickformat=".0%", range=[0, 1.02], row=1, col=2)
    fig.update_yaxes(title_text="seconds", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(type="category", row=2, col=1)
    fig.update_xaxes(type="date", title_text="time (UTC)", row=2, col=2)
    fig.update_yaxes(title_text="jobs pending", rangemode="tozero", row=2, col=2)
    extra = left_out(len(queues), summary.height, "queues")
    fig.update_layout(**style.base_layout(VIEW_TITLES["cold_path"], window_subtitle(analysis, extra), 820))
    return fig
