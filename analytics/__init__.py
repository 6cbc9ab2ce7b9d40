"""analytics: the hot/cold-path tail metrics and LLM-vs-internal attribution, as Polars jobs over
ClickHouse.

Public surface::

    from analytics import Conventions, Analysis, analyze, persist_analysis, load_analysis, build_summaries
    analysis = analyze(store, start, end)          # baseline: the window of equal length before start
    analysis.hot_path, analysis.attribution, ...   # Polars frames
    analysis.boundary, analysis.slices             # the hot/cold boundary, slices of a migration
    analysis.llm_anatomy                           # each model's call taken apart, and its cost
    analysis.to_dict()                             # the `tailwatch analyze --format json` object
    drift_report(store, end)                       # architecture drift findings, 14 days by day
    analysis.with_drift(DriftReport.read(store, end))  # the report kept per hour, for JSON and views
    run_id = persist_analysis(store, analysis)     # tailwatch_analysis_* tables
    build_summaries(store)                         # a job: later analyses read the summaries
"""

from analytics._common import AnalysisError
from analytics.analysis import FRAME_SCHEMAS, Analysis, analyze
from analytics.boundary import Recommendation
from analytics.conventions import Conventions, ConventionsError, Price, SpanClass, Verdict
from analytics.drift import DriftFinding, DriftKind, DriftReport, drift_report, stored_drift_report
from analytics.llm_anatomy import LLM_CAUSES, LlmCause
from analytics.persist import latest_analysis, load_analysis, load_run, persist_analysis, runs
from analytics.report import render_table
from analytics.summaries import SummaryBuild, build_summaries, latency_good_total, summary_coverage

__all__ = [
    "FRAME_SCHEMAS",
    "LLM_CAUSES",
    "Analysis",
    "AnalysisError",
    "Conventions",
    "ConventionsError",
    "DriftFinding",
    "DriftKind",
    "DriftReport",
    "LlmCause",
    "Price",
    "Recommendation",
    "SpanClass",
    "SummaryBuild",
    "Verdict",
    "analyze",
    "build_summaries",
    "drift_report",
    "latency_good_total",
    "latest_analysis",
    "load_analysis",
    "load_run",
    "persist_analysis",
    "render_table",
    "runs",
    "stored_drift_report",
    "summary_coverage",
]
