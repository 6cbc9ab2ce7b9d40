"""Dashboards: Plotly views of every tailwatch metric, exported as self-contained HTML (and PNG).

Usage::

    from dashboards import build_figures, export_dashboards
    figures = build_figures(analysis, alerts)          # {"hot_path": go.Figure, ...}
    report = export_dashboards(store, Path("out"))     # out/<view>.html + out/index.html
"""

from __future__ import annotations

from dashboards._analysis import AnalysisFrames
from dashboards.export import (
    DashboardError,
    ExportFormat,
    ExportReport,
    PngExportError,
    export_dashboards,
    write_dashboards,
)
from dashboards.figures import NO_ALERTS_TEXT, VIEW_TITLES, VIEWS, View, build_figures

__all__ = [
    "NO_ALERTS_TEXT",
    "VIEWS",
    "VIEW_TITLES",
    "AnalysisFrames",
    "DashboardError",
    "ExportFormat",
    "ExportReport",
    "PngExportError",
    "View",
    "build_figures",
    "export_dashboards",
    "write_dashboards",
]
