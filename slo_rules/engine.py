"""Rule evaluation: rules + analysis → alert candidates → lifecycle → transitions → outbox.

:func:`evaluate` is stateless in-process: it reads every alert's last state from the store,
advances it, writes the new state, and enqueues one notification per transition and notifier.
Running it twice for the same instant changes nothing; a restarted process picks up where the
last one stopped.

A rule whose data cannot be computed (an analytics error) is reported in
``EvaluationResult.errors`` and its alerts keep their state: an outage of the analysis never
resolves a firing alert.

The stages: each rule kind turns the analysis into candidates (:mod:`slo_rules.kinds`), the
lifecycle advances every alert (:mod:`slo_rules.lifecycle`), and the transitions become
notifications for every notifier (:mod:`slo_rules.fanout`); Alertmanagers get the snapshot of
every firing and recently resolved alert instead, on every evaluation.

Every alert links to the analysis that raised it: its ``dashboard`` annotation is
``<dashboard_url>/runs/<run_id>/<view>.html``, the run being the analysis its numbers come from,
persisted (``analytics.persist_analysis``) when the alert is notified — on firing and on each
repeat — so the page shows the numbers the message quotes, and still does later. In between, and
while pending, the alert keeps the link it has; the first one is made when it first turns active.
``tailwatch serve`` renders those pages on request from the persisted run.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Literal

import pyarrow as pa

from analytics import Conventions
from slo_rules.fanout import (
    DEFAULT_EVALUATION_INTERVAL,
    alertmanager_items,
    alertmanager_snapshot,
    group_notifications,
    outbox_items,
)
from slo_rules.kinds import Candidate, Context, candidates
from slo_rules.lifecycle import GONE, Changes, advance_alerts
from slo_rules.notifiers import AlertmanagerConfig, Notification, NotifierConfig
from slo_rules.outbox import enqueue
from slo_rules.rules import LatencySloRule, RuleSet
from slo_rules.schema import ALERT_STATE_TABLE, EVALUATIONS_TABLE
from slo_rules.schema import MIGRATIONS as RULES_MIGRATIONS
from slo_rules.source import AnalyticsSource, DataSource, WindowKey
from slo_rules.state import AlertState, Transition, fingerprint, load_states, write_events, write_states
from storage import Store, TailwatchError, as_utc, ensure_schema, format_duration, iso_z, utc_now

__all__ = [
    "DEFAULT_DASHBOARD_URL",
    "EvaluationResult",
    "RuleExplanation",
    "evaluate",
    "evaluate_with",
    "last_evaluation",
]

log = logging.getLogger("tailwatch.slo_rules")

# What `tailwatch serve` serves; alerts link to it unless the caller names another base URL.
DEFAULT_DASHBOARD_URL = "http://127.0.0.1:4318/dashboards"


Verdict = Literal["fired", "firing", "pending", "resolved", "quiet", "skipped", "error"]


@dataclass(frozen=True)
class RuleExplanation:
    """Why one alert of a rule is where it is after an evaluation (``--explain``): ``fired`` or
    ``resolved`` now, still ``firing`` or ``pending``, ``quiet`` (its condition does not hold),
    ``skipped`` (too little data to judge, or nothing the rule selects), ``error`` (the rule could
    not be evaluated). ``reason`` is the condition in numbers; ``labels`` name the alert (empty for
    a rule with nothing to evaluate)."""

    rule: str
    verdict: Verdict
    reason: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def target(self) -> str:
        """What the alert is about: ``service operation``, a queue, a workflow, a flag variant."""
        labels = self.labels
        parts = [labels.get("service", ""), labels.get("operation", "")]
        parts += [labels.get("queue", ""), labels.get("workflow", "")]
        if labels.get("flag"):
            parts.append(f"{labels['flag']}={labels.get('variant', '')}")
        if labels.get("slo_window"):
            parts.append(f"[{labels['slo_window']}]")
        return " ".join(p for p in parts if p)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "verdict": self.verdict,
            "target": self.target,
            "reason": self.reason,
            "labels": dict(self.labels),
        }

    def __str__(self) -> str:
        return f"{self.verdict:<9}{self.rule}  {self.target or '-'}: {self.reason}"


@dataclass
class EvaluationResult:
    """What one evaluation found and did (with ``dry_run``: what it would do; nothing was written,
    persisted or enqueued)."""

    at: datetime
    alerts: list[AlertState] = field(default_factory=list)  # pending and firing after this evaluation
    fired: list[AlertState] = field(default_factory=list)
    resolved: list[AlertState] = field(default_factory=list)
    repeated: list[AlertState] = field(default_factory=list)
    notifications: list[Notification] = field(default_factory=list)
    enqueued: int = 0
    analyses_run: int = 0
    errors: list[str] = field(default_factory=list)
    explanations: list[RuleExplanation] = field(default_factory=list)
    dry_run: bool = False
    would_send: int = 0  # outbox rows the evaluation enqueues (or would, in a dry run)

    @property
    def firing(self) -> list[AlertState]:
        return [a for a in self.alerts if a.state == "firing"]

    def record(self, previous: Mapping[str, AlertState], changes: Changes) -> None:
        """Transitions by kind, and the alerts pending or firing once ``changes`` are written."""
        for state, transition in changes.transitions:
            {"firing": self.fired, "resolved": self.resolved, "repeat": self.repeated}[transition].append(
                state
            )
        current = {s.fingerprint: s for s in previous.values()}
        current.update({s.fingerprint: s for s in changes.states})
        self.alerts = sorted(
            (s for s in current.values() if s.state in ("pending", "firing")),
            key=lambda s: (s.alertname, s.fingerprint),
        )

    def __str__(self) -> str:
        sent = (
            f"{self.would_send} notifications would be enqueued (dry run: nothing changed)"
            if self.dry_run
            else f"{self.enqueued} notifications enqueued"
        )
        text = (
            f"{len(self.firing)} firing, {len(self.alerts) - len(self.firing)} pending; "
            f"{len(self.fired)} fired, {len(self.resolved)} resolved, {len(self.repeated)} repeated; "
            f"{sent}; {self.analyses_run} analyses"
        )
        return text + (f"; {len(self.errors)} rule errors" if self.errors else "")


def evaluate(
    store: Store,
    rules: RuleSet,
    at: datetime | None = None,
    *,
    notifiers: Sequence[NotifierConfig] = (),
    dashboard_url: str | None = None,
    conventions: Conventions | None = None,
    trace_url: str | None = None,
    evaluation_interval: timedelta = DEFAULT_EVALUATION_INTERVAL,
    dashboard_links: bool = True,
    dry_run: bool = False,
) -> EvaluationResult:
    """Evaluate every rule at ``at`` (default now), advance alert state, enqueue notifications.

    ``dry_run``: compute the same transitions and notifications, and write, persist and enqueue
    nothing (the result says what would change and be sent). Every result carries, per alert, why
    it is where it is (:attr:`EvaluationResult.explanations`).

    Alerts link to the analysis behind them under ``dashboard_url`` (default
    :data:`DEFAULT_DASHBOARD_URL`): ``<dashboard_url>/runs/<run_id>/<view>.html``; with
    ``dashboard_links=False`` (no dashboard exists to open) they carry no ``dashboard`` link. With
    ``trace_url`` (a :func:`slo_rules.trace_link` template) they link to their exemplar traces.
    ``evaluation_interval`` is how often the caller evaluates: a firing alert is sent to
    Alertmanager with ``endsAt`` four intervals ahead. Deliver the notifications with
    :func:`slo_rules.deliver`.
    """
    return evaluate_with(
        store,
        rules,
        at or utc_now(),
        AnalyticsSource(store, conventions),
        notifiers=notifiers,
        dashboard_url=dashboard_url,
        trace_url=trace_url,
        evaluation_interval=evaluation_interval,
        dashboard_links=dashboard_links,
        dry_run=dry_run,
    )


def evaluate_with(
    store: Store,
    rules: RuleSet,
    at: datetime,
    source: DataSource,
    *,
    notifiers: Sequence[NotifierConfig] = (),
    dashboard_url: str | None = None,
    trace_url: str | None = None,
    evaluation_interval: timedelta = DEFAULT_EVALUATION_INTERVAL,
    dashboard_links: bool = True,
    dry_run: bool = False,
) -> EvaluationResult:
    """:func:`evaluate` with an explicit data source (tests feed synthetic counts through this).

    A source with a ``run_id(start, end, baseline_start, baseline_end)`` method (as
    :class:`~slo_rules.source.AnalyticsSource`) persists the analyses alerts link to; without one,
    alerts link to the latest views, ``<dashboard_url>/<view>.html``.
    """
    if evaluation_interval <= timedelta(0):
        raise ValueError(f"evaluation_interval must be positive, got {evaluation_interval}")
    # Without dashboards, notifications carry no dashboard URL at all (externalURL is empty too).
    url = (dashboard_url or DEFAULT_DASHBOARD_URL).rstrip("/") if dashboard_links else ""
    ensure_schema(store, RULES_MIGRATIONS)
    previous = load_states(store, rules.names())
    targets = tuple((r.service, r.operation) for r in rules.rules if isinstance(r, LatencySloRule))
    ctx = Context(source, as_utc(at), url or None, trace_url, previous, targets)
    result = EvaluationResult(at=ctx.at, dry_run=dry_run)
    found, failed = _candidates(rules, ctx, result.errors)
    changes = advance_alerts(
        found, previous, ctx.at, repeat_interval=rules.route.repeat_interval, failed=failed
    )
    # Before the outbox: a notification never links to a run that is not persisted yet. A dry run
    # persists nothing, so its alerts carry no link.
    changes = _unlinked(ctx, changes, previous) if dry_run else _link_dashboards(ctx, changes, previous)
    notifications = group_notifications(changes.transitions, rules.route, ctx.at, url)
    items = outbox_items(notifications, notifiers)
    if any(isinstance(c, AlertmanagerConfig) for c in notifiers):
        current = {**previous, **{s.fingerprint: s for s in changes.states}}
        snapshot = alertmanager_snapshot(current.values(), ctx.at, evaluation_interval, url)
        items += alertmanager_items(snapshot, notifiers)
    result.would_send = len(items)
    if not dry_run:
        # Outbox first, then state: a crash in between re-derives the same transition (same id) next
        # time. Rows are stamped with the wall clock, not ``at``: their age (for giving up) is real time.
        result.enqueued = enqueue(store, items)
        write_states(store, changes.states)
        write_events(store, changes.events(ctx.at))
    result.notifications = notifications
    result.record(previous, changes)
    result.explanations = _explanations(rules, ctx, found, failed, result.errors, changes, previous)
    if not dry_run:
        record_evaluation(store, result, len(rules.rules))
    result.analyses_run = int(getattr(source, "analyses_run", 0))
    return result


def record_evaluation(store: Store, result: EvaluationResult, rules: int) -> None:
    """Note the instant an evaluation that changed live state evaluated at (see :func:`last_evaluation`)."""
    store.insert_arrow(
        EVALUATIONS_TABLE,
        pa.table(
            {
                "at": pa.array([result.at], pa.timestamp("ms", tz="UTC")),
                "ran_at": pa.array([utc_now()], pa.timestamp("ms", tz="UTC")),
                "rules": pa.array([rules], pa.uint32()),
                "fired": pa.array([len(result.fired)], pa.uint32()),
                "resolved": pa.array([len(result.resolved)], pa.uint32()),
                "errors": pa.array([len(result.errors)], pa.uint32()),
            }
        ),
    )


def last_evaluation(store: Store) -> datetime | None:
    """The latest instant the rules were evaluated at on this store (not in a dry run), if any: an
    evaluation at an earlier instant would rewind live alert state."""
    latest: list[datetime] = []
    for table, column in ((EVALUATIONS_TABLE, "at"), (ALERT_STATE_TABLE, "updated_at")):
        if store.table_exists(table):
            value = store.query_value(f"SELECT max({column}) FROM {store.table(table)}")
            if isinstance(value, datetime) and value.year > 1970:
                latest.append(as_utc(value))
    return max(latest, default=None)


def _candidates(rules: RuleSet, ctx: Context, errors: list[str]) -> tuple[list[Candidate], dict[str, str]]:
    """Every rule's candidates, and the rules that failed with their errors (also into ``errors``)."""
    found: list[Candidate] = []
    failed: dict[str, str] = {}
    for rule in rules.rules:
        since = ctx.reads
        try:
            found.extend(ctx.explain(c, since) for c in candidates(rule, ctx))
        except TailwatchError as exc:
            failed[rule.name] = str(exc)
            log.warning("rule %s could not be evaluated: %s", rule.name, exc)
        except Exception as exc:
            # A defect in one rule's data path must not stop every other rule (nor resolve its alerts).
            failed[rule.name] = f"{type(exc).__name__}: {exc}"
            log.exception("rule %s could not be evaluated", rule.name)
    errors.extend(f"rule {name}: {message}" for name, message in failed.items())
    return found, failed


def _explanations(
    rules: RuleSet,
    ctx: Context,
    found: Sequence[Candidate],
    failed: Mapping[str, str],
    errors: Sequence[str],
    changes: Changes,
    previous: Mapping[str, AlertState],
) -> list[RuleExplanation]:
    """Per rule, each alert's verdict and reason after ``changes`` (see :class:`RuleExplanation`)."""
    transitions = {state.fingerprint: t for state, t in changes.transitions}
    current = {**previous, **{s.fingerprint: s for s in changes.states}}
    by_rule: dict[str, list[RuleExplanation]] = {}
    seen: set[str] = set()
    for cand in found:
        fp = fingerprint(cand.labels)
        if fp in seen:
            continue
        seen.add(fp)
        state, transition = current.get(fp), transitions.get(fp)
        reason = cand.reason or ("condition holds" if cand.active else "condition does not hold")
        verdict: Verdict
        if transition == "firing":
            verdict = "fired"
        elif transition == "resolved":
            verdict = "resolved"
        elif state is not None and state.state in ("firing", "pending"):
            verdict = state.state
            if state.state == "pending" and cand.rule.for_ is not None and state.active_since is not None:
                reason += (
                    f"; pending since {iso_z(state.active_since)} (for {format_duration(cand.rule.for_)})"
                )
        elif cand.skipped:
            verdict = "skipped"
        else:
            verdict = "quiet"
            if cand.active:
                reason += "; suppressed: a faster burn-rate tier of the same SLO fired"
        by_rule.setdefault(cand.rule.name, []).append(
            RuleExplanation(cand.rule.name, verdict, reason, cand.labels)
        )
    # Alerts that resolved because their rule no longer mentions them at all.
    for state, transition in changes.transitions:
        if transition == "resolved" and state.fingerprint not in seen:
            by_rule.setdefault(state.rule, []).append(
                RuleExplanation(state.rule, "resolved", GONE, state.labels)
            )
    out: list[RuleExplanation] = []
    for rule in rules.rules:
        if rule.name in failed:
            out.append(RuleExplanation(rule.name, "error", failed[rule.name]))
        elif rule.name in by_rule:
            out += by_rule[rule.name]
        else:
            note = ctx.notes.get(rule.name, "nothing its selectors match had data in its window")
            out.append(RuleExplanation(rule.name, "skipped", note))
    return out


def _unlinked(ctx: Context, changes: Changes, previous: Mapping[str, AlertState]) -> Changes:
    """``changes`` with the link stand-ins of a dry run dropped (nothing is persisted to link to)."""
    transitions = {id(state): transition for state, transition in changes.transitions}
    out = Changes()
    for state in changes.states:
        transition = transitions.get(id(state))
        if ctx.bound_link(state.annotations.get("dashboard", "")) is not None:
            notes = {k: v for k, v in state.annotations.items() if k != "dashboard"}
            state = replace(state, annotations=notes)
        out.add(state, transition, previous.get(state.fingerprint))
    return out


def _link_dashboards(ctx: Context, changes: Changes, previous: Mapping[str, AlertState]) -> Changes:
    """The alerts' ``dashboard`` links, from the stand-ins the rule kinds wrote (see the module doc).

    A notified alert (firing, repeat) links to its own analysis, persisted now; an alert that is
    not notified keeps the link it had to the same view, so re-evaluating an instant changes
    nothing and a firing alert does not persist an analysis every evaluation.
    """
    transitions = {id(state): transition for state, transition in changes.transitions}
    out = Changes()
    for state in changes.states:
        transition = transitions.get(id(state))
        prev = previous.get(state.fingerprint)
        bound = ctx.bound_link(state.annotations.get("dashboard", ""))
        if bound is not None:
            state = replace(state, annotations=_linked(ctx, state, bound, transition, prev))
        # Re-added as the lifecycle decides, now that the link is known: an alert whose link stayed
        # and that changed nothing else writes no row.
        out.add(state, transition, prev)
    return out


def _linked(
    ctx: Context,
    state: AlertState,
    bound: tuple[str, WindowKey | None],
    transition: Transition | None,
    prev: AlertState | None,
) -> dict[str, str]:
    """``state``'s annotations with the ``dashboard`` link its stand-in is bound to (or none)."""
    view, key = bound
    annotations = {k: v for k, v in state.annotations.items() if k != "dashboard"}
    link: str | None = None
    if transition not in ("firing", "repeat") and prev is not None and prev.state in ("pending", "firing"):
        # The same episode, not notified now: its link stays (a resolved one's is another episode).
        kept = prev.annotations.get("dashboard")
        link = kept if ctx.run_link(kept, view) else None
    if link is None:
        link = ctx.dashboard_link(view, key)
    if link is not None:
        annotations["dashboard"] = link
    return annotations
