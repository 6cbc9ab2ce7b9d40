"""Where rule evaluation gets its numbers: the analytics package, cached per window.

One :func:`~slo_rules.evaluate` call may need the same analysis for several rules (every rule with
``window: 1h`` reads the hour before the evaluation time): :class:`AnalyticsSource` runs
``analytics.analyze`` once per distinct (window, baseline) and ``latency_good_total`` once per
distinct (window, threshold), and remembers the results for the rest of the evaluation.

An alert links to the analysis that raised it: :meth:`AnalyticsSource.run_id` persists one of
those analyses (once) and returns its run id, which the service renders on request.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

import polars as pl

from analytics import (
    Analysis,
    Conventions,
    DriftFinding,
    analyze,
    latency_good_total,
    persist_analysis,
    stored_drift_report,
)
from storage import Store

__all__ = ["AnalyticsSource", "DataSource"]

WindowKey = tuple[datetime, datetime, datetime | None, datetime | None]


# The drift reports read lately (oldest first), shared by the evaluations of one process.
_DRIFT_REPORTS: dict[tuple[object, ...], list[DriftFinding]] = {}
_DRIFT_REPORTS_KEPT = 8


class DataSource(Protocol):
    """What the rules read: an analysis of a window, and good/total counts under a threshold."""

    def analysis(
        self,
        start: datetime,
        end: datetime,
        baseline_start: datetime | None = None,
        baseline_end: datetime | None = None,
    ) -> Analysis: ...

    def good_total(self, start: datetime, end: datetime, threshold_ms: float) -> pl.DataFrame: ...


class AnalyticsSource:
    """The real data: ``analytics.analyze`` and ``analytics.latency_good_total``, memoized."""

    def __init__(self, store: Store, conventions: Conventions | None = None) -> None:
        self.store = store
        self.conventions = conventions
        self._analyses: dict[WindowKey, Analysis] = {}
        self._good_total: dict[tuple[datetime, datetime, float], pl.DataFrame] = {}
        self._run_ids: dict[WindowKey, str] = {}
        # The spans not summarised yet, reduced once for every window of this evaluation.
        self._shared: dict[object, object] = {}

    @property
    def analyses_run(self) -> int:
        return len(self._analyses)

    def analysis(
        self,
        start: datetime,
        end: datetime,
        baseline_start: datetime | None = None,
        baseline_end: datetime | None = None,
    ) -> Analysis:
        key = (start, end, baseline_start, baseline_end)
        if key not in self._analyses:
            # Lazy: a rule reads a few frames of its window's analysis, and only those are computed
            # (from the summaries, where they reach); an alert's link persists all of them.
            self._analyses[key] = analyze(
                self.store,
                start,
                end,
                baseline_start=baseline_start,
                baseline_end=baseline_end,
                conventions=self.conventions,
                lazy=True,
                shared=self._shared,
            )
        return self._analyses[key]

    def good_total(self, start: datetime, end: datetime, threshold_ms: float) -> pl.DataFrame:
        key = (start, end, float(threshold_ms))
        if key not in self._good_total:
            self._good_total[key] = latency_good_total(
                self.store, start, end, threshold_ms, conventions=self.conventions
            )
        return self._good_total[key]

    def drift(
        self, end: datetime, days: int, covered: tuple[tuple[str, str], ...] = ()
    ) -> list[DriftFinding]:
        """The architecture drift report of the ``days`` days before ``end`` (analytics.drift),
        ``covered`` the (service, operation) globs with a latency target.

        The report reads days of raw spans and moves by the day: ``end`` is taken on the hour, and
        the report is read once an hour per store (kept in the store: a cron evaluation every minute
        reads the stored findings), not at every evaluation."""
        end = end.replace(minute=0, second=0, microsecond=0)
        key = (self.store.dsn, end, days, covered, repr(self.conventions))
        if key not in _DRIFT_REPORTS:
            while len(_DRIFT_REPORTS) >= _DRIFT_REPORTS_KEPT:
                del _DRIFT_REPORTS[next(iter(_DRIFT_REPORTS))]
            _DRIFT_REPORTS[key] = stored_drift_report(
                self.store, end, self.conventions, days=days, covered=covered
            )
        return _DRIFT_REPORTS[key]

    def run_id(
        self,
        start: datetime,
        end: datetime,
        baseline_start: datetime | None = None,
        baseline_end: datetime | None = None,
    ) -> str:
        """Persist the analysis of this window (once per evaluation) and return its run id."""
        key = (start, end, baseline_start, baseline_end)
        if key not in self._run_ids:
            analysis = self.analysis(start, end, baseline_start, baseline_end)
            self._run_ids[key] = persist_analysis(self.store, analysis, self.conventions)
        return self._run_ids[key]
