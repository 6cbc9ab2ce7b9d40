"""Hot/cold boundary: each hot operation's latency budget, what its synchronous model calls cost
against it, what the fixes would do and at what price, and the slices of a migration off the hot path.

Read per operation, left to right under its headline: the p99 now and the p99 it would have without
its synchronous model calls (the counterfactual), against the budget line; the abandonment curve with
the budget, so the cost of every 500 ms is visible; the what-if options (a hedge, a timeout with a
fallback, another model, moving the calls off: ``analytics.what_if``), each a point at its price and
its p99, with the p99 now and the budget as lines and the cheapest option under the budget marked.
Below, one table row per flag variant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from analytics import Analysis
from dashboards import style
from dashboards.style import esc, esc_all
from dashboards.views._common import (
    MAX_PANELS,
    VIEW_TITLES,
    add_hline,
    add_vline,
    axis_refs,
    count_of,
    empty_figure,
    fmt_ms,
    left_out,
    op_label,
    rows_of,
    window_subtitle,
)

__all__ = [
    "CHEAPEST_TEXT",
    "COLUMN_TITLES",
    "OPTION_TEXT",
    "PRICE_AXES",
    "RECOMMENDATION_TEXT",
    "PriceAxis",
    "boundary_figure",
    "cheapest_under_budget",
    "price_axis",
]

RECOMMENDATION_TEXT = {
    "keep": "keep on the hot path (within budget)",
    "move_off_hot_path": "move the model calls off the hot path",
    "optimise_internal": "optimise the operation's own code (over budget even without model calls)",
}

# The option each what-if panel circles, and the first line of its hover.
CHEAPEST_TEXT: Final = "cheapest under budget"
# Above each operation's three panels, under its headline.
COLUMN_TITLES: Final = (
    "p99 against the budget",
    "abandoned, by latency bucket",
    f"what-if options (◇ {CHEAPEST_TEXT})",
)

# What each what-if option does (analytics.what_if), for its hover.
OPTION_TEXT: Final = {
    "hedge": "hedge: a second request at T, the first answer kept",
    "timeout_fallback": "timeout at T, then a fallback that takes F",
    "route_model": "route the calls to another model",
    "move_off_hot_path": "move the model calls off the hot path",
}


@dataclass(frozen=True)
class PriceAxis:
    """The x axis of the what-if panel: the column of the ``what_if`` frame it reads and its title."""

    column: str
    title: str
    tickformat: str
    tickprefix: str = ""


# The price of an option, the first of these the operation's options have (the column exists and
# holds a value): money a day once a price table gives one; else the extra tokens a day, which a
# price table would turn into money; else the extra tokens as a share of the calls' tokens, which
# every analysis has.
PRICE_AXES: Final = (
    PriceAxis("extra_cost_per_day", "extra cost (USD/day)", ",.2~f", "$"),
    PriceAxis("extra_tokens_per_day", "extra tokens/day (no price table)", "~s"),
    PriceAxis("extra_tokens_ratio", "extra tokens, share of the calls' (no price table)", ".0%"),
)

# Pixels of a chart row, of the operation's headline line, of the column titles' line, of a row's x
# ticks and axis title: each text above and below a row gets its own line at any page width.
CHART_PX: Final = 240
HEADLINE_PX: Final = 22
COLUMN_TITLE_PX: Final = 26
AXIS_PX: Final = 70
TITLE_TOP_PX: Final = 16
# A table row of the slices (their cells wrap over up to three lines), the table's header and title.
SLICE_ROW_PX: Final = 56
SLICE_HEAD_PX: Final = 60


def _headline(b: dict[str, Any]) -> str:
    what = RECOMMENDATION_TEXT.get(b["recommendation"] or "", "no budget: configure one or wait for a cliff")
    budget = (
        "no budget" if b["budget_ms"] is None else f"budget {fmt_ms(b['budget_ms'])} ({b['budget_source']})"
    )
    return f"{op_label(b['service'], b['operation'])} — {esc(what)}; {budget}"


def boundary_figure(analysis: Analysis) -> go.Figure:
    """Per operation: p99 and counterfactual p99 against the budget, the abandonment curve, the
    what-if options against their price; the slices."""
    boundary = analysis.boundary.sort(["requests", "service", "operation"], descending=[True, False, False])
    if not boundary.height:
        return empty_figure("boundary", analysis, "no hot-path operation in this window")
    shown = boundary.head(MAX_PANELS)
    slices = analysis.slices
    rows = shown.height
    specs: list[list[dict[str, Any] | None]] = [[{}, {}, {}] for _ in range(rows)]
    titles = [t for _ in range(rows) for t in COLUMN_TITLES]
    pixels = [CHART_PX] * rows
    if slices.height:
        specs.append([{"type": "table", "colspan": 3}, None, None])
        titles.append("Slices: variant against control")
        pixels.append(SLICE_HEAD_PX + SLICE_ROW_PX * slices.height)
    gap = AXIS_PX + HEADLINE_PX + COLUMN_TITLE_PX
    total = sum(pixels) + gap * (len(pixels) - 1)
    fig = make_subplots(
        rows=len(specs),
        cols=3,
        column_widths=[0.30, 0.36, 0.34],
        specs=specs,
        subplot_titles=titles,
        row_heights=[p / sum(pixels) for p in pixels],
        vertical_spacing=gap / total,
        horizontal_spacing=0.08,
    )
    for row, b in enumerate(shown.iter_rows(named=True), start=1):
        # The headline spans the row, left-aligned, one line above the column titles.
        fig.add_annotation(
            text=_headline(b),
            xref="paper",
            yref="paper",
            x=0.0,
            y=fig.layout.annotations[3 * (row - 1)].y,
            xanchor="left",
            yanchor="bottom",
            yshift=COLUMN_TITLE_PX,
            align="left",
            showarrow=False,
            font={"size": 14},
        )
        _budget_bars(fig, row, b)
        _abandonment(fig, row, b, rows_of(analysis.abandonment, b["service"], b["operation"]).sort("lo_ms"))
        _options(fig, row, b, rows_of(analysis.what_if, b["service"], b["operation"]))
    if slices.height:
        fig.add_trace(_slices_table(slices), row=rows + 1, col=1)
    extra = left_out(rows, boundary.height, "operations")
    subtitle = window_subtitle(analysis, extra)
    # The first row's headline and column titles sit in the top margin, under the figure's title,
    # which stays at the top of the taller margin (plotly would centre it down onto the headline).
    margin = dict(style.base_layout(VIEW_TITLES["boundary"], subtitle, 1)["margin"])
    margin["t"] += COLUMN_TITLE_PX + HEADLINE_PX
    height = margin["t"] + margin["b"] + total
    fig.update_layout(**style.base_layout(VIEW_TITLES["boundary"], subtitle, height), showlegend=False)
    fig.update_layout(
        margin=margin, title={"yref": "container", "y": 1.0 - TITLE_TOP_PX / height, "yanchor": "top"}
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
        # The value is in the headline; a short label stays within the panel beside a long bar.
        add_vline(fig, row, 1, b["budget_ms"], "budget", style.CLIFF)


def _panel_note(fig: go.Figure, row: int, col: int, text: str) -> None:
    """A line in the middle of an empty panel, placed on the page: plotly.js draws no axes for a
    subplot without a trace, and an annotation on them would land elsewhere."""
    subplot = fig.get_subplot(row, col)
    fig.add_annotation(
        text=text,
        xref="paper",
        yref="paper",
        x=sum(subplot.xaxis.domain) / 2,
        y=sum(subplot.yaxis.domain) / 2,
        showarrow=False,
        font={"size": 12, "color": "#555"},
    )


def _abandonment(fig: go.Figure, row: int, b: dict[str, Any], buckets: pl.DataFrame) -> None:
    if not buckets.height:
        _panel_note(fig, row, 2, "no abandonment curve")
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
    # From 0 ms, and up to at least 5% abandoned: one bucket, or nobody abandoning, would otherwise
    # get a range of a fraction of a millisecond or percent whose tick labels all read the same.
    fig.update_xaxes(title_text="latency bucket (ms)", rangemode="tozero", row=row, col=2)
    top = max((r for r in buckets["rate"].to_list() if r is not None), default=0.0)
    # Apart from the axis: a "0%" at the corner would meet the x axis's first tick label.
    fig.update_yaxes(
        title_text="abandoned",
        tickformat=".0%",
        range=[0.0, max(0.05, top * 1.08)],
        ticklabelstandoff=6,
        row=row,
        col=2,
    )
    if b["budget_ms"] is not None:
        add_vline(fig, row, 2, b["budget_ms"], "budget", style.CLIFF)
    saved = b["abandoned_saved_per_day"]
    if saved is not None:
        # Bottom right: under the curve's high end, where a cliff leaves the panel empty, and clear
        # of the tick labels and the budget's label at the top.
        xref, yref = axis_refs(fig, row, 2)
        fig.add_annotation(
            text=f"without sync model calls:<br>~{round(saved):,} fewer abandoned requests/day",
            xref=f"{xref} domain",
            yref=f"{yref} domain",
            x=0.99,
            y=0.03,
            xanchor="right",
            yanchor="bottom",
            align="right",
            showarrow=False,
            font={"size": 11},
            bgcolor="rgba(255,255,255,0.7)",
        )


def price_axis(options: pl.DataFrame) -> PriceAxis:
    """The x axis the options of one operation are drawn on: the first of :data:`PRICE_AXES` whose
    column the frame has with at least one value (the last one otherwise)."""
    for axis in PRICE_AXES:
        if axis.column in options.columns and options[axis.column].is_not_null().any():
            return axis
    return PRICE_AXES[-1]


def _option_name(option: str, parameter: str | None) -> str:
    """``timeout_fallback T=p95 F=50ms``: the name ``cheapest_option`` of the boundary gives."""
    return f"{option} {parameter}" if parameter else option


def cheapest_under_budget(
    options: pl.DataFrame, price: str, budget: float | None, recommended: str | None = None
) -> int | None:
    """The row of ``options`` (one operation's ``what_if`` rows) the panel marks: of those whose p99
    is under the budget (``p99_ms`` < budget, as ``cheapest_option``) and whose ``price`` is known,
    the lowest price; on a tie the one the boundary recommends (``recommended``, its
    ``cheapest_option``), then the fewest extra calls, then the lowest p99. ``None`` without a
    budget or when no option gets under it."""
    if budget is None:
        return None
    best: tuple[Any, ...] | None = None
    found: int | None = None
    for i, r in enumerate(options.iter_rows(named=True)):
        if r[price] is None or r["p99_ms"] is None or not r["p99_ms"] < budget:
            continue
        key = (
            r[price],
            _option_name(r["option"], r["parameter"]) != recommended,
            r["extra_calls_ratio"] if r["extra_calls_ratio"] is not None else float("inf"),
            r["p99_ms"],
        )
        if best is None or key < best:
            best, found = key, i
    return found


def _fmt(value: float | None, fmt: str, unknown: str = "unknown") -> str:
    return unknown if value is None else format(value, fmt)


def _options(fig: go.Figure, row: int, b: dict[str, Any], options: pl.DataFrame) -> None:
    """One operation's what-if options: each at (its price, its p99), the p99 now and the budget as
    lines, the cheapest option under the budget circled; options without a known price are named
    under the axis instead."""
    options = options.filter(pl.col("p99_ms").is_not_null())
    if not options.height:
        _panel_note(fig, row, 3, "no option simulated:<br>no synchronous model call")
        return
    axis = price_axis(options)
    priced = axis is PRICE_AXES[0]
    drawn = options.filter(pl.col(axis.column).is_not_null())
    x = drawn[axis.column].to_list()
    y = drawn["p99_ms"].to_list()
    texts, customdata = _option_hover(drawn, priced)
    marked = cheapest_under_budget(drawn, axis.column, b["budget_ms"], b.get("cheapest_option"))
    if marked is not None:
        texts[marked] = f"<b>{CHEAPEST_TEXT}</b><br>{texts[marked]}"
    fig.add_trace(
        go.Scatter(
            x=x,
            y=y,
            name="what-if options",
            mode="markers",
            marker={"color": style.OBSERVED, "size": 9},
            # Whole at the panel's edge: moving the calls off often lands near a p99 of 0.
            cliponaxis=False,
            text=texts,
            customdata=customdata,
            hovertemplate="%{text}<br>p99 %{customdata[0]} → %{y:,.0f} ms"
            "<br>abandoned requests saved a day: %{customdata[1]}"
            "<br>extra tokens: %{customdata[2]}<br>extra cost: %{customdata[3]}"
            "<br>extra calls: %{customdata[4]}<extra></extra>",
        ),
        row=row,
        col=3,
    )
    if marked is not None:
        fig.add_trace(
            go.Scatter(
                x=[x[marked]],
                y=[y[marked]],
                name=CHEAPEST_TEXT,
                mode="markers",
                marker={
                    "symbol": "diamond-open",
                    "size": 20,
                    "color": style.CHEAPEST,
                    "line": {"width": 2.5},
                },
                cliponaxis=False,
                hoverinfo="skip",
            ),
            row=row,
            col=3,
        )
    # Every row of the operation is measured against the p99 of the same requests before: those of
    # the window's last what_if_horizon, not the whole window's p99 of the bars beside it.
    before = drawn.select(pl.col("p99_ms") - pl.col("p99_delta_ms"))["p99_ms"].drop_nulls()
    now = (
        f"p99 now {fmt_ms(before[0])}, last {count_of(drawn['requests'][0], 'request')}"
        if len(before)
        else ""
    )
    lines = [
        (v, label, colour, dash)
        for v, label, colour, dash in (
            (before[0] if len(before) else None, now, style.OBSERVED, "dash"),
            (b["budget_ms"], f"budget {fmt_ms(b['budget_ms'])}", style.CLIFF, "dot"),
        )
        if v is not None
    ]
    # The higher line's label above it, the lower one's below: two close lines keep theirs apart.
    for i, (v, label, colour, dash) in enumerate(sorted(lines, key=lambda line: -line[0])):
        add_hline(fig, row, 3, v, label, colour, dash=dash, label_above=i == 0)
    # Ranges with room around the points: the x axis's 0 clears the y axis's tick labels, and a
    # label above the top line stays inside the panel.
    xs = [*x, 0.0]
    x_span = (max(xs) - min(xs)) or (0.1 if axis.tickformat.endswith("%") else 1.0)
    fig.update_xaxes(
        title_text=axis.title + _not_drawn(options.filter(pl.col(axis.column).is_null()), priced),
        tickformat=axis.tickformat,
        tickprefix=axis.tickprefix,
        range=[min(xs) - 0.08 * x_span, max(xs) + 0.08 * x_span],
        row=row,
        col=3,
    )
    ys = [*y, *(v for v, *_ in lines)]
    pad = 0.15 * ((max(ys) - min(ys)) or max(ys) or 1.0)
    top = max(ys) + pad
    # Down to 0 (a little below, where no tick falls) when the points come near it.
    low = min(ys) - pad if min(ys) - pad > 0 else -0.04 * top
    fig.update_yaxes(title_text="p99 (ms)", range=[low, top], row=row, col=3)


def _option_hover(options: pl.DataFrame, priced: bool) -> tuple[list[str], list[list[str]]]:
    """Per option: its description (escaped: a model's name comes from spans) and, preformatted,
    p99 before, abandoned requests saved a day, extra tokens (a day when the frame has them), extra
    cost a day, extra calls."""
    per_day = "extra_tokens_per_day" in options.columns
    with_cost = "extra_cost_per_day" in options.columns
    texts: list[str] = []
    customdata: list[list[str]] = []
    for r in options.iter_rows(named=True):
        what = OPTION_TEXT.get(r["option"], esc(r["option"]))
        texts.append(f"{what} ({esc(r['parameter'])})<br><i>{esc(r['assumption'])}</i>")
        share, day = r["extra_tokens_ratio"], r["extra_tokens_per_day"] if per_day else None
        if day is not None:
            tokens = f"{day:,.0f}/day ({_fmt(share, '+.1%')} of the calls' tokens)"
        else:
            tokens = (
                "unknown: the calls report none" if share is None else f"{share:+.1%} of the calls' tokens"
            )
        cost = r["extra_cost_per_day"] if with_cost else None
        money = None if cost is None else f"{'-' if cost < 0 else ''}${abs(cost):,.2f}/day"
        delta = r["p99_delta_ms"]
        customdata.append(
            [
                _fmt(None if delta is None else r["p99_ms"] - delta, ",.0f"),
                _fmt(r["abandoned_saved_per_day"], ",.0f", "none (nobody abandoned)"),
                tokens,
                money or ("unknown" if priced else "no price table"),
                _fmt(r["extra_calls_ratio"], "+.1%"),
            ]
        )
    return texts, customdata


def _not_drawn(unpriced: pl.DataFrame, priced: bool) -> str:
    """A second line for the axis title naming the options without a known price (not drawn)."""
    if not unpriced.height:
        return ""
    what = "cost" if priced else "tokens"
    names = [_option_name(o, p) for o, p in zip(unpriced["option"], unpriced["parameter"], strict=True)]
    text = f"not drawn, {what} unknown: {', '.join(names)}"
    if len(text) > 50:
        text = f"{count_of(len(names), 'option')} not drawn: {what} unknown"
    return f"<br><sup>{esc(text)}</sup>"


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
