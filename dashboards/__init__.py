"""Dashboards: Plotly views of every tailwatch metric, exported as self-contained HTML (and PNG).

Usage::

    from dashboards import build_figures, export_dashboards, write_dashboards
    figures = build_figures(analysis, alerts)          # {"hot_path": go.Figure, ...}, pure
    report = export_dashboards(store, Path("out"))     # out/<view>.html + out/index.html
    write_dashboards(analysis, Path("out"))            # the same pages for an analysis in hand

The figures read an ``analytics.Analysis`` and the ``slo_rules.alert_history`` frame; each view is
one module of ``dashboards.views``, and ``dashboards.style`` holds the colours and the escaping.
"""

from __future__ import annotations

from dashboards.export import (
    PLOTLY_JS,
    DashboardError,
    ExportFormat,
    ExportReport,
    PngExportError,
    alerts_in_window,
    check_formats,
    check_window,
    export_dashboards,
    landing_page,
    plotly_js_source,
    with_drift_report,
    write_dashboards,
    write_plotly_js,
)
from dashboards.figures import NO_ALERTS_TEXT, VIEW_TITLES, VIEWS, View, build_figures

__all__ = [
    "NO_ALERTS_TEXT",
    "PLOTLY_JS",
    "VIEWS",
    "VIEW_TITLES",
    "DashboardError",
    "ExportFormat",
    "ExportReport",
    "PngExportError",
    "View",
    "alerts_in_window",
    "build_figures",
    "check_formats",
    "check_window",
    "export_dashboards",
    "landing_page",
    "plotly_js_source",
    "with_drift_report",
    "write_dashboards",
    "write_plotly_js",
]
