"""Attribution: each operation's p99 change against the baseline, split into LLM and internal time.

Per operation the split and the spans behind it; then the exemplar slow traces and, when there are
LLM spans, per provider and model the rate of calls that failed after their retries (what the user
met), of failed (5xx, timeout) and of 429 attempts, of retries, and the cold-path share.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    axis_refs,
    empty_figure,
    fmt_ms,
    left_out,
    op_label,
    rows_of,
)

__all__ = [
    "EXEMPLARS",
    "NO_BASELINE_TEXT",
    "NO_CHANGE_SHARE",
    "SPANS_TITLE",
    "SPLIT_AXIS_TITLE",
    "SPLIT_TITLE",
    "TOP_SPANS",
    "attribution_figure",
    "split_label",
]

TOP_SPANS: Final = 8
EXEMPLARS: Final = 3
# What the split bars are: not the p99 delta (the headline gives that) but the change in mean time
# per tail trace on the critical path, per class (analytics.attribution).
SPLIT_AXIS_TITLE: Final = "Δ mean critical-path time per tail trace, baseline → current"
SPLIT_TITLE: Final = "LLM vs internal: Δ mean per tail trace"
SPANS_TITLE: Final = "top spans behind the change (Δ ms)"
# A split whose parts are all below this share of the shared scale is drawn as "no change".
NO_CHANGE_SHARE: Final = 0.02
# An operation whose baseline window held no request has nothing to compare with.
NO_BASELINE_TEXT: Final = "no baseline data"
# Pixels of one line of a headline, of the column titles' line, and of a row's x ticks and title.
LINE_PX: Final = 20
COLUMN_TITLE_PX: Final = 26
AXIS_PX: Final = 70
TITLE_TOP_PX: Final = 16
# Alerts named under an operation's headline, one per line.
MAX_ALERT_LINES: Final = 3


def attribution_figure(analysis: Analysis, alerts: pl.DataFrame | None = None) -> go.Figure:
    """Per operation: the p99 delta split into LLM vs internal, the spans behind it, exemplars, signals.

    Two different numbers sit side by side and each says which it is: the operation's headline
    gives the **p99 change** (Δp99, baseline → current p99), the bars the **change in mean
    critical-path time per tail trace** (what the split is measured on; the tail traces are the
    requests at or above each window's p99, so their mean moves by more or less than the p99
    does), with each side's share of the p99 rise when it rose.

    The page around the figure lists the same exemplars as links to the user's trace viewer
    (``dashboards.export``): plotly.js re-encodes the URLs of links drawn inside a figure."""
    attribution = analysis.attribution
    if not attribution.height:
        return empty_figure("attribution", analysis, "no hot-path operation to compare with the baseline")
    ordered = attribution.sort(
        ["delta_ms", "service", "operation"], descending=[True, False, False], nulls_last=True
    )
    ops = list(ordered.select("service", "operation").iter_rows())[:MAX_PANELS]
    signals = analysis.llm_signals
    headlines: list[list[str]] = []
    titles: list[str] = []
    for service, operation in ops:
        a = rows_of(attribution, service, operation).row(0, named=True)
        headlines.append(_headline(a, _alerts_for(alerts, service, operation)))
        titles += [SPLIT_TITLE, SPANS_TITLE]
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
    # Above each chart row, from the top: the operation's headline (one line, and one per alert),
    # then the two column titles; below it the x-axis ticks and title. Each gets its own pixels so
    # no two texts share a line at any page width.
    headline_px = LINE_PX * max(len(h) for h in headlines)
    gap = AXIS_PX + COLUMN_TITLE_PX + headline_px
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
    for i, lines in enumerate(headlines):
        # The operation's headline spans the row, left-aligned, above its two column titles.
        top = fig.layout.annotations[2 * i].y
        fig.add_annotation(
            text="<br>".join(lines),
            xref="paper",
            yref="paper",
            x=0.0,
            y=top,
            xanchor="left",
            yanchor="bottom",
            yshift=COLUMN_TITLE_PX,
            align="left",
            showarrow=False,
            font={"size": 14},
        )
    # One scale for every operation: a change of a millisecond must look like one next to a change
    # of seconds, not fill its own panel.
    split_range = _shared_range(
        [(a["llm_delta_ms"], a["internal_delta_ms"]) for a in ordered.head(len(ops)).iter_rows(named=True)]
    )
    shown_spans = analysis.attribution_spans.filter(
        pl.struct("service", "operation").is_in([{"service": s, "operation": o} for s, o in ops])
    )
    span_range = _shared_range([(d,) for d in shown_spans["delta_ms"].to_list()])
    for row, (service, operation) in enumerate(ops, start=1):
        a = rows_of(attribution, service, operation).row(0, named=True)
        who = [esc(service), esc(operation)]
        rose = a["delta_ms"] is not None and a["delta_ms"] > 0
        for cls, column, colour, share in (
            ("LLM", "llm_delta_ms", style.LLM, a["llm_share"]),
            ("internal", "internal_delta_ms", style.INTERNAL, a["internal_share"]),
        ):
            # The share splits a p99 *rise*; when the p99 did not rise there is nothing to split.
            share_text = f"{share:.0%} of the p99 rise" if rose and share is not None else "p99 did not rise"
            fig.add_trace(
                go.Bar(
                    x=[a[column]],
                    # The numbers are the category label: horizontal, outside the bar, always readable.
                    y=[split_label(cls, a[column], share if rose else None)],
                    orientation="h",
                    name=cls,
                    legendgroup=cls,
                    showlegend=row == 1,
                    marker={"color": colour},
                    customdata=[[*who, cls, share_text]],
                    hovertemplate=(
                        "%{customdata[0]} · %{customdata[1]}<br>%{customdata[2]} time on the critical path "
                        "of the tail traces (at or above p99):<br>%{x:+,.0f} ms per trace, mean, baseline → "
                        "current (not the p99 change)<br>%{customdata[3]}<extra></extra>"
                    ),
                ),
                row=row,
                col=1,
            )
        no_baseline = not a["baseline_requests"]
        if no_baseline or _no_change(a["llm_delta_ms"], a["internal_delta_ms"], split_range):
            xref, yref = axis_refs(fig, row, 1)
            fig.add_annotation(
                text=NO_BASELINE_TEXT if no_baseline else "no change in the tail",
                xref=f"{xref} domain",
                yref=f"{yref} domain",
                x=0.98,
                y=0.5,
                xanchor="right",
                showarrow=False,
                font={"size": 12, "color": "#555"},
            )
        spans = rows_of(analysis.attribution_spans, service, operation)
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
        fig.update_xaxes(
            title_text=SPLIT_AXIS_TITLE, zeroline=True, range=split_range, ticksuffix=" ms", row=row, col=1
        )
        fig.update_xaxes(
            title_text="Δ ms on the critical path", zeroline=True, range=span_range, row=row, col=2
        )
        fig.update_yaxes(type="category", categoryorder="trace", autorange="reversed", row=row, col=1)
        fig.update_yaxes(type="category", categoryorder="trace", row=row, col=2)
    fig.update_layout(barmode="relative")
    fig.add_trace(_exemplar_table(ordered.head(MAX_PANELS)), row=rows + 1, col=1)
    if signals.height:
        fig.add_trace(_signals_table(signals), row=rows + 2, col=1)
    extra = left_out(len(ops), attribution.height, "operations")
    subtitle = (
        f"{style.fmt_window(analysis.start, analysis.end)} vs baseline "
        f"{style.fmt_window(analysis.baseline_start, analysis.baseline_end)}"
    )
    if extra:
        subtitle += f" · {extra}"
    # The first row's headline and column titles sit in the top margin, under the figure's title.
    margin = dict(style.base_layout(VIEW_TITLES["attribution"], subtitle, 1)["margin"])
    margin["t"] += COLUMN_TITLE_PX + headline_px
    height = margin["t"] + margin["b"] + total
    fig.update_layout(**style.base_layout(VIEW_TITLES["attribution"], subtitle, height))
    # The title stays at the top of the taller margin (plotly centres it there by default, down
    # onto the first headline).
    fig.update_layout(
        margin=margin, title={"yref": "container", "y": 1.0 - TITLE_TOP_PX / height, "yanchor": "top"}
    )
    return fig


def split_label(cls: str, delta_ms: float | None, share: float | None) -> str:
    """A split bar's label: its number, what the number is, and its share of the p99 rise (only
    when the p99 rose)."""
    label = f"{cls} {_fmt_delta(delta_ms)} per tail trace"
    return label + (f"<br>{share:.0%} of the p99 rise" if share is not None else "")


def _headline(a: dict[str, Any], fired: list[str]) -> list[str]:
    """The operation's headline lines (escaped): the p99 change and verdict, or that the baseline
    held no request; then one line per alert that names the operation."""
    op = op_label(a["service"], a["operation"])
    if not a["baseline_requests"]:
        lines = [
            f"{op}: {NO_BASELINE_TEXT} (0 requests in the baseline window), "
            f"p99 now {fmt_ms(a['current_p99_ms'])}"
        ]
    else:
        lines = [
            f"{op}: Δp99 {_fmt_delta(a['delta_ms'])} (p99 {fmt_ms(a['baseline_p99_ms'])} → "
            f"{fmt_ms(a['current_p99_ms'])}), verdict <b>{esc(a['verdict'])}</b>"
        ]
    shown = fired[:MAX_ALERT_LINES]
    lines += [f"alert: {f}" for f in shown]
    if len(fired) > len(shown):
        lines[-1] += f"; and {len(fired) - len(shown)} more"
    return lines


def _shared_range(rows: list[tuple[float | None, ...]]) -> list[float]:
    """An x range holding every row's negative parts stacked left and positive parts stacked right."""
    lo = min((sum(min(v or 0.0, 0.0) for v in r) for r in rows), default=0.0)
    hi = max((sum(max(v or 0.0, 0.0) for v in r) for r in rows), default=0.0)
    if hi - lo < 1.0:  # nothing moved anywhere: a ±10 ms axis rather than a zero-width one
        return [-10.0, 10.0]
    pad = 0.08 * (hi - lo)
    return [min(lo, 0.0) - (pad if lo < 0 else 0.0), hi + (pad if hi > 0 else 0.0)]


def _no_change(llm: float | None, internal: float | None, scale: list[float]) -> bool:
    limit = max(1.0, NO_CHANGE_SHARE * (scale[1] - scale[0]))
    return abs(llm or 0.0) < limit and abs(internal or 0.0) < limit


def _fmt_delta(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+,.0f} ms"


def _alerts_for(alerts: pl.DataFrame | None, service: str, operation: str) -> list[str]:
    """The alerts that name this operation, escaped, most recent status of each."""
    if alerts is None or not alerts.height or "service" not in alerts.columns:
        return []
    mine = (
        alerts.filter((pl.col("service") == service) & (pl.col("operation") == operation))
        .sort("at")
        .unique(subset=["fingerprint"], keep="last", maintain_order=True)
    )
    return [
        f"{esc(r['alertname'])} ({esc(r['status'])}, cause {esc(r['cause'] or 'n/a')})"
        for r in mine.iter_rows(named=True)
    ]


def _exemplar_table(attribution: pl.DataFrame) -> go.Table:
    ops = [op_label(s, o) for s, o in zip(attribution["service"], attribution["operation"], strict=True)]
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
        # Runs stored before the failed-attempt rate existed lack it: shown as missing.
        b, c = row.get(f"{name}_baseline"), row.get(f"{name}_current")
        return f"{_pct(b)} → {_pct(c)}"

    rows = list(signals.iter_rows(named=True))
    columns: list[Sequence[str]] = [
        [op_label(r["service"], r["operation"]) for r in rows],
        [f"{esc(r['provider'] or '—')} / {esc(r['model'] or '—')}" for r in rows],
        [pair(r, "error_rate") for r in rows],
        [pair(r, "failed_attempt_rate") for r in rows],
        [pair(r, "throttle_rate") for r in rows],
        [pair(r, "retry_rate") for r in rows],
        [pair(r, "cold_share") for r in rows],
    ]
    return go.Table(
        header={
            "values": [
                "operation",
                "provider / model",
                "failed calls (after retries)",
                "failed attempts (5xx, timeout)",
                "429 attempts",
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
