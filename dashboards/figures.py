"""Every dashboard view, built from one analysis (pure: frames in, figures out).

Reading guide, shared by every view: time axes are UTC; latency is in milliseconds on the hot path and
seconds on the cold path; LLM time is always :data:`~dashboards.style.LLM` and internal time
:data:`~dashboards.style.INTERNAL`. Hover text carries the exact numbers behind each mark. Each view
is one module of :mod:`dashboards.views`.
"""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl

from analytics import Analysis
from dashboards.views._common import MAX_PANELS, VIEW_TITLES, VIEWS, View
from dashboards.views.abandonment import abandonment_figure
from dashboards.views.alerts import NO_ALERTS_TEXT, alerts_figure
from dashboards.views.attribution import attribution_figure
from dashboards.views.boundary import boundary_figure
from dashboards.views.cold_path import cold_path_figure
from dashboards.views.drift import drift_figure
from dashboards.views.hot_path import hot_path_figure
from dashboards.views.llm import llm_figure
from dashboards.views.retries import retries_figure

__all__ = [
    "MAX_PANELS",
    "NO_ALERTS_TEXT",
    "VIEWS",
    "VIEW_TITLES",
    "View",
    "abandonment_figure",
    "alerts_figure",
    "attribution_figure",
    "boundary_figure",
    "build_figures",
    "cold_path_figure",
    "drift_figure",
    "hot_path_figure",
    "llm_figure",
    "retries_figure",
]


def build_figures(analysis: Analysis, alerts: pl.DataFrame | None = None) -> dict[str, go.Figure]:
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
        "llm": llm_figure(analysis),
        "boundary": boundary_figure(analysis),
        "drift": drift_figure(analysis),
        "alerts": alerts_figure(analysis, alerts),
    }
