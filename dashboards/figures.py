"""One Plotly figure per dashboard view, built from the analysis frames (pure: frames in, figures out).

Reading guide, shared by every view: time axes are UTC; latency is in milliseconds on the hot path and
seconds on the cold path; LLM time is always :data:`~dashboards.style.LLM` and internal time
:data:`~dashboards.style.INTERNAL`. Hover text carries the exact numbers behind each mark.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final, Literal

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from dashboards import style
from dashboards._analysis import AnalysisFrames
from dashboards.style import esc, esc_all, naive_utc

__all__ = [
    "VIEWS",
    "VIEW_TITLES",
    "View",
    "abandonment_figure",
    "alerts_figure",
    "attribution_figure",
    "build_figures",
    "cold_path_figure",
    "hot_path_figure",
    "retries_figure",
]

View = Literal["hot_path", "cold_path", "abandonment", "retries", "attribution", "alerts"]
VIEWS: Final[tuple[View, ...]] = ("hot_path", "cold_path", "abandonment", "retries", "attribution", "alerts")
VIEW_TITLES: Final[dict[View, str]] = {
    "hot_path": "Hot path: p99 vs release cadence",
    "cold_path": "Cold path: enqueue-to-ready",
    "abandonment": "Abandonment by 500 ms latency bucket",
    "retries": "Retry amplification per hop",
    "attribution": "Regression attribution: LLM vs internal",
    "alerts": "Alerts: firing and resolved",
}

# Panels per view: beyond this many operations/queues/workflows a page stops being readable at a
# glance; the busiest ones are shown and the subtitle says how many were left out.
MAX_PANELS: Final = 8
NO_ALERTS_TEXT: Final = "no alerts in this window"

_ROW_HEIGHT = 320  # pixels per operation panel, gap included
_ROW_GAP = 95
_DT_HOVER = "%{x|%Y-%m-%d %H:%M} UTC"


def build_figures(analysis: AnalysisFrames, alerts: pl.DataFrame | None = None) -> dict[str, go.Figure]:
    """Every view of :data:`VIEWS`, keyed by view name.

    ``alerts`` is ``slo_rules.alert_history(store, start, end)`` (fingerprint, alertname, status,
    at, cause, service, operation, summary); ``None`` or empty draws the "no alerts" timeline.
    """
    return {
        "hot_path": hot_path_figure(analysis),
        "cold_path": cold_path_figure(analysis),
        "abandonment": abandonment_figure(analysis),
        "retries": retries_figure(analysis),
        "attribution": attribution_figure(analysis, alerts),
        "alerts": alerts_figure(analysis, alerts),
    }


# --- helpers ---------------------------------------------------------------------------------


def _subtitle(analysis: AnalysisFrames, extra: str = "") -> str:
    text = style.fmt_window(analysis.start, analysis.end)
    return f"{text} · {extra}" if extra else text


def _empty(view: View, analysis: AnalysisFrames, message: str) -> go.Figure:
    """A figure that says plainly there is nothing to draw, rather than an empty grid."""
    fig = go.Figure()
    fig.update_layout(**style.base_layout(VIEW_TITLES[view], _subtitle(analysis), 360))
    fig.add_annotation(
        text=message,
        xref="paper",
        yref="paper",
        x=0.5,
        y=0.5,
        showarrow=False,
        font={"size": 18, "color": "#555"},
    )
    fig.update_xaxes(
        range=[naive_utc(analysis.start), naive_utc(analysis.end)], type="date", title_text="time (UTC)"
    )
    fig.update_yaxes(visible=False)
    return fig


def _refs(fig: go.Figure, row: int, col: int, secondary_y: bool = False) -> tuple[str, str]:
    """Axis references (``x3``, ``y5``) of a subplot, for shapes and annotations."""
    subplot = fig.get_subplot(row, col, secondary_y=secondary_y)
    return (
        subplot.xaxis.plotly_name.replace("axis", ""),
        subplot.yaxis.plotly_name.replace("axis", ""),
    )


def _vline(
    fig: go.Figure,
    row: int,
    col: int,
    x: Any,
    label: str,
    colour: str,
    *,
    dash: str = "dot",
    label_y: float = 1.0,
) -> None:
    """A vertical marker over the full height of one subplot, with its (already escaped) label."""
    xref, yref = _refs(fig, row, col)
    fig.add_shape(
        type="line",
        xref=xref,
        yref=f"{yref} domain",
        x0=x,
        x1=x,
        y0=0,
        y1=1,
        line={"color": colour, "width": 1.5, "dash": dash},
    )
    fig.add_annotation(
        x=x,
        y=label_y,
        xref=xref,
        yref=f"{yref} domain",
        text=label,
        showarrow=False,
        xanchor="left",
        yanchor="top",
        font={"size": 10, "color": colour},
        bgcolor="rgba(255,255,255,0.7)",
    )


def _times(frame: pl.DataFrame, column: str) -> list[datetime]:
    return [naive_utc(v) for v in frame[column].to_list()]


def _ops(frame: pl.DataFrame, order_by: str) -> list[tuple[str, str]]:
    ordered = frame.sort([order_by, "service", "operation"], descending=[True, False, False])
    return list(ordered.select("service", "operation").unique(maintain_order=True).iter_rows())


def _of(frame: pl.DataFrame, service: str, operation: str) -> pl.DataFrame:
    return frame.filter((pl.col("service") == service) & (pl.col("operation") == operation))


def _label(service: str, operation: str) -> str:
    return f"{esc(service)} · {esc(operation)}"


def _left_out(shown: int, total: int, what: str) -> str:
    return f"busiest {shown} of {total} {what}" if total > shown else ""


def _fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f} ms"


# --- hot path --------------------------------------------------------------------------------


def hot_path_figure(analysis: AnalysisFrames) -> go.Figure:
    """p50/p95/p99 over time per operation, a marker at every release, sync LLM calls on a 2nd axis."""
    ops_all = _ops(analysis.hot_path, "requests") if analysis.hot_path.height else []
    if not ops_all:
        return _empty("hot_path", analysis, "no hot-path requests in this window")
    ops = ops_all[:MAX_PANELS]
    coupling = analysis.release_coupling
    titles = []
    for service, operation in ops:
        summary = _of(analysis.hot_path, service, operation).row(0, named=True)
        title = (
            f"{_label(service, operation)} — {summary['requests']:,} requests, "
            f"p99 {_fmt_ms(summary['p99_ms'])}, "
            f"{summary['sync_llm_calls_per_request']:.2f} sync LLM calls/req"
        )
        c = _of(coupling, service, operation)
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
        vertical_spacing=_ROW_GAP / (_ROW_HEIGHT * len(ops)),
    )
    for row, (service, operation) in enumerate(ops, start=1):
        series = _of(analysis.hot_path_series, service, operation).sort("bucket_start")
        x = _times(series, "bucket_start")
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
                        + _DT_HOVER
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
                    + _DT_HOVER
                    + "<br>%{y:.2f} synchronous LLM calls per request<extra></extra>"
                ),
            ),
            row=row,
            col=1,
            secondary_y=True,
        )
        # A version first seen before the window (still running in it) is not a release *in* it.
        releases = (
            _of(analysis.releases, service, operation)
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
    extra = _left_out(len(ops), len(ops_all), "operations")
    fig.update_layout(
        **style.base_layout(VIEW_TITLES["hot_path"], _subtitle(analysis, extra), 140 + _ROW_HEIGHT * len(ops))
    )
    return fig


def _release_markers(fig: go.Figure, row: int, releases: pl.DataFrame) -> None:
    """A dotted line and the version at every release; a triangle on the p99 with the numbers."""
    x = _times(releases, "released_at")
    for when, rel in zip(x, releases.iter_rows(named=True), strict=True):
        significant = bool(rel["significant"])
        label = esc(rel["version"])
        if significant and rel["p99_delta_ms"] is not None:
            label = f"<b>{label} {rel['p99_delta_ms']:+,.0f} ms</b>"
        _vline(
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
            _fmt_ms(r["p99_before_ms"]),
            _fmt_ms(r["p99_after_ms"]),
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
                "release %{customdata[0]} at " + _DT_HOVER + "<br>"
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


# --- cold path -------------------------------------------------------------------------------


def cold_path_figure(analysis: AnalysisFrames) -> go.Figure:
    """Enqueue-to-ready p50/p99 over time, the CDF, queue wait vs processing and the pending backlog."""
    summary = analysis.cold_path.sort(["jobs", "queue"], descending=[True, False])
    if not summary.height:
        return _empty("cold_path", analysis, "no cold-path jobs in this window")
    queues = summary["queue"].to_list()[:MAX_PANELS]
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=[
            "Enqueue-to-ready over time: p99 solid, p50 dashed (s, log)",
            "Enqueue-to-ready distribution (CDF, log x)",
            "Queue wait vs processing, p99 (s)",
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
        x = _times(series, "bucket_start")
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
                        + _DT_HOVER
                        + f"<br>enqueue-to-ready {pct} %{{y:,.2f}} s<br>%{{customdata[1]:,}} jobs"
                        "<extra></extra>"
                    ),
                ),
                row=1,
                col=1,
            )
        cdf = cdf_all.filter(pl.col("queue") == queue).sort("enqueue_to_ready_s")
        fig.add_trace(
            go.Scatter(
                x=cdf["enqueue_to_ready_s"].to_list(),
                y=cdf["cdf"].to_list(),
                mode="lines",
                name=name,
                legendgroup=f"q{i}",
                showlegend=False,
                line={"color": colour, "shape": "hv"},
                customdata=[[name]] * cdf.height,
                hovertemplate=(
                    "%{customdata[0]}<br>%{y:.1%} of jobs ready within %{x:,.2f} s<extra></extra>"
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
                hovertemplate="%{customdata[0]}<br>" + _DT_HOVER + "<br>%{y:,} jobs pending<extra></extra>",
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
    for column, label, colour in (
        ("queue_wait_p99_s", "queue wait p99", style.QUEUE_WAIT),
        ("processing_p99_s", "processing p99", style.QUEUE_PROCESSING),
    ):
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
        top = max(r["queue_wait_p99_s"] or 0.0, r["processing_p99_s"] or 0.0)
        xref, yref = _refs(fig, 2, 1)
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
    fig.update_yaxes(type="log", title_text="seconds", row=1, col=1)
    fig.update_xaxes(type="date", title_text="time (UTC)", row=1, col=1)
    fig.update_xaxes(type="log", title_text="enqueue-to-ready (s)", row=1, col=2)
    fig.update_yaxes(title_text="share of jobs", tickformat=".0%", range=[0, 1.02], row=1, col=2)
    fig.update_yaxes(title_text="seconds", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(type="category", row=2, col=1)
    fig.update_xaxes(type="date", title_text="time (UTC)", row=2, col=2)
    fig.update_yaxes(title_text="jobs pending", rangemode="tozero", row=2, col=2)
    extra = _left_out(len(queues), summary.height, "queues")
    fig.update_layout(**style.base_layout(VIEW_TITLES["cold_path"], _subtitle(analysis, extra), 820))
    return fig


# --- abandonment -----------------------------------------------------------------------------


def abandonment_figure(analysis: AnalysisFrames) -> go.Figure:
    """Rate per bucket with its Wilson interval, requests per bucket, the cliff and the p99 marked."""
    summary = analysis.abandonment_summary
    ops_all = _ops(summary, "requests") if summary.height else []
    if not ops_all:
        return _empty("abandonment", analysis, "no hot-path requests in this window")
    ops = ops_all[:MAX_PANELS]
    titles = []
    for service, operation in ops:
        s = _of(summary, service, operation).row(0, named=True)
        cliff = "no cliff" if s["cliff_ms"] is None else f"cliff at {s['cliff_ms']:,} ms"
        titles.append(
            f"{_label(service, operation)} — {s['abandoned']:,} of {s['requests']:,} requests abandoned "
            f"({(s['rate'] or 0.0):.1%}), {cliff}"
        )
    fig = make_subplots(
        rows=len(ops),
        cols=1,
        specs=[[{"secondary_y": True}] for _ in ops],
        subplot_titles=titles,
        vertical_spacing=_ROW_GAP / (_ROW_HEIGHT * len(ops)),
    )
    for row, (service, operation) in enumerate(ops, start=1):
        s = _of(summary, service, operation).row(0, named=True)
        buckets = _of(analysis.abandonment, service, operation).sort("lo_ms")
        lo = buckets["lo_ms"].to_list()
        hi = buckets["hi_ms"].to_list()
        rate = buckets["rate"].to_list()
        low = buckets["rate_low"].to_list()
        high = buckets["rate_high"].to_list()
        mids = [(a + b) / 2 for a, b in zip(lo, hi, strict=True)]
        custom = [
            [esc(service), esc(operation), a, b, n, k, lw, hg]
            for a, b, n, k, lw, hg in zip(
                lo, hi, buckets["requests"].to_list(), buckets["abandoned"].to_list(), low, high, strict=True
            )
        ]
        fig.add_trace(
            go.Bar(
                x=mids,
                y=rate,
                width=[b - a for a, b in zip(lo, hi, strict=True)],
                name="abandonment rate (95% Wilson interval)",
                legendgroup="rate",
                showlegend=row == 1,
                marker={"color": style.CLIFF, "opacity": 0.75},
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [h - r for h, r in zip(high, rate, strict=True)],
                    "arrayminus": [r - lw for r, lw in zip(rate, low, strict=True)],
                    "color": "#333",
                    "thickness": 1,
                },
                customdata=custom,
                hovertemplate=(
                    "%{customdata[0]} · %{customdata[1]}<br>latency %{customdata[2]:,}–%{customdata[3]:,} ms"
                    "<br>%{customdata[5]:,} of %{customdata[4]:,} abandoned: %{y:.1%}"
                    "<br>95% interval %{customdata[6]:.1%} – %{customdata[7]:.1%}<extra></extra>"
                ),
            ),
            row=row,
            col=1,
            secondary_y=False,
        )
        fig.add_trace(
            go.Scatter(
                x=mids,
                y=buckets["requests"].to_list(),
                mode="lines+markers",
                name="requests per bucket",
                legendgroup="requests",
                showlegend=row == 1,
                line={"color": style.REQUESTS, "width": 1},
                marker={"size": 4},
                customdata=custom,
                hovertemplate=(
                    "%{customdata[0]} · %{customdata[1]}<br>latency %{customdata[2]:,}–%{customdata[3]:,} ms"
                    "<br>%{y:,} requests<extra></extra>"
                ),
            ),
            row=row,
            col=1,
            secondary_y=True,
        )
        if s["cliff_ms"] is not None:
            _vline(
                fig, row, 1, s["cliff_ms"], f"<b>cliff ≥ {s['cliff_ms']:,} ms</b>", style.CLIFF, dash="dash"
            )
        if s["p99_ms"] is not None:
            _vline(
                fig,
                row,
                1,
                s["p99_ms"],
                f"p99 {s['p99_ms']:,.0f} ms",
                style.PERCENTILE_COLOURS["p99"],
                label_y=0.88,
            )
        fig.update_yaxes(
            title_text="abandoned", tickformat=".1~%", rangemode="tozero", row=row, col=1, secondary_y=False
        )
        fig.update_yaxes(
            title_text="requests",
            rangemode="tozero",
            showgrid=False,
            tickmode="auto",
            color="#888",
            row=row,
            col=1,
            secondary_y=True,
        )
        fig.update_xaxes(ticksuffix=" ms", row=row, col=1)
    fig.update_xaxes(title_text="response time (500 ms buckets)", row=len(ops), col=1)
    extra = _left_out(len(ops), len(ops_all), "operations")
    fig.update_layout(
        **style.base_layout(
            VIEW_TITLES["abandonment"], _subtitle(analysis, extra), 140 + _ROW_HEIGHT * len(ops)
        ),
        bargap=0.02,
    )
    return fig


# --- retries ---------------------------------------------------------------------------------


def retries_figure(analysis: AnalysisFrames) -> go.Figure:
    """Per-hop retry rate, cumulative amplification, observed vs ``prod(1 + r)``, token amplification."""
    amp = analysis.retry_amplification.sort(["runs", "workflow"], descending=[True, False])
    if not amp.height:
        return _empty("retries", analysis, "no agent workflows in this window")
    shown = amp.head(MAX_PANELS)
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=[
            "Retry rate per hop",
            "Cumulative amplification across hops: model ∏(1+r) dashed, observed ◆",
            "Attempts: observed vs the compounding model",
            "Token amplification (tokens over all attempts / final attempts)",
        ],
        vertical_spacing=0.26,  # long hop names are drawn slanted under the first row
        horizontal_spacing=0.1,
    )
    for i, w in enumerate(shown.iter_rows(named=True)):
        colour = style.palette(i)
        name = esc(w["workflow"])
        hops = analysis.retry_hops.filter(pl.col("workflow") == w["workflow"]).sort("hop_index")
        hop_labels = [f"{idx}. {esc(h)}" for idx, h in zip(hops["hop_index"], hops["hop"], strict=True)]
        rates = hops["retry_rate"].to_list()
        custom = [
            [name, lbl, c, a, t]
            for lbl, c, a, t in zip(
                hop_labels,
                hops["calls"].to_list(),
                hops["attempts"].to_list(),
                hops["tokens"].to_list(),
                strict=True,
            )
        ]
        fig.add_trace(
            go.Bar(
                x=hop_labels,
                y=rates,
                name=name,
                legendgroup=f"w{i}",
                marker={"color": colour},
                customdata=custom,
                hovertemplate=(
                    "%{customdata[0]} hop %{customdata[1]}<br>retry rate %{y:.1%}<br>"
                    "%{customdata[3]:,} attempts for %{customdata[2]:,} logical calls<br>"
                    "%{customdata[4]:,} tokens<extra></extra>"
                ),
            ),
            row=1,
            col=1,
        )
        cumulative: list[float] = []
        running = 1.0
        for r in rates:
            running *= 1.0 + (r or 0.0)
            cumulative.append(running)
        steps = list(range(1, len(cumulative) + 1))
        fig.add_trace(
            go.Scatter(
                x=[0, *steps],
                y=[1.0, *cumulative],
                mode="lines+markers",
                name=name,
                legendgroup=f"w{i}",
                showlegend=False,
                line={"color": colour, "dash": "dash"},
                customdata=[[name, "start"], *[[name, lbl] for lbl in hop_labels]],
                hovertemplate=("%{customdata[0]}, model after %{customdata[1]}: ×%{y:.3f}<extra></extra>"),
            ),
            row=1,
            col=2,
        )
        fig.add_trace(
            go.Scatter(
                x=[len(steps)],
                y=[w["attempt_amplification"]],
                mode="markers",
                name=name,
                legendgroup=f"w{i}",
                showlegend=False,
                marker={
                    "color": colour,
                    "symbol": "diamond",
                    "size": 12,
                    "line": {"color": "white", "width": 1},
                },
                customdata=[[name, w["runs"]]],
                hovertemplate=(
                    "%{customdata[0]}: observed ×%{y:.3f} attempts"
                    " over %{customdata[1]:,} runs<extra></extra>"
                ),
            ),
            row=1,
            col=2,
        )
    names = esc_all(shown["workflow"].to_list())
    runs = shown["runs"].to_list()
    for column, label, colour in (
        ("attempt_amplification", "observed", style.OBSERVED),
        ("modeled_amplification", "model ∏(1+r)", style.MODEL),
    ):
        fig.add_trace(
            go.Bar(
                x=names,
                y=shown[column].to_list(),
                name=label,
                legendgroup=column,
                marker={"color": colour},
                text=[f"×{v:.3f}" for v in shown[column].fill_null(float("nan")).to_list()],
                textposition="outside",
                customdata=[[n, r] for n, r in zip(names, runs, strict=True)],
                hovertemplate="%{customdata[0]}<br>"
                + label
                + " ×%{y:.3f} (%{customdata[1]:,} runs)<extra></extra>",
            ),
            row=2,
            col=1,
        )
    tokens = shown["token_amplification"].to_list()
    fig.add_trace(
        go.Bar(
            x=names,
            y=tokens,
            name="token amplification",
            legendgroup="tokens",
            marker={"color": style.TOKENS},
            text=["n/a" if t is None else f"{(t - 1):+.1%} tokens" for t in tokens],
            textposition="outside",
            customdata=[[n, r] for n, r in zip(names, runs, strict=True)],
            hovertemplate="%{customdata[0]}<br>tokens ×%{y:.3f} (%{customdata[1]:,} runs)<extra></extra>",
        ),
        row=2,
        col=2,
    )
    fig.update_yaxes(title_text="retry rate", tickformat=".0%", rangemode="tozero", row=1, col=1)
    fig.update_xaxes(type="category", automargin=True, row=1, col=1)
    fig.update_yaxes(title_text="× attempts", row=1, col=2)
    fig.update_xaxes(title_text="hops completed", dtick=1, row=1, col=2)
    fig.update_yaxes(title_text="× attempts per logical call", rangemode="tozero", row=2, col=1)
    fig.update_yaxes(title_text="× tokens", rangemode="tozero", row=2, col=2)
    fig.update_xaxes(type="category", row=2, col=1)
    fig.update_xaxes(type="category", row=2, col=2)
    extra = _left_out(shown.height, amp.height, "workflows")
    fig.update_layout(
        **style.base_layout(VIEW_TITLES["retries"], _subtitle(analysis, extra), 820), barmode="group"
    )
    return fig


# --- attribution -----------------------------------------------------------------------------

TOP_SPANS: Final = 8
EXEMPLARS: Final = 3


def attribution_figure(analysis: AnalysisFrames, alerts: pl.DataFrame | None = None) -> go.Figure:
    """Per operation: the p99 delta split into LLM vs internal, the spans behind it, exemplars, signals."""
    attribution = analysis.attribution
    if not attribution.height:
        return _empty("attribution", analysis, "no hot-path operation to compare with the baseline")
    ordered = attribution.sort(
        ["delta_ms", "service", "operation"], descending=[True, False, False], nulls_last=True
    )
    ops = list(ordered.select("service", "operation").iter_rows())[:MAX_PANELS]
    signals = analysis.llm_signals
    titles: list[str] = []
    for service, operation in ops:
        a = _of(attribution, service, operation).row(0, named=True)
        title = (
            f"{_label(service, operation)}: p99 {_fmt_ms(a['baseline_p99_ms'])} → "
            f"{_fmt_ms(a['current_p99_ms'])} "
            f"({_fmt_delta(a['delta_ms'])}), verdict <b>{esc(a['verdict'])}</b>"
        )
        fired = _alerts_for(alerts, service, operation)
        if fired:
            title += f"<br>alerts: {fired}"
        titles += [title, "top spans behind the change (Δ ms on the critical path)"]
    rows = len(ops)
    specs: list[list[dict[str, Any] | None]] = [[{"type": "xy"}, {"type": "xy"}] for _ in ops]
    specs.append([{"type": "table", "colspan": 2}, None])
    titles.append("Exemplar slow traces (at or above the current p99)")
    if signals.height:
        specs.append([{"type": "table", "colspan": 2}, None])
        titles.append("LLM signals per provider/model: baseline → current")
    # Pixel heights per row: charts get room, tables only what their rows need.
    pixels = [260] * rows + [60 + 36 * rows]
    if signals.height:
        pixels.append(70 + 34 * signals.height)
    gap = 120  # room for a row's x-axis title and the next row's two-line headline
    total = sum(pixels) + gap * (len(pixels) - 1)
    fig = make_subplots(
        rows=len(specs),
        cols=2,
        specs=specs,
        subplot_titles=titles,
        column_widths=[0.42, 0.58],
        row_heights=[p / sum(pixels) for p in pixels],
        vertical_spacing=gap / total,
        horizontal_spacing=0.22,
    )
    # The operation's headline spans the row: anchor it at the left edge instead of centring it
    # over the narrow first column.
    for i in range(rows):
        fig.layout.annotations[2 * i].update(x=0.0, xanchor="left", align="left")
    for row, (service, operation) in enumerate(ops, start=1):
        a = _of(attribution, service, operation).row(0, named=True)
        who = [esc(service), esc(operation)]
        for cls, column, colour, share in (
            ("LLM", "llm_delta_ms", style.LLM, a["llm_share"]),
            ("internal", "internal_delta_ms", style.INTERNAL, a["internal_share"]),
        ):
            fig.add_trace(
                go.Bar(
                    x=[a[column]],
                    y=["Δ p99"],
                    orientation="h",
                    name=cls,
                    legendgroup=cls,
                    showlegend=row == 1,
                    marker={"color": colour},
                    text=[f"{cls} {_fmt_delta(a[column])}" + ("" if share is None else f" ({share:.0%})")],
                    textposition="inside",
                    customdata=[[*who, cls, "n/a" if share is None else f"{share:.0%}"]],
                    hovertemplate=(
                        "%{customdata[0]} · %{customdata[1]}<br>%{customdata[2]} share of the p99 delta: "
                        "%{x:+,.0f} ms (%{customdata[3]})<extra></extra>"
                    ),
                ),
                row=row,
                col=1,
            )
        spans = _of(analysis.attribution_spans, service, operation)
        spans = (
            spans.with_columns(pl.col("delta_ms").abs().alias("_abs"))
            .sort(["_abs", "span_name"], descending=[True, False])
            .head(TOP_SPANS)
            .reverse()  # largest at the top of a horizontal bar chart
        )
        for cls, colour in (("llm", style.LLM), ("internal", style.INTERNAL)):
            part = spans.filter(pl.col("class") == cls)
            if not part.height:
                continue
            fig.add_trace(
                go.Bar(
                    x=part["delta_ms"].to_list(),
                    y=esc_all(part["span_name"].to_list()),
                    orientation="h",
                    name="LLM" if cls == "llm" else "internal",
                    legendgroup="LLM" if cls == "llm" else "internal",
                    showlegend=False,
                    marker={"color": colour},
                    customdata=[
                        [*who, esc(p or "—"), esc(m or "—")]
                        for p, m in zip(part["provider"].to_list(), part["model"].to_list(), strict=True)
                    ],
                    hovertemplate=(
                        "%{customdata[0]} · %{customdata[1]}<br>span %{y}<br>Δ %{x:+,.0f} ms<br>"
                        "provider %{customdata[2]}, model %{customdata[3]}<extra></extra>"
                    ),
                ),
                row=row,
                col=2,
            )
        fig.update_xaxes(title_text="Δ p99 (ms)", zeroline=True, row=row, col=1)
        fig.update_xaxes(title_text="Δ ms", zeroline=True, row=row, col=2)
        fig.update_yaxes(type="category", categoryorder="trace", row=row, col=2)
    fig.update_layout(barmode="relative")
    fig.add_trace(_exemplar_table(ordered.head(MAX_PANELS)), row=rows + 1, col=1)
    if signals.height:
        fig.add_trace(_signals_table(signals), row=rows + 2, col=1)
    extra = _left_out(len(ops), attribution.height, "operations")
    subtitle = (
        f"{style.fmt_window(analysis.start, analysis.end)} vs baseline "
        f"{style.fmt_window(analysis.baseline_start, analysis.baseline_end)}"
    )
    if extra:
        subtitle += f" · {extra}"
    height = 170 + total
    fig.update_layout(**style.base_layout(VIEW_TITLES["attribution"], subtitle, height))
    return fig


def _fmt_delta(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+,.0f} ms"


def _alerts_for(alerts: pl.DataFrame | None, service: str, operation: str) -> str:
    """The alerts that name this operation, escaped, most recent status of each."""
    if alerts is None or not alerts.height or "service" not in alerts.columns:
        return ""
    mine = (
        alerts.filter((pl.col("service") == service) & (pl.col("operation") == operation))
        .sort("at")
        .unique(subset=["fingerprint"], keep="last", maintain_order=True)
    )
    return ", ".join(
        f"{esc(r['alertname'])} ({esc(r['status'])}, cause {esc(r['cause'] or 'n/a')})"
        for r in mine.iter_rows(named=True)
    )


def _exemplar_table(attribution: pl.DataFrame) -> go.Table:
    ops = [_label(s, o) for s, o in zip(attribution["service"], attribution["operation"], strict=True)]
    exemplars = [
        ", ".join(esc_all((ids or [])[:EXEMPLARS])) or "—"
        for ids in attribution["exemplar_trace_ids"].to_list()
    ]
    return go.Table(
        columnwidth=[0.3, 0.12, 0.58],
        header={
            "values": ["operation", "verdict", "exemplar trace ids"],
            "align": "left",
            "fill_color": "#eee",
        },
        cells={"values": [ops, esc_all(attribution["verdict"].to_list()), exemplars], "align": "left"},
    )


def _signals_table(signals: pl.DataFrame) -> go.Table:
    def pair(row: dict[str, Any], name: str) -> str:
        b, c = row[f"{name}_baseline"], row[f"{name}_current"]
        return f"{_pct(b)} → {_pct(c)}"

    rows = list(signals.iter_rows(named=True))
    columns: list[Sequence[str]] = [
        [_label(r["service"], r["operation"]) for r in rows],
        [f"{esc(r['provider'] or '—')} / {esc(r['model'] or '—')}" for r in rows],
        [pair(r, "error_rate") for r in rows],
        [pair(r, "throttle_rate") for r in rows],
        [pair(r, "retry_rate") for r in rows],
        [pair(r, "cold_share") for r in rows],
    ]
    return go.Table(
        header={
            "values": [
                "operation",
                "provider / model",
                "error rate",
                "429 rate",
                "retry rate",
                "cold-path share",
            ],
            "align": "left",
            "fill_color": "#eee",
        },
        cells={"values": columns, "align": "left"},
    )


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


# --- alerts ----------------------------------------------------------------------------------


def alerts_figure(analysis: AnalysisFrames, alerts: pl.DataFrame | None) -> go.Figure:
    """Each alert on its own line: firing intervals, firing and resolved marks, the cause on hover."""
    if alerts is None or not alerts.height:
        return _empty("alerts", analysis, NO_ALERTS_TEXT)
    events = alerts.sort(["fingerprint", "at"])
    window_end = naive_utc(analysis.end)
    interval_x: list[datetime | None] = []
    interval_y: list[str | None] = []
    firing: dict[str, list[Any]] = {"x": [], "y": [], "custom": []}
    resolved: dict[str, list[Any]] = {"x": [], "y": [], "custom": []}
    lanes: list[str] = []
    for _fingerprint, group in events.group_by("fingerprint", maintain_order=True):
        first = group.row(0, named=True)
        lane = esc(first["alertname"])
        # What the alert is about: an operation, a queue or a workflow (whichever labels it has).
        where = " · ".join(
            esc(first.get(c)) for c in ("service", "operation", "queue", "workflow") if first.get(c)
        )
        if where:
            lane += f" · {where}"
        lanes.append(lane)
        opened: datetime | None = None
        for e in group.iter_rows(named=True):
            at = naive_utc(e["at"])
            custom = [esc(e["alertname"]), esc(e["cause"] or "n/a"), esc(e["summary"] or ""), where or "—"]
            if e["status"] == "firing":
                firing["x"].append(at)
                firing["y"].append(lane)
                firing["custom"].append(custom)
                opened = opened or at
            else:
                resolved["x"].append(at)
                resolved["y"].append(lane)
                resolved["custom"].append(custom)
                if opened is not None:
                    interval_x += [opened, at, None]
                    interval_y += [lane, lane, None]
                    opened = None
        if opened is not None:  # still firing at the end of the window
            interval_x += [opened, max(window_end, opened), None]
            interval_y += [lane, lane, None]
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=interval_x,
            y=interval_y,
            mode="lines",
            name="firing interval",
            line={"color": style.ALERT_FIRING, "width": 10},
            opacity=0.35,
            hoverinfo="skip",
        )
    )
    hover = (
        "%{customdata[0]} (%{customdata[3]})<br>"
        + _DT_HOVER
        + "<br>cause: %{customdata[1]}<br>%{customdata[2]}"
    )
    fig.add_trace(
        go.Scatter(
            x=firing["x"],
            y=firing["y"],
            mode="markers+text",
            name="firing",
            marker={"color": style.ALERT_FIRING, "size": 12, "symbol": "circle"},
            text=[c[1] for c in firing["custom"]],
            textposition="top center",
            cliponaxis=False,
            customdata=firing["custom"],
            hovertemplate="<b>firing</b> " + hover + "<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=resolved["x"],
            y=resolved["y"],
            mode="markers",
            name="resolved",
            marker={"color": style.ALERT_RESOLVED, "size": 12, "symbol": "square"},
            cliponaxis=False,
            customdata=resolved["custom"],
            hovertemplate="<b>resolved</b> " + hover + "<extra></extra>",
        )
    )
    fig.update_xaxes(type="date", title_text="time (UTC)", range=[naive_utc(analysis.start), window_end])
    fig.update_yaxes(
        type="category",
        categoryorder="array",
        categoryarray=list(reversed(lanes)),
        range=[-0.6, len(lanes) - 0.3],  # room above the top lane for its cause label
        automargin=True,
    )
    n_firing = events.filter(pl.col("status") == "firing").height
    n_resolved = events.height - n_firing
    fig.update_layout(
        **style.base_layout(
            VIEW_TITLES["alerts"],
            _subtitle(
                analysis, f"{len(lanes)} alerts, {n_firing} firing and {n_resolved} resolved transitions"
            ),
            220 + 48 * len(lanes),
        )
    )
    return fig
