"""analytics: the hot/cold-path tail metrics and LLM-vs-internal attribution, as Polars jobs over
ClickHouse.

Public surface::

    from analytics import Conventions, Analysis, analyze, latency_good_total
    analysis = analyze(store, start, end)          # baseline: the window of equal length before start
    analysis.hot_path, analysis.attribution, ...   # Polars frames
    analysis.to_dict()                             # the `tailwatch analyze --format json` object
"""

from analytics._common import AnalysisError
from analytics.analysis import FRAME_SCHEMAS, Analysis, analyze
from analytics.conventions import Conventions, ConventionsError, SpanClass, Verdict
from analytics.hot_path import latency_good_total

__all__ = [
    "FRAME_SCHEMAS",
    "Analysis",
    "AnalysisError",
    "Conventions",
    "ConventionsError",
    "SpanClass",
    "Verdict",
    "analyze",
    "latency_good_total",
]
