"""Transitions → notifications → outbox items: one notification per group and status, one item per
notifier (PagerDuty, which has no groups: one per alert).

Notification ids are derived from what they report (group, status, alerts and their transitions),
so evaluating the same instant again yields the same ids and the outbox skips them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from datetime import datetime

from slo_rules.notifiers import AlertPayload, Notification, NotifierConfig, PagerDutyConfig
from slo_rules.rules import Route
from slo_rules.state import AlertState, Transition

__all__ = ["group_notifications", "outbox_items"]


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
    """Every notification for every notifier; PagerDuty's split into one per alert."""
    items: list[tuple[NotifierConfig, Notification]] = []
    for config in notifiers:
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
