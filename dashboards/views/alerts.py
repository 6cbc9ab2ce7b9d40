"""Alerts: one line per alert, its firing intervals, firing and resolved marks, the cause on hover."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

import plotly.graph_objects as go
import polars as pl

from analytics import Analysis
from dashboards import style
from dashboards.style import esc, naive_utc
from dashboards.views._common import DT_HOVER, VIEW_TITLES, count_of, empty_figure, window_subtitle

__all__ = ["NO_ALERTS_TEXT", "alerts_figure"]

NO_ALERTS_TEXT: Final = "no alerts in this window"


def alerts_figure(analysis: Analysis, alerts: pl.DataFrame | None) -> go.Figure:
    """Each alert on its own line: firing intervals, firing and resolved marks, the cause on hover."""
    if alerts is None or not alerts.height:
        return empty_figure("alerts", analysis, NO_ALERTS_TEXT)
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
        + DT_HOVER
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
            window_subtitle(
                analysis,
                f"{count_of(len(lanes), 'alert')}, {n_firing} firing and "
                f"{count_of(n_resolved, 'resolved transition')}",
            ),
            220 + 48 * len(lanes),
        )
    )
    return fig
