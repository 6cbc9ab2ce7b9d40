"""Transitions → notifications → outbox items: one notification per group and status, one item per
notifier (PagerDuty, which has no groups: one per alert).

Alertmanager is fed differently, the way Prometheus's rule manager feeds it: not transitions but,
on every evaluation, one item per Alertmanager with every firing alert (``endsAt`` = now + 4 ×
the evaluation interval, so it stays firing while tailwatch keeps re-sending it and expires on
its own if tailwatch stops) and every alert resolved within the resend window (``endsAt`` = its
resolution time, re-sent so that one lost request does not leave it firing until it expires).

Notification ids are derived from what they report (group, status, alerts and their transitions;
for Alertmanager the evaluation time and the alerts), so evaluating the same instant again yields
the same ids and the outbox skips them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from slo_rules.notifiers import (
    AlertmanagerConfig,
    AlertPayload,
    Notification,
    NotifierConfig,
    PagerDutyConfig,
)
from slo_rules.rules import Route
from slo_rules.state import AlertState, Transition

__all__ = [
    "DEFAULT_EVALUATION_INTERVAL",
    "alertmanager_items",
    "alertmanager_snapshot",
    "group_notifications",
    "outbox_items",
    "resend_window",
]

DEFAULT_EVALUATION_INTERVAL = timedelta(seconds=60)
# Prometheus keeps re-sending a resolved alert for 15 minutes (rules/alerting.go resolvedRetention).
RESOLVED_RESEND = timedelta(minutes=15)
# endsAt of a firing alert = now + this many evaluation intervals: two or three lost evaluations or
# requests in a row do not make Alertmanager resolve it (Prometheus uses the same factor).
ENDS_AT_INTERVALS = 4


def group_notifications(
    transitions: Sequence[tuple[AlertState, Transition]], route: Route, at: datetime, url: str
) -> list[Notification]:
    """One notification per group (``route.group_by`` label values) and status."""
    groups: dict[tuple[str, str], list[tuple[AlertState, Transition]]] = {}
    for state, transition in transitions:
        if transition == "resolved" and not route.send_resolved:
            continue
        status = "resolved" if transition == "resolved" else "firing"
        group_labels = {k: state.labels.get(k, "") for k in route.group_by}
        key = "{}:{" + ",".join(f'{k}="{v}"' for k, v in group_labels.items()) + "}"
        groups.setdefault((key, status), []).append((state, transition))
    out: list[Notification] = []
    for (key, status), members in sorted(groups.items()):
        members.sort(key=lambda m: m[0].fingerprint)
        first = members[0][0]
        identity = [
            key,
            status,
            [
                [
                    s.fingerprint,
                    s.starts_at.isoformat() if s.starts_at else "",
                    t,
                    at.isoformat() if t == "repeat" else "",
                ]
                for s, t in members
            ],
        ]
        nid = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:32]
        out.append(
            Notification(
                id=nid,
                status="resolved" if status == "resolved" else "firing",
                group_key=key,
                group_labels={k: first.labels.get(k, "") for k in route.group_by},
                alerts=tuple(_payload(s, status, url) for s, _ in members),
                external_url=url,
                created_at=at,
            )
        )
    return out


def outbox_items(
    notifications: Sequence[Notification], notifiers: Sequence[NotifierConfig]
) -> list[tuple[NotifierConfig, Notification]]:
    """Every notification for every notifier; PagerDuty's split into one per alert. Alertmanagers
    get snapshots instead (:func:`alertmanager_items`)."""
    items: list[tuple[NotifierConfig, Notification]] = []
    for config in notifiers:
        if isinstance(config, AlertmanagerConfig):
            continue
        for notification in notifications:
            if isinstance(config, PagerDutyConfig):
                items.extend((config, single) for single in _split(notification))
            else:
                items.append((config, notification))
    return items


def _payload(state: AlertState, status: str, url: str) -> AlertPayload:
    assert state.starts_at is not None
    return AlertPayload(
        status="resolved" if status == "resolved" else "firing",
        labels=dict(state.labels),
        annotations=dict(state.annotations),
        starts_at=state.starts_at,
        ends_at=state.ends_at if status == "resolved" else None,
        fingerprint=state.fingerprint,
        generator_url=state.annotations.get("dashboard", url),
    )


def _split(notification: Notification) -> list[Notification]:
    """PagerDuty has no groups: one event per alert, each with its own stable id."""
    if len(notification.alerts) == 1:
        return [notification]
    out = []
    for alert in notification.alerts:
        nid = hashlib.sha256(f"{notification.id}:{alert.fingerprint}".encode()).hexdigest()[:32]
        out.append(
            Notification(
                id=nid,
                status=alert.status,
                group_key=notification.group_key,
                group_labels=notification.group_labels,
                alerts=(alert,),
                external_url=notification.external_url,
                created_at=notification.created_at,
            )
        )
    return out


def resend_window(interval: timedelta) -> timedelta:
    """How long a resolved alert is re-sent to Alertmanager: 15 minutes, or 4 intervals when that is
    longer — as long as the last firing request could keep it alive there on its own."""
    return max(RESOLVED_RESEND, ENDS_AT_INTERVALS * interval)


def alertmanager_snapshot(
    current: Iterable[AlertState],
    at: datetime,
    interval: timedelta,
    url: str,
) -> Notification | None:
    """What Alertmanager should know at ``at``; ``None`` when there is nothing to tell it.

    ``current``: every alert's state after this evaluation. Firing alerts
    go with ``endsAt = at + 4 × interval``, alerts resolved within :func:`resend_window` with their
    resolution time. ``cause`` is a label (routes and inhibitions match on it); a firing alert keeps
    the cause it fired with, so its label set is stable until it resolves.
    """
    window = resend_window(interval)
    alerts: list[AlertPayload] = []
    for state in sorted(current, key=lambda s: (s.alertname, s.fingerprint)):
        if state.starts_at is None:
            continue
        if state.state == "firing":
            alerts.append(_am_payload(state, "firing", at + ENDS_AT_INTERVALS * interval, url))
        elif state.state == "resolved" and state.ends_at is not None and at - window < state.ends_at <= at:
            alerts.append(_am_payload(state, "resolved", state.ends_at, url))
    if not alerts:
        return None
    # The same evaluation instant always yields the same snapshot, hence the same id.
    identity = ["alertmanager", at.isoformat(), [a.to_dict() for a in alerts]]
    return Notification(
        id=hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32],
        status="firing" if any(a.status == "firing" for a in alerts) else "resolved",
        group_key="{}",
        group_labels={},
        alerts=tuple(alerts),
        external_url=url,
        created_at=at,
    )


def alertmanager_items(
    snapshot: Notification | None, notifiers: Sequence[NotifierConfig]
) -> list[tuple[NotifierConfig, Notification]]:
    """The snapshot for every Alertmanager (each instance of an HA pair gets its own)."""
    if snapshot is None:
        return []
    return [(c, snapshot) for c in notifiers if isinstance(c, AlertmanagerConfig)]


def _am_payload(state: AlertState, status: str, ends_at: datetime, url: str) -> AlertPayload:
    assert state.starts_at is not None
    labels = dict(state.labels)
    labels["cause"] = state.cause or "none"
    return AlertPayload(
        status="resolved" if status == "resolved" else "firing",
        labels=labels,
        annotations=dict(state.annotations),
        starts_at=state.starts_at,
        ends_at=ends_at,
        fingerprint=state.fingerprint,
        generator_url=state.annotations.get("dashboard", url),
    )
