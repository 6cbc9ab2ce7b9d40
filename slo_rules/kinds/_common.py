"""What every rule kind works with: the evaluation context it reads, the candidates it returns."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import polars as pl

from analytics import Analysis, DriftFinding
from slo_rules.annotate import attribution_annotations
from slo_rules.links import trace_links
from slo_rules.rules import AnyRule
from slo_rules.source import DataSource, WindowKey
from slo_rules.state import AlertState, fingerprint
from storage import as_utc

__all__ = ["Candidate", "Context", "alert_labels", "finish", "instant"]

log = logging.getLogger("tailwatch.slo_rules")


@dataclass
class Candidate:
    """One alert a rule would raise now (``active``) or is checking (inactive burn-rate tiers).

    ``annotations`` is called only for an alert that starts firing: explaining an alert costs an
    attribution analysis, which quiet operations never need, and a firing alert keeps the
    explanation it fired with. ``reason`` is the condition in numbers, cheap to say for every
    candidate (what ``alerts evaluate --explain`` prints, and what a resolved alert quotes);
    ``skipped``: the rule could not judge (too few requests, no baseline), which ``reason`` says.
    """

    rule: AnyRule
    labels: dict[str, str]
    active: bool
    annotations: Callable[[], dict[str, str]]
    # Burn-rate tiers: alerts of one SLO share ``group``; lower ``rank`` is a faster tier.
    group: str = ""
    rank: int = 0
    long_window: timedelta | None = None
    reason: str = ""
    skipped: bool = False


# What ``Context.dashboard`` hands a rule kind, and what the explained annotations carry until the
# engine has decided which analysis run the link opens (slo_rules.engine); never stored or sent.
_VIEW_STAND_IN = "tailwatch-dashboard-view:"
_LINK_STAND_IN = "tailwatch-dashboard-link:"


class _Reads:
    """The evaluation's data source, noting every analysis window read, in order: an alert's link
    opens one of the analyses its rule and its explanation read."""

    def __init__(self, inner: DataSource) -> None:
        self.inner = inner
        self.keys: list[WindowKey] = []

    def analysis(
        self,
        start: datetime,
        end: datetime,
        baseline_start: datetime | None = None,
        baseline_end: datetime | None = None,
    ) -> Analysis:
        analysis = self.inner.analysis(start, end, baseline_start, baseline_end)
        self.keys.append((start, end, baseline_start, baseline_end))
        return analysis

    def good_total(self, start: datetime, end: datetime, threshold_ms: float) -> pl.DataFrame:
        return self.inner.good_total(start, end, threshold_ms)

    def drift(
        self, end: datetime, days: int, covered: tuple[tuple[str, str], ...] = ()
    ) -> list[DriftFinding] | None:
        """The drift report, or ``None`` from a data source that has none (a test's fixed frames)."""
        read = getattr(self.inner, "drift", None)
        return None if read is None else list(read(end, days, covered))


class Context:
    """One evaluation: its instant, where the numbers come from, where the dashboards and the
    traces (``trace_url``, a :func:`slo_rules.trace_link` template) are.

    ``dashboard_url`` ``None``: no dashboard exists to open, and alerts carry no ``dashboard`` link.
    """

    def __init__(
        self,
        source: DataSource,
        at: datetime,
        dashboard_url: str | None,
        trace_url: str | None = None,
        previous: Mapping[str, AlertState] | None = None,
        latency_targets: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self._reads = _Reads(source)
        # (service glob, operation glob) of the rule set's latency_slo rules: the hot operations
        # with a latency target (architecture_drift's no_latency_target).
        self.latency_targets = latency_targets
        self.source: DataSource = self._reads
        self.at = at
        self.dashboard_url = dashboard_url.rstrip("/") if dashboard_url else None
        self.trace_url = trace_url
        self._links: list[tuple[str, WindowKey | None]] = []
        # Every alert's state before this evaluation: a firing alert's frozen baseline lives there.
        self.previous: Mapping[str, AlertState] = previous or {}
        # Why a rule raised no candidate at all (rule name → sentence), for ``--explain``.
        self.notes: dict[str, str] = {}

    def drift(self, days: int) -> list[DriftFinding] | None:
        """The drift report of the ``days`` days before this evaluation, the rule set's latency
        targets as covered; ``None`` from a data source without one."""
        return self._reads.drift(self.at, days, self.latency_targets)

    def firing(self, labels: Mapping[str, str]) -> AlertState | None:
        """The alert with these labels when it was firing before this evaluation, else ``None``."""
        state = self.previous.get(fingerprint(labels))
        return state if state is not None and state.state == "firing" else None

    def note(self, rule: AnyRule, reason: str) -> None:
        """Say why ``rule`` has nothing to evaluate now (no operation in its window, say)."""
        self.notes[rule.name] = reason

    def dashboard(self, view: str) -> str:
        """The ``dashboard`` annotation of the alert being explained: a stand-in that
        :meth:`explain` binds to the analysis behind the alert and the engine turns into
        ``<dashboard_url>/runs/<run_id>/<view>.html`` (:meth:`dashboard_link`), or drops."""
        return f"{_VIEW_STAND_IN}{view}"

    @property
    def reads(self) -> int:
        """How many analyses were read so far (mark before a rule runs, see :meth:`explain`)."""
        return len(self._reads.keys)

    def explain(self, candidate: Candidate, since: int) -> Candidate:
        """``candidate`` with its dashboard link bound to the analysis behind its numbers.

        ``since``: :attr:`reads` before its rule ran. The attribution view opens the analysis the
        explanation read last (the attribution the summary quotes), other views the rule's own
        first analysis (the window the condition was checked over).
        """
        rule_reads = self._reads.keys[since:]
        explain = candidate.annotations

        def annotations() -> dict[str, str]:
            mark = len(self._reads.keys)
            out = explain()
            value = out.get("dashboard", "")
            if value.startswith(_VIEW_STAND_IN):
                view = value[len(_VIEW_STAND_IN) :]
                own = self._reads.keys[mark:][-1:]
                first = rule_reads[:1]
                keys = own + first if view == "attribution" else first + own
                self._links.append((view, keys[0] if keys else None))
                out["dashboard"] = f"{_LINK_STAND_IN}{len(self._links) - 1}"
            return out

        return replace(candidate, annotations=annotations)

    def bound_link(self, value: str) -> tuple[str, WindowKey | None] | None:
        """(view, analysis window) of a stand-in from :meth:`explain`; ``None`` for any other value."""
        if value.startswith(_LINK_STAND_IN):
            return self._links[int(value[len(_LINK_STAND_IN) :])]
        if value.startswith(_VIEW_STAND_IN):  # a kind that explained outside ``explain``
            return value[len(_VIEW_STAND_IN) :], None
        return None

    def dashboard_link(self, view: str, key: WindowKey | None) -> str | None:
        """The URL of ``view`` of the analysis of window ``key``, persisted now so the link opens
        the same numbers later; ``None`` without dashboards or when it cannot be persisted.

        A data source that keeps no history (no ``run_id``, as in tests) links to the latest views.
        """
        if self.dashboard_url is None:
            return None
        persist = getattr(self._reads.inner, "run_id", None)
        if key is None or not callable(persist):
            return f"{self.dashboard_url}/{view}.html"
        try:
            run_id = persist(*key)
        except Exception as exc:
            # The alert still goes out, without a link rather than with one to the wrong numbers.
            log.warning("the analysis behind a %s link could not be persisted: %s", view, exc)
            return None
        return f"{self.dashboard_url}/runs/{run_id}/{view}.html"

    def run_link(self, value: str | None, view: str) -> bool:
        """Whether ``value`` is a link this context would make to ``view`` of some analysis run."""
        return (
            self.dashboard_url is not None
            and bool(value)
            and str(value).startswith(f"{self.dashboard_url}/runs/")
            and str(value).endswith(f"/{view}.html")
        )

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
    annotations: dict[str, str],
    summary_head: str,
    attribution: Mapping[str, str],
    rule: AnyRule,
    *,
    own_p99: bool = False,
) -> dict[str, str]:
    """Summary = the rule's own finding, then the attribution sentence; then the rule's extras.

    ``own_p99``: the finding states its own p99 figures, so only the cause of the attribution
    follows (one alert sentence never quotes two different "before" values). The rule's own
    figures in ``annotations`` win over the attribution's of the same name."""
    tail = attribution.get("summary_cause" if own_p99 else "summary_tail")
    out = {k: v for k, v in attribution.items() if k not in ("summary_tail", "summary_cause")}
    out.update(annotations)
    out.setdefault("cause", "none")
    out["summary"] = f"{summary_head}; {tail}" if tail else summary_head
    if rule.description:
        out.setdefault("description", rule.description)
    out.update(rule.annotations)
    return out


def instant(value: object) -> datetime | None:
    """A timestamp cell of a frame as UTC (naive is UTC); ``None`` when it holds no time."""
    return as_utc(value) if isinstance(value, datetime) else None
