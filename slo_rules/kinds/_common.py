"""What every rule kind works with: the evaluation context it reads, the candidates it returns."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from slo_rules.annotate import attribution_annotations
from slo_rules.links import trace_links
from slo_rules.rules import AnyRule
from slo_rules.source import DataSource
from storage import as_utc

__all__ = ["Candidate", "Context", "alert_labels", "finish", "instant"]

log = logging.getLogger("tailwatch.slo_rules")


@dataclass
class Candidate:
    """One alert a rule would raise now (``active``) or is checking (inactive burn-rate tiers).

    ``annotations`` is called only for active candidates: explaining an alert costs an attribution
    analysis, which quiet operations never need.
    """

    rule: AnyRule
    labels: dict[str, str]
    active: bool
    annotations: Callable[[], dict[str, str]]
    # Burn-rate tiers: alerts of one SLO share ``group``; lower ``rank`` is a faster tier.
    group: str = ""
    rank: int = 0
    long_window: timedelta | None = None


class Context:
    """One evaluation: its instant, where the numbers come from, where the dashboards and the
    traces (``trace_url``, a :func:`slo_rules.trace_link` template) are."""

    def __init__(
        self, source: DataSource, at: datetime, dashboard_url: str, trace_url: str | None = None
    ) -> None:
        self.source = source
        self.at = at
        self.dashboard_url = dashboard_url.rstrip("/")
        self.trace_url = trace_url

    def dashboard(self, view: str) -> str:
        return f"{self.dashboard_url}/{view}.html"

    def window(self, length: timedelta) -> tuple[datetime, datetime]:
        return self.at - length, self.at

    def trace_links(self, exemplar_trace_ids: str, start: datetime, end: datetime) -> dict[str, str]:
        """``exemplar_url``/``exemplar_urls`` for the comma-separated ids of traces picked from the
        window ``start``–``end`` (nothing without a trace URL template)."""
        return trace_links(self.trace_url, exemplar_trace_ids.split(","), start, end)

    def attribution(
        self,
        start: datetime,
        end: datetime,
        service: str,
        operation: str,
        baseline: tuple[datetime, datetime] | None,
    ) -> dict[str, str]:
        """The attribution annotations of one operation; a failed analysis is noted, not raised:
        the alert fires on its own condition and only its explanation is missing."""
        try:
            analysis = self.source.analysis(start, end, *(baseline or (None, None)))
        except Exception as exc:
            log.warning("attribution of %s %s failed: %s", service, operation, exc)
            return {"cause": "none", "attribution_error": f"{type(exc).__name__}: {exc}"}
        out = attribution_annotations(analysis, service, operation)
        out.update(self.trace_links(out.get("exemplar_trace_ids", ""), start, end))
        return out


def alert_labels(rule: AnyRule, severity: str, **selector: str) -> dict[str, str]:
    """The alert's identity: name, severity, the non-empty selector values, then the rule's labels."""
    labels = {"alertname": rule.name, "severity": severity}
    labels.update({k: v for k, v in selector.items() if v != ""})
    labels.update(rule.labels)
    return labels


def finish(
    annotations: dict[str, str], summary_head: str, attribution: Mapping[str, str], rule: AnyRule
) -> dict[str, str]:
    """Summary = the rule's own finding, then the attribution sentence; then the rule's extras."""
    out = dict(annotations)
    tail = attribution.get("summary_tail")
    out.update({k: v for k, v in attribution.items() if k != "summary_tail"})
    out.setdefault("cause", "none")
    out["summary"] = f"{summary_head}; {tail}" if tail else summary_head
    if rule.description:
        out.setdefault("description", rule.description)
    out.update(rule.annotations)
    return out


def instant(value: object) -> datetime | None:
    """A timestamp cell of a frame as UTC (naive is UTC); ``None`` when it holds no time."""
    return as_utc(value) if isinstance(value, datetime) else None
