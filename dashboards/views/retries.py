"""Retries: retry rate per hop, amplification compounding across hops vs observed, token amplification.

The observed amplification stands beside the baseline window's, so a retry storm reads as a change
from the workflow's usual level, not as a number on its own.
"""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from analytics import Analysis
from dashboards import style
from dashboards.style import esc, esc_all
from dashboards.views._common import MAX_PANELS, VIEW_TITLES, empty_figure, left_out, window_subtitle

__all__ = ["retries_figure"]


def retries_figure(analysis: Analysis) -> go.Figure:
    """Per-hop retry rate, cumulative amplification, observed vs ``prod(1 + r)``, token amplification."""
    amp = analysis.retry_amplification.sort(["runs", "workflow"], descending=[True, False])
    if not amp.height:
        return empty_figure("retries", analysis, "no agent workflows in this window")
    shown = amp.head(MAX_PANELS)
    fig = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=[
            "Retry rate per hop",
            "Cumulative amplification across hops: model ∏(1+r) dashed, observed ◆",
            "Attempts per logical call: baseline, observed, the compounding model",
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
    # The baseline window's observed amplification first, pale: a storm is a change from it.
    bars = [("baseline_attempt_amplification", "observed, baseline", style.BASELINE)]
    if shown["baseline_attempt_amplification"].is_null().all():
        bars = []
    for column, label, colour in (
        *bars,
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
                text=["n/a" if v is None else f"×{v:.3f}" for v in shown[column].to_list()],
                textposition="outside",
                customdata=[
                    [n, r]
                    for n, r in zip(
                        names,
                        shown["baseline_runs"].to_list() if column.startswith("baseline_") else runs,
                        strict=True,
                    )
                ],
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
    extra = left_out(shown.height, amp.height, "workflows")
    fig.update_layout(
        **style.base_layout(VIEW_TITLES["retries"], window_subtitle(analysis, extra), 820), barmode="group"
    )
    return fig
