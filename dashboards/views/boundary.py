"""Hot/cold boundary: each hot operation's latency budget, what its synchronous model calls cost
against it, the recommendation, and the slices of a migration off the hot path.

Read per operation, left to right: the p99 now and the p99 it would have without its synchronous
model calls (the counterfactual), against the budget line; then the abandonment curve with the
budget and the cliff, so the cost of every 500 ms is visible. Below, one table row per flag variant.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from analytics import Analysis
from dashboards import style
from dashboards.style import esc, esc_all
from dashboards.views._common import (
    MAX_PANELS,
    ROW_GAP,
    ROW_HEIGHT,
    VIEW_TITLES,
    add_vline,
    axis_refs,
    empty_figure,
    fmt_ms,
    left_out,
    op_label,
    rows_of,
    window_subtitle,
)

__all__ = ["RECOMMENDATION_TEXT", "boundary_figure"]

RECOMMENDATION_TEXT = {
    "keep": "keep on the hot path (within budget)",
    "move_off_hot_path": "move the model calls off the hot path",
    "optimise_internal": "optimise the operation's own code (over budget even without model calls)",
}


def _headline(b: dict[str, Any]) -> str:
    what = RECOMMENDATION_TEXT.get(b["recommendation"] or "", "no budget: configure one or wait for a cliff")
    budget = (
        "no budget" if b["budget_ms"] is None else f"budget {fmt_ms(b['budget_ms'])} ({b['budget_source']})"
    )
    return f"{op_label(b['service'], b['operation'])} — {esc(what)}; {budget}"


def boundary_figure(analysis: Analysis) -> go.Figure:
    """Per operation: p99 and counterfactual p99 against the budget, the abandonment curve; slices."""
    boundary = analysis.boundary.sort(["requests", "service", "operation"], descending=[True, False, False])
    if not boundary.height:
        return empty_figure("boundary", analysis, "no hot-path operation in this window")
    shown = boundary.head(MAX_PANELS)
    slices = analysis.slices
    rows = shown.height
    table_rows = 1 if slices.height else 0
    fig = make_subplots(
        rows=rows + table_rows,
        cols=2,
        column_widths=[0.42, 0.58],
        specs=[[{}, {}] for _ in range(rows)]
        + ([[{"type": "table", "colspan": 2}, None]] if table_rows else []),
        subplot_titles=[t for b in shown.iter_rows(named=True) for t in (_headline(b), "")]
        + (["Slices: variant against control"] if table_rows else []),
        vertical_spacing=ROW_GAP / (ROW_HEIGHT * (rows + table_rows)),
    )
    for row, b in enumerate(shown.iter_rows(named=True), start=1):
        _budget_bars(fig, row, b)
        _abandonment(fig, row, b, rows_of(analysis.abandonment, b["service"], b["operation"]).sort("lo_ms"))
    if table_rows:
        fig.add_trace(_slices_table(slices), row=rows + 1, col=1)
    extra = left_out(rows, boundary.height, "operations")
    fig.update_layout(
        **style.base_layout(
            VIEW_TITLES["boundary"], window_subtitle(analysis, extra), 140 + ROW_HEIGHT * (rows + table_rows)
        ),
        showlegend=False,
    )
    return fig


def _budget_bars(fig: go.Figure, row: int, b: dict[str, Any]) -> None:
    labels = ["p99 now", "p99 without sync model calls"]
    values = [b["p99_ms"], b["p99_without_sync_llm_ms"]]
    over = [b["requests_over_budget"], b["requests_over_budget_without_sync_llm"]]
    fig.add_trace(
        go.Bar(
            x=values,
            y=labels,
            orientation="h",
            marker_color=[style.OBSERVED, style.MODEL],
            customdata=[[n, b["sync_llm_calls_per_request"]] for n in over],
            hovertemplate="%{y}: %{x:,.0f} ms<br>%{customdata[0]:,} requests over budget"
            "<br>sync model calls/request now: %{customdata[1]:.2f}<extra></extra>",
        ),
        row=row,
        col=1,
    )
    fig.update_xaxes(title_text="latency (ms)", rangemode="tozero", row=row, col=1)
    if b["budget_ms"] is not None:
        add_vline(fig, row, 1, b["budget_ms"], f"budget {fmt_ms(b['budget_ms'])}", style.CLIFF)


def _abandonment(fig: go.Figure, row: int, b: dict[str, Any], buckets: pl.DataFrame) -> None:
    if not buckets.height:
        return
    mids = [(lo + hi) / 2 for lo, hi in zip(buckets["lo_ms"], buckets["hi_ms"], strict=True)]
    fig.add_trace(
        go.Scatter(
            x=mids,
            y=buckets["rate"].to_list(),
            mode="lines+markers",
            line={"color": style.OBSERVED},
            hovertemplate="%{x:,.0f} ms bucket: %{y:.1%} abandoned<extra></extra>",
        ),
        row=row,
        col=2,
    )
    fig.update_xaxes(title_text="latency bucket (ms)", row=row, col=2)
    fig.update_yaxes(title_text="abandoned", tickformat=".0%", rangemode="tozero", row=row, col=2)
    if b["budget_ms"] is not None:
        add_vline(fig, row, 2, b["budget_ms"], "budget", style.CLIFF)
    saved = b["abandoned_saved_per_day"]
    if saved is not None:
        fig.add_annotation(
            text=f"without sync model calls: ~{saved:,.0f} fewer abandoned requests/day",
            xref=f"{axis_refs(fig, row, 2)[0]} domain",
            yref=f"{axis_refs(fig, row, 2)[1]} domain",
            x=0.99,
            y=0.98,
            xanchor="right",
            showarrow=False,
            font={"size": 11},
        )


def _slices_table(slices: pl.DataFrame) -> go.Table:
    ordered = slices.sort(
        ["service", "operation", "flag", "is_control", "variant"],
        descending=[False, False, False, True, False],
    )

    def num(value: Any, fmt: str) -> str:
        return "—" if value is None else format(value, fmt)

    columns: dict[str, list[str]] = {
        "operation": [op_label(s, o) for s, o in zip(ordered["service"], ordered["operation"], strict=True)],
        "flag": esc_all(ordered["flag"].to_list()),
        "variant": [
            f"{esc(v)} (control)" if c else esc(v)
            for v, c in zip(ordered["variant"], ordered["is_control"], strict=True)
        ],
        "requests": [f"{n:,}" for n in ordered["requests"]],
        "p50 / p99 ms": [
            f"{num(a, ',.0f')} / {num(b, ',.0f')}"
            for a, b in zip(ordered["p50_ms"], ordered["p99_ms"], strict=True)
        ],
        "Δp99 vs control": [
            "—" if d is None else f"{d:+,.0f} ms{' (significant)' if s else ''}"
            for d, s in zip(ordered["p99_delta_ms"], ordered["significant"], strict=True)
        ],
        "abandoned (95% CI)": [
            f"{num(r, '.1%')} ({num(lo, '.1%')}–{num(hi, '.1%')})"
            for r, lo, hi in zip(
                ordered["abandonment_rate"],
                ordered["abandonment_rate_low"],
                ordered["abandonment_rate_high"],
                strict=True,
            )
        ],
        "sync model calls/req": [num(v, ".2f") for v in ordered["sync_llm_calls_per_request"]],
        "cold p99 (s)": [num(v, ",.1f") for v in ordered["cold_p99_s"]],
    }
    return go.Table(
        header={"values": list(columns), "align": "left", "fill_color": "#eee"},
        cells={"values": list(columns.values()), "align": "left"},
    )
