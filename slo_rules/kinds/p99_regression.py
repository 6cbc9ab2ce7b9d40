"""``p99_regression``: p99 of a hot-path operation against the previous window or the previous release.

``baseline: previous`` reads the analysis' attribution rows (current window vs the one before it);
``baseline: previous_release`` the latest release in the window: its own step, p99 of its first
requests vs the requests just before it (``analytics.releases``).

Over an incident's life the baseline does not slide: an alert of ``baseline: previous`` that fires
freezes the baseline it
fired against (its ``baseline_p99_ms``, ``baseline_requests`` and ``baseline_window`` annotations),
later evaluations compare the current p99 with that, and it resolves only once the increase falls
below ``resolve_increase`` (hysteresis; default half of ``min_increase``) — not when the window
before it has filled with the incident itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from slo_rules.annotate import fmt_ms, fmt_pct, signed_ms
from slo_rules.kinds._common import Candidate, Context, alert_labels, finish, instant
from slo_rules.rules import MinIncrease, P99RegressionRule
from slo_rules.state import AlertState
from storage import format_duration, iso_z, parse_time

__all__ = ["candidates"]

# Where the attribution of an alert looks: (start, end, baseline window or None for the default).
AttributionWindow = tuple[datetime, datetime, tuple[datetime, datetime] | None]


@dataclass(frozen=True)
class Side:
    """One side of the comparison: its p99, its requests and the window they are from."""

    p99_ms: float | None
    requests: int
    window: tuple[datetime, datetime] | None


def candidates(rule: P99RegressionRule, ctx: Context) -> list[Candidate]:
    if rule.baseline == "previous":
        return _against_previous_window(rule, ctx)
    return _against_previous_release(rule, ctx)


def _against_previous_window(rule: P99RegressionRule, ctx: Context) -> list[Candidate]:
    start, end = ctx.window(rule.window)
    analysis = ctx.source.analysis(start, end)
    baseline = (
        getattr(analysis, "baseline_start", None) or start - rule.window,
        getattr(analysis, "baseline_end", None) or start,
    )
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
                Side(_float(row.get("baseline_p99_ms")), int(row.get("baseline_requests") or 0), baseline),
                Side(_float(row.get("current_p99_ms")), int(row.get("current_requests") or 0), (start, end)),
                (start, end, None),
                "the previous " + format_duration(rule.window),
            )
        )
    if not out:
        ctx.note(rule, f"no request of a selected operation in the last {format_duration(rule.window)}")
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
        released = row["released_at"]
        step_start, step_end = instant(row.get("step_start")), instant(row.get("step_end"))
        before = (step_start, released) if step_start is not None else None
        # The attribution compares what the step compares: the requests just before the release
        # and its first requests after.
        window: AttributionWindow = (released, step_end or end, before)
        out.append(
            _candidate(
                rule,
                ctx,
                service,
                operation,
                Side(_float(row.get("p99_before_ms")), int(row.get("requests_before") or 0), before),
                Side(
                    _float(row.get("p99_after_ms")),
                    int(row.get("requests_after") or 0),
                    (released, step_end or end),
                ),
                window,
                f"the release before {row.get('version')}",
                own_p99=True,
            )
        )
    if not out:
        ctx.note(rule, f"no release of a selected operation in the last {format_duration(rule.window)}")
    return out


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _frozen(state: AlertState | None) -> Side | None:
    """The baseline a firing alert fired against, from its annotations (``None`` if it has none)."""
    if state is None:
        return None
    notes = state.annotations
    try:
        p99 = float(notes["baseline_p99_ms"])
    except (KeyError, ValueError):
        return None
    requests = notes.get("baseline_requests", "")
    window = None
    if "/" in notes.get("baseline_window", ""):
        lo, hi = notes["baseline_window"].split("/", 1)
        try:
            window = (parse_time(lo), parse_time(hi))
        except ValueError:
            window = None
    return Side(p99, int(requests) if requests.isdigit() else 0, window)


def _holds(increase: MinIncrease, base: float, delta: float) -> bool:
    return delta >= increase.absolute_ms and delta >= increase.relative * base


def _bar(increase: MinIncrease) -> str:
    return f"+{fmt_ms(increase.absolute_ms)} and +{fmt_pct(increase.relative)}"


def _candidate(
    rule: P99RegressionRule,
    ctx: Context,
    service: str,
    operation: str,
    base: Side,
    cur: Side,
    window: AttributionWindow,
    against: str,
    *,
    own_p99: bool = False,
) -> Candidate:
    labels = alert_labels(rule, rule.severity, service=service, operation=operation, path="hot")
    firing = ctx.firing(labels)
    # A release's before side is fixed already; the previous window slides into the incident.
    frozen = _frozen(firing) if rule.baseline == "previous" else None
    if frozen is not None:
        # The baseline of a firing alert is the one it fired against, not the sliding window.
        base = frozen
        when = (
            f" of {iso_z(frozen.window[0])[11:16]}–{iso_z(frozen.window[1])[11:16]}" if frozen.window else ""
        )
        against = f"its baseline{when}, frozen when it fired"
    missing = []
    if base.p99_ms is None or (base.requests == 0 and frozen is None):
        missing.append("no baseline data (0 requests)")
    elif base.requests < rule.min_requests and frozen is None:
        missing.append(f"baseline {base.requests} requests < {rule.min_requests}")
    if cur.p99_ms is None:
        missing.append("no current requests")
    elif cur.requests < rule.min_requests:
        missing.append(f"current {cur.requests} requests < {rule.min_requests}")
    if missing or base.p99_ms is None or cur.p99_ms is None:
        # Too little data to judge: a firing alert stays firing (unknown is not recovered).
        reason = "; ".join(missing) + (" — too few to judge, it stays firing" if firing else "")
        return Candidate(rule, labels, firing is not None, lambda: {}, reason=reason, skipped=True)
    delta = cur.p99_ms - base.p99_ms
    bar = rule.resolve if firing is not None else rule.min_increase
    active = _holds(bar, base.p99_ms, delta)
    ratio = f", {delta / base.p99_ms:+.0%}" if base.p99_ms > 0 else ""
    verb = ("stays firing at" if active else "resolves below") if firing is not None else "fires at"
    reason = (
        f"p99 {fmt_ms(base.p99_ms)} → {fmt_ms(cur.p99_ms)} vs {against} ({signed_ms(delta)}{ratio}, "
        f"{base.requests} → {cur.requests} requests); {verb} {_bar(bar)}"
    )

    def annotate() -> dict[str, str]:
        attribution = ctx.attribution(window[0], window[1], service, operation, window[2])
        head = f"{service} {operation}: p99 {fmt_ms(base.p99_ms)} → {fmt_ms(cur.p99_ms)} vs {against}"
        tail = attribution.get("summary_tail", "")
        if tail and not own_p99:
            # The attribution compares the same windows and already states the p99 change: lead with it.
            head, attribution = (
                f"{service}: {tail}",
                {k: v for k, v in attribution.items() if k != "summary_tail"},
            )
        extra = {
            "baseline": rule.baseline,
            "requests": f"{base.requests} → {cur.requests}",
            "baseline_p99_ms": f"{base.p99_ms:.1f}",
            "baseline_requests": str(base.requests),
            "current_p99_ms": f"{cur.p99_ms:.1f}",
            "dashboard": ctx.dashboard("attribution"),
        }
        if base.window is not None:
            extra["baseline_window"] = f"{iso_z(base.window[0])}/{iso_z(base.window[1])}"
        return finish(extra, head, attribution, rule, own_p99=own_p99)

    return Candidate(rule, labels, active, annotate, reason=reason)
