"""Abandonment: the share of abandoned requests per 500 ms latency bucket, the cliff and the p99."""

from __future__ import annotations

from typing import Final

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from analytics import Analysis
from dashboards import style
from dashboards.style import esc
from dashboards.views._common import (
    MAX_PANELS,
    ROW_GAP,
    ROW_HEIGHT,
    VIEW_TITLES,
    add_vline,
    count_of,
    empty_figure,
    left_out,
    op_label,
    operations_by,
    rows_of,
    window_subtitle,
)

__all__ = ["MIN_BUCKET_REQUESTS", "abandonment_figure"]

# A bucket of one or two requests reads 0% or 100%: below this many its bar is greyed and its hover
# says the rate rests on too few requests (the Wilson interval shows how little it says).
MIN_BUCKET_REQUESTS: Final = 20


def abandonment_figure(analysis: Analysis) -> go.Figure:
    """Rate per bucket with its Wilson interval, requests per bucket, the cliff and the p99 marked."""
    summary = analysis.abandonment_summary
    ops_all = operations_by(summary, "requests") if summary.height else []
    if not ops_all:
        return empty_figure("abandonment", analysis, "no hot-path requests in this window")
    ops = ops_all[:MAX_PANELS]
    titles = []
    for service, operation in ops:
        s = rows_of(summary, service, operation).row(0, named=True)
        cliff = "no cliff" if s["cliff_ms"] is None else f"cliff at {s['cliff_ms']:,} ms"
        titles.append(
            f"{op_label(service, operation)} — {s['abandoned']:,} of {s['requests']:,} requests abandoned "
            f"({(s['rate'] or 0.0):.1%}), {cliff}"
        )
    fig = make_subplots(
        rows=len(ops),
        cols=1,
        specs=[[{"secondary_y": True}] for _ in ops],
        subplot_titles=titles,
        vertical_spacing=ROW_GAP / (ROW_HEIGHT * len(ops)),
    )
    for row, (service, operation) in enumerate(ops, start=1):
        s = rows_of(summary, service, operation).row(0, named=True)
        buckets = rows_of(analysis.abandonment, service, operation).sort("lo_ms")
        lo = buckets["lo_ms"].to_list()
        hi = buckets["hi_ms"].to_list()
        rate = buckets["rate"].to_list()
        low = buckets["rate_low"].to_list()
        high = buckets["rate_high"].to_list()
        mids = [(a + b) / 2 for a, b in zip(lo, hi, strict=True)]
        counts = buckets["requests"].to_list()
        thin = [n < MIN_BUCKET_REQUESTS for n in counts]
        custom = [
            [
                esc(service),
                esc(operation),
                a,
                b,
                n,
                k,
                lw,
                hg,
                f"<br><i>only {count_of(n, 'request')}: too few for a rate (greyed below "
                f"{MIN_BUCKET_REQUESTS})</i>"
                if t
                else "",
            ]
            for a, b, n, k, lw, hg, t in zip(
                lo, hi, counts, buckets["abandoned"].to_list(), low, high, thin, strict=True
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
                marker={
                    "color": [style.THIN_BUCKET if t else style.CLIFF for t in thin],
                    "opacity": 0.75,
                },
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
                    "<br>95% interval %{customdata[6]:.1%} – %{customdata[7]:.1%}%{customdata[8]}"
                    "<extra></extra>"
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
            add_vline(
                fig, row, 1, s["cliff_ms"], f"<b>cliff ≥ {s['cliff_ms']:,} ms</b>", style.CLIFF, dash="dash"
            )
        if s["p99_ms"] is not None:
            add_vline(
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
    extra = left_out(len(ops), len(ops_all), "operations")
    fig.update_layout(
        **style.base_layout(
            VIEW_TITLES["abandonment"], window_subtitle(analysis, extra), 140 + ROW_HEIGHT * len(ops)
        ),
        bargap=0.02,
    )
    return fig
