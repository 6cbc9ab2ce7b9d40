"""Dashboards: Plotly views of every tailwatch metric.

Usage::

    from dashboards import build_figures
    figures = build_figures(analysis, alerts)          # {"hot_path": go.Figure, ...}
"""

from __future__ import annotations

from dashboards._analysis import AnalysisFrames
from dashboards.figures import NO_ALERTS_TEXT, VIEW_TITLES, VIEWS, View, build_figures

__all__ = [
    "NO_ALERTS_TEXT",
    "VIEWS",
    "VIEW_TITLES",
    "AnalysisFrames",
    "View",
    "build_figures",
]
