"""What every view shares: the view names and titles, the panel limit, and the figure helpers.

Text drawn from span strings is escaped here (:func:`op_label`, through
:func:`~dashboards.style.esc`); :func:`add_vline` draws the label it is given, escaped by its caller.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final, Literal

import plotly.graph_objects as go
import polars as pl

from analytics import Analysis
from dashboards import style
from dashboards.style import esc, naive_utc

__all__ = [
    "DT_HOVER",
    "MAX_PANELS",
    "ROW_GAP",
    "ROW_HEIGHT",
    "VIEWS",
    "VIEW_TITLES",
    "View",
    "add_hline",
    "add_vline",
    "axis_refs",
    "count_of",
    "empty_figure",
    "fmt_ms",
    "left_out",
    "naive_times",
    "op_label",
    "operations_by",
    "rows_of",
    "window_subtitle",
]

View = Literal[
    "hot_path", "cold_path", "abandonment", "retries", "attribution", "llm", "boundary", "drift", "alerts"
]
VIEWS: Final[tuple[View, ...]] = (
    "hot_path",
    "cold_path",
    "abandonment",
    "retries",
    "attribution",
    "llm",
    "boundary",
    "drift",
    "alerts",
)
VIEW_TITLES: Final[dict[View, str]] = {
    "hot_path": "Hot path: p99 vs release cadence",
    "cold_path": "Cold path: enqueue-to-ready",
    "abandonment": "Abandonment by 500 ms latency bucket",
    "retries": "Retry amplification per hop",
    "attribution": "Regression attribution: LLM vs internal",
    "llm": "LLM calls: first token, generation, tokens, cache and cost",
    "boundary": "Hot/cold boundary: latency budget, model calls, migration slices",
    "drift": "Architecture drift: batch jobs become online services",
    "alerts": "Alerts: firing and resolved",
}

# Panels per view: beyond this many operations/queues/workflows a page stops being readable at a
# glance; the busiest ones are shown and the subtitle says how many were left out.
MAX_PANELS: Final = 8

ROW_HEIGHT: Final = 320  # pixels per operation panel, gap included
ROW_GAP: Final = 95
DT_HOVER: Final = "%{x|%Y-%m-%d %H:%M} UTC"


def window_subtitle(analysis: Analysis, extra: str = "") -> str:
    text = style.fmt_window(analysis.start, analysis.end)
    return f"{text} · {extra}" if extra else text


def empty_figure(view: View, analysis: Analysis, message: str) -> go.Figure:
    """A figure that says plainly there is nothing to draw, rather than an empty grid."""
    fig = go.Figure()
    fig.update_layout(**style.base_layout(VIEW_TITLES[view], window_subtitle(analysis), 360))
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


def axis_refs(fig: go.Figure, row: int, col: int, secondary_y: bool = False) -> tuple[str, str]:
    """Axis references (``x3``, ``y5``) of a subplot, for shapes and annotations."""
    subplot = fig.get_subplot(row, col, secondary_y=secondary_y)
    return (
        subplot.xaxis.plotly_name.replace("axis", ""),
        subplot.yaxis.plotly_name.replace("axis", ""),
    )


def add_vline(
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
    xref, yref = axis_refs(fig, row, col)
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


def add_hline(
    fig: go.Figure,
    row: int,
    col: int,
    y: float,
    label: str,
    colour: str,
    *,
    dash: str = "dot",
    label_above: bool = True,
) -> None:
    """A horizontal marker across the full width of one subplot, its (already escaped) label at the
    right end, above the line or below it."""
    xref, yref = axis_refs(fig, row, col)
    fig.add_shape(
        type="line",
        xref=f"{xref} domain",
        yref=yref,
        x0=0,
        x1=1,
        y0=y,
        y1=y,
        line={"color": colour, "width": 1.5, "dash": dash},
    )
    fig.add_annotation(
        x=1.0,
        y=y,
        xref=f"{xref} domain",
        yref=yref,
        text=label,
        showarrow=False,
        xanchor="right",
        yanchor="bottom" if label_above else "top",
        font={"size": 10, "color": colour},
        bgcolor="rgba(255,255,255,0.7)",
    )


def naive_times(frame: pl.DataFrame, column: str) -> list[datetime]:
    return [naive_utc(v) for v in frame[column].to_list()]


def operations_by(frame: pl.DataFrame, order_by: str) -> list[tuple[str, str]]:
    ordered = frame.sort([order_by, "service", "operation"], descending=[True, False, False])
    return list(ordered.select("service", "operation").unique(maintain_order=True).iter_rows())


def rows_of(frame: pl.DataFrame, service: str, operation: str) -> pl.DataFrame:
    return frame.filter((pl.col("service") == service) & (pl.col("operation") == operation))


def op_label(service: str, operation: str) -> str:
    return f"{esc(service)} · {esc(operation)}"


def count_of(n: int, noun: str, plural: str | None = None) -> str:
    """``1 queue``, ``2 queues``: the noun agrees with the number."""
    return f"{n:,} {noun if n == 1 else plural or noun + 's'}"


def left_out(shown: int, total: int, what: str) -> str:
    return f"busiest {shown} of {total} {what}" if total > shown else ""


def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f} ms"
