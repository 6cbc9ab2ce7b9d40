"""Colours, text escaping and the common layout of every dashboard figure.

Plotly renders a subset of HTML in titles, annotations, hover labels, legend entries, tick labels
and table cells. Every string that comes from spans (service, operation, span, queue, workflow,
attribute values) therefore goes through :func:`esc` before it reaches a figure, and is only ever
placed in ``text``/``customdata``/titles — never inside a ``hovertemplate``, where ``%{…}`` in a
span name would be read as a placeholder.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

__all__ = [
    "ALERT_FIRING",
    "ALERT_RESOLVED",
    "BASELINE",
    "BASELINE_BAND",
    "CHEAPEST",
    "CLIFF",
    "INTERNAL",
    "LLM",
    "MODEBAR_PX",
    "PERCENTILE_COLOURS",
    "QUEUE_PROCESSING",
    "QUEUE_WAIT",
    "RELEASE",
    "RELEASE_SIGNIFICANT",
    "SERIES_PALETTE",
    "THIN_BUCKET",
    "esc",
    "esc_all",
    "fmt_window",
    "naive_utc",
    "palette",
]

# LLM vs internal: the same two colours in every view, so the split reads at a glance anywhere.
LLM = "#8e44ad"
INTERNAL = "#2a9d8f"

PERCENTILE_COLOURS = {"p50": "#9ecae1", "p95": "#4292c6", "p99": "#08306b"}
RELEASE = "#7f7f7f"
# The baseline window: a grey band left of the current window and its p99 as a reference line.
BASELINE = "#495057"
BASELINE_BAND = "rgba(108,117,125,0.12)"
RELEASE_SIGNIFICANT = "#e4572e"
CLIFF = "#e4572e"
QUEUE_WAIT = "#f4a261"
QUEUE_PROCESSING = "#264653"
ALERT_FIRING = "#d62728"
ALERT_RESOLVED = "#2ca02c"
REQUESTS = "#b0b0b0"
OBSERVED = "#1d3557"
MODEL = "#a8dadc"
TOKENS = "#e9c46a"
# The what-if option a boundary panel marks: the cheapest one under the budget.
CHEAPEST = "#2ca02c"

# The modebar's height: the legend starts below it.
MODEBAR_PX = 36
# Abandonment buckets with fewer requests than this are greyed: their rate says little.
THIN_BUCKET = "#cfcfcf"

# Per-entity colours (queues, workflows): none of them is the LLM or internal colour.
SERIES_PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#d62728",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
    "#7f7f7f",
    "#393b79",
    "#637939",
)


def palette(index: int) -> str:
    return SERIES_PALETTE[index % len(SERIES_PALETTE)]


def esc(value: Any) -> str:
    """A user string made inert for Plotly's HTML-ish text rendering.

    ``html.escape`` without quote escaping, then quotes as numeric entities: plotly.js decodes
    ``&lt; &gt; &amp;`` and numeric entities back into plain text, but not ``&quot;``.
    """
    text = "" if value is None else str(value)
    return html.escape(text, quote=False).replace('"', "&#34;").replace("'", "&#39;")


def esc_all(values: Iterable[Any]) -> list[str]:
    return [esc(v) for v in values]


def naive_utc(value: datetime) -> datetime:
    """UTC wall time without tzinfo: plotly.js ignores offsets, so every axis is UTC by convention."""
    if value.tzinfo is not None:
        value = value.astimezone(UTC).replace(tzinfo=None)
    return value


def fmt_window(start: datetime, end: datetime) -> str:
    fmt = "%Y-%m-%d %H:%M"
    return f"{naive_utc(start).strftime(fmt)} → {naive_utc(end).strftime(fmt)} UTC"


def base_layout(title: str, subtitle: str, height: int) -> dict[str, Any]:
    """The layout every view shares: white template, title with the window, legend on top."""
    return {
        "template": "plotly_white",
        "title": {"text": f"{title}<br><sup>{subtitle}</sup>", "x": 0.01, "xanchor": "left"},
        "height": height,
        "margin": {"l": 70, "r": 70, "t": 110, "b": 60},
        # In the top margin, right of the title: never over a subplot title or the data; and below
        # the Plotly toolbar (the modebar, ~30 px at the top right), which would otherwise cover it.
        "legend": {
            "orientation": "h",
            "yref": "container",
            "y": 1.0 - MODEBAR_PX / height,
            "yanchor": "top",
            "x": 1.0,
            "xanchor": "right",
        },
        "hovermode": "closest",
        "font": {"family": "Helvetica, Arial, sans-serif", "size": 12},
    }
