"""``p99_regression``: p99 of a hot-path operation against the previous window or the previous release.

``baseline: previous`` reads the analysis' attribution rows (current window vs the one before it);
``baseline: previous_release`` the latest release in the window, p99 after it vs before it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from slo_rules.annotate import fmt_ms
from slo_rules.kinds._common import Candidate, Context, alert_labels, finish, instant
from slo_rules.rules import P99RegressionRule
from storage import format_duration

__all__ = ["candidates"]

# Where the attribution of an alert looks: (start, end, baseline window or None for the default).
AttributionWindow = tuple[datetime, datetime, tuple[datetime, datetime] | None]


def candidates(rule: P99RegressionRule, ctx: Context) -> list[Candidate]:
    if rule.baseline == "previous":
        return _against_previous_window(rule, ctx)
    return _against_previous_release(rule, ctx)


def _against_previous_window(rule: P99RegressionRule, ctx: Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    out: list[Candidate] = []
    for row in analysis.attribution.iter_rows(named=True):
        service, operation = str(row["service"]), str(row["operation"])
        if not rule.selects(service, operation):
            continue
        out.append(
            _candidate(
                rule,
                ctx,
                service,
                operation,
                row.get("baseline_p99_ms"),
                row.get("current_p99_ms"),
                row.get("baseline_requests"),
                row.get("current_requests"),
                (start, end, None),
                "the previous " + format_duration(rule.window),
            )
        )
    return out


def _against_previous_release(rule: P99RegressionRule, ctx: Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for row in analysis.releases.iter_rows(named=True):
        key = (str(row["service"]), str(row["operation"]))
        released = instant(row.get("released_at"))
        if not rule.selects(*key) or released is None or not start <= released < end:
            continue
        if key not in latest or released > latest[key]["released_at"]:
            latest[key] = {**row, "released_at": released}
    out: list[Candidate] = []
    for (service, operation), row in sorted(latest.items()):
        out.append(
            _candidate(
                rule,
                ctx,
                service,
                operation,
                row.get("p99_before_ms"),
                row.get("p99_after_ms"),
                row.get("requests_before"),
                row.get("requests_after"),
                (row["released_at"], end, None),
                f"the release before {row.get('version')}",
            )
        )
    return out


def _candidate(
    rule: P99RegressionRule,
    ctx: Context,
    service: str,
    operation: str,
    base: Any,
    cur: Any,
    n_base: Any,
    n_cur: Any,
    window: AttributionWindow,
    against: str,
) -> Candidate:
    base_f = float(base) if base is not None else None
    cur_f = float(cur) if cur is not None else None
    enough = int(n_base or 0) >= rule.min_requests and int(n_cur or 0) >= rule.min_requests
    active = False
    if enough and base_f is not None and cur_f is not None:
        delta = cur_f - base_f
        active = delta >= rule.min_increase.absolute_ms and delta >= rule.min_increase.relative * base_f
    labels = alert_labels(rule, rule.severity, service=service, operation=operation, path="hot")

    def annotate() -> dict[str, str]:
        attribution = ctx.attribution(window[0], window[1], service, operation, window[2])
        head = f"{service} {operation}: p99 {fmt_ms(base_f)} → {fmt_ms(cur_f)} vs {against}"
        tail = attribution.pop("summary_tail", "")
        if tail:
            # The attribution sentence already states the p99 change; lead with it.
            head = f"{service}: {tail}"
        extra = {
            "baseline": rule.baseline,
            "requests": f"{int(n_base or 0)} → {int(n_cur or 0)}",
            "dashboard": ctx.dashboard("attribution"),
        }
        return finish(extra, head, attribution, rule)

    return Candidate(rule, labels, active, annotate)
