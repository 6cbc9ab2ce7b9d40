"""Alert identity and lifecycle, persisted in the store.

An alert is identified by its labels: ``fingerprint`` = the first 16 hex digits of SHA-256 over the
sorted labels. Its lifecycle is inactive → pending (while a rule's ``for`` has not elapsed) →
firing → resolved. Every change is a new row in ``tailwatch_alert_state`` (newest ``version`` wins)
and, for firing/resolved, a row in ``tailwatch_alert_events``; evaluation reads the state back
from the store each time, so a restarted process neither pages again nor forgets what is firing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import polars as pl
import pyarrow as pa

from slo_rules.outbox import next_version
from slo_rules.schema import ALERT_EVENTS_TABLE, ALERT_STATE_TABLE
from storage import Store, as_utc, iso_z, utc_now

__all__ = [
    "AlertState",
    "Transition",
    "advance",
    "alert_history",
    "fingerprint",
    "list_alerts",
    "load_states",
]

State = Literal["inactive", "pending", "firing", "resolved"]
Transition = Literal["firing", "resolved", "repeat"]

_TS = pa.timestamp("ms", tz="UTC")


def fingerprint(labels: Mapping[str, str]) -> str:
    """Stable identity of an alert: sha256 over the labels sorted by name, 16 hex digits."""
    canonical = json.dumps(sorted(labels.items()), separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class AlertState:
    fingerprint: str
    rule: str
    alertname: str
    severity: str
    state: State
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    active_since: datetime | None = None
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    last_notified_at: datetime | None = None
    updated_at: datetime | None = None

    @property
    def service(self) -> str:
        return self.labels.get("service", "")

    @property
    def cause(self) -> str:
        return self.annotations.get("cause", "")


def advance(
    previous: AlertState | None,
    active: bool,
    at: datetime,
    *,
    for_: timedelta | None,
    repeat_interval: timedelta,
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    rule: str,
    suppressed: bool = False,
    now: str = "",
) -> tuple[AlertState | None, Transition | None]:
    """One evaluation step of one alert: its new state and the transition to notify, if any.

    ``suppressed`` (a faster burn-rate tier of the same SLO is firing) keeps an alert from
    *starting*; one already firing stays firing without repeats.

    A firing alert keeps the annotations it fired with: what on-call was told is never rewritten.
    Later evaluations add to them: ``now`` (the condition in numbers at this evaluation) becomes its
    ``latest`` annotation when it is notified again, and its ``resolved`` annotation when it resolves
    — the numbers that resolved it.
    """
    prev_state: State = previous.state if previous is not None else "inactive"
    if not active or (suppressed and prev_state not in ("firing",)):
        if prev_state == "firing":
            assert previous is not None
            notes = {**previous.annotations, **({"resolved": now} if now else {})}
            return replace(
                previous, state="resolved", ends_at=at, updated_at=at, annotations=notes
            ), "resolved"
        if prev_state == "pending":
            assert previous is not None
            return replace(previous, state="inactive", active_since=None, updated_at=at), None
        return None, None
    base = AlertState(
        fingerprint=fingerprint(labels),
        rule=rule,
        alertname=labels.get("alertname", rule),
        severity=labels.get("severity", ""),
        state="pending",
        labels=dict(labels),
        annotations=dict(annotations),
        updated_at=at,
    )
    if prev_state == "firing":
        assert previous is not None
        last = previous.last_notified_at or previous.starts_at or at
        due = not suppressed and at - last >= repeat_interval
        notes = dict(previous.annotations)
        if due and now:
            notes["latest"] = f"{iso_z(at)}: {now}"
        kept = replace(
            previous,
            annotations=notes,
            updated_at=at,
            last_notified_at=at if due else previous.last_notified_at,
        )
        return kept, ("repeat" if due else None)
    since = previous.active_since if prev_state == "pending" and previous is not None else at
    assert since is not None
    if for_ is not None and at - since < for_:
        return replace(base, state="pending", active_since=since), None
    return (
        replace(base, state="firing", active_since=since, starts_at=since, ends_at=None, last_notified_at=at),
        "firing",
    )


def _latest(store: Store) -> str:
    # The newest version per alert, taken before any filter: a filter applied first could pick an
    # older version of a row whose newest version does not match.
    return f"(SELECT * FROM {store.table(ALERT_STATE_TABLE)} ORDER BY version DESC LIMIT 1 BY fingerprint)"


def load_states(store: Store, rules: Iterable[str] | None = None) -> dict[str, AlertState]:
    """The newest state of every alert (of the named rules), inactive ones included."""
    where = ""
    params: dict[str, Any] = {}
    if rules is not None:
        where = "WHERE rule IN {rules:Array(String)}"
        params["rules"] = sorted(set(rules))
    sql = (
        "SELECT fingerprint, rule, alertname, severity, state, labels, annotations, active_since, "
        f"starts_at, ends_at, last_notified_at, updated_at FROM {_latest(store)} {where}"
    )
    out: dict[str, AlertState] = {}
    for r in store.query_rows(sql, params):
        # DateTime64 columns come back naive in UTC.
        active_since, starts_at, ends_at, last_notified_at, updated_at = (
            as_utc(t) if t is not None else None for t in r[7:12]
        )
        out[r[0]] = AlertState(
            fingerprint=r[0],
            rule=r[1],
            alertname=r[2],
            severity=r[3],
            state=r[4],
            labels=json.loads(r[5]),
            annotations=json.loads(r[6]),
            active_since=active_since,
            starts_at=starts_at,
            ends_at=ends_at,
            last_notified_at=last_notified_at,
            updated_at=updated_at,
        )
    return out


_STATE_SCHEMA = pa.schema(
    [
        ("fingerprint", pa.string()),
        ("rule", pa.string()),
        ("alertname", pa.string()),
        ("severity", pa.string()),
        ("state", pa.string()),
        ("service", pa.string()),
        ("operation", pa.string()),
        ("queue", pa.string()),
        ("workflow", pa.string()),
        ("path", pa.string()),
        ("cause", pa.string()),
        ("summary", pa.string()),
        ("labels", pa.string()),
        ("annotations", pa.string()),
        ("active_since", _TS),
        ("starts_at", _TS),
        ("ends_at", _TS),
        ("last_notified_at", _TS),
        ("updated_at", _TS),
        ("version", pa.uint64()),
    ]
)

_EVENT_SCHEMA = pa.schema(
    [
        ("fingerprint", pa.string()),
        ("rule", pa.string()),
        ("alertname", pa.string()),
        ("severity", pa.string()),
        ("status", pa.string()),
        ("at", _TS),
        ("cause", pa.string()),
        ("service", pa.string()),
        ("operation", pa.string()),
        ("queue", pa.string()),
        ("workflow", pa.string()),
        ("path", pa.string()),
        ("summary", pa.string()),
        ("labels", pa.string()),
        ("annotations", pa.string()),
    ]
)


def _common_columns(state: AlertState) -> dict[str, Any]:
    labels, annotations = state.labels, state.annotations
    return {
        "fingerprint": state.fingerprint,
        "rule": state.rule,
        "alertname": state.alertname,
        "severity": state.severity,
        "service": labels.get("service", ""),
        "operation": labels.get("operation", ""),
        "queue": labels.get("queue", ""),
        "workflow": labels.get("workflow", ""),
        "path": labels.get("path", ""),
        "cause": annotations.get("cause", ""),
        "summary": annotations.get("summary", ""),
        "labels": json.dumps(dict(labels), sort_keys=True, ensure_ascii=False),
        "annotations": json.dumps(dict(annotations), sort_keys=True, ensure_ascii=False),
    }


def write_states(store: Store, states: Sequence[AlertState]) -> None:
    if not states:
        return
    rows = []
    for s in states:
        row = _common_columns(s)
        row.update(
            state=s.state,
            active_since=s.active_since,
            starts_at=s.starts_at,
            ends_at=s.ends_at,
            last_notified_at=s.last_notified_at,
            updated_at=s.updated_at or utc_now(),
            version=next_version(),
        )
        rows.append(row)
    store.insert_arrow(ALERT_STATE_TABLE, pa.Table.from_pylist(rows, schema=_STATE_SCHEMA))


def write_events(
    store: Store, events: Sequence[tuple[AlertState, Literal["firing", "resolved"], datetime]]
) -> None:
    if not events:
        return
    rows = []
    for state, status, at in events:
        row = _common_columns(state)
        row.update(status=status, at=at)
        rows.append(row)
    store.insert_arrow(ALERT_EVENTS_TABLE, pa.Table.from_pylist(rows, schema=_EVENT_SCHEMA))


_LIST_COLUMNS = (
    "fingerprint, alertname, severity, state, service, operation, queue, workflow, path, cause, summary, "
    "labels, annotations, starts_at, ends_at, updated_at"
)


_LIST_SCHEMA: dict[str, Any] = {
    "fingerprint": pl.String,
    "alertname": pl.String,
    "severity": pl.String,
    "state": pl.String,
    "service": pl.String,
    "operation": pl.String,
    "queue": pl.String,
    "workflow": pl.String,
    "path": pl.String,
    "cause": pl.String,
    "summary": pl.String,
    "labels": pl.String,
    "annotations": pl.String,
    "starts_at": pl.Datetime("ms", "UTC"),
    "ends_at": pl.Datetime("ms", "UTC"),
    "updated_at": pl.Datetime("ms", "UTC"),
}
_HISTORY_SCHEMA: dict[str, Any] = {
    "fingerprint": pl.String,
    "alertname": pl.String,
    "status": pl.String,
    "at": pl.Datetime("ms", "UTC"),
    "cause": pl.String,
    "service": pl.String,
    "operation": pl.String,
    "summary": pl.String,
    "severity": pl.String,
    "queue": pl.String,
    "workflow": pl.String,
    "path": pl.String,
}


def list_alerts(store: Store, *, include_resolved_since: datetime | None = None) -> pl.DataFrame:
    """Pending and firing alerts, plus those resolved since the given time; firing first, newest first."""
    if not store.table_exists(ALERT_STATE_TABLE):
        # A store that never evaluated a rule has no alerts (and readers such as the dashboards
        # must not fail on it).
        return pl.DataFrame(schema=_LIST_SCHEMA)
    # Without a cutoff no resolved alert qualifies (ends_at is never in year 2299).
    since = include_resolved_since or datetime(2299, 1, 1, tzinfo=UTC)
    sql = (
        f"SELECT {_LIST_COLUMNS} FROM {_latest(store)} "
        "WHERE state IN ('pending', 'firing') "
        "OR (state = 'resolved' AND ends_at >= {since:DateTime64(3, 'UTC')}) "
        "ORDER BY indexOf(['firing', 'pending', 'resolved'], state), starts_at DESC, fingerprint"
    )
    return store.query_polars(sql, {"since": since})


def alert_history(store: Store, start: datetime, end: datetime) -> pl.DataFrame:
    """Firing and resolved transitions in ``[start, end)``, oldest first (the dashboard timeline)."""
    if not store.table_exists(ALERT_EVENTS_TABLE):
        return pl.DataFrame(schema=_HISTORY_SCHEMA)
    sql = (
        "SELECT fingerprint, alertname, status, at, cause, service, operation, summary, severity, queue, "
        f"workflow, path FROM {store.table(ALERT_EVENTS_TABLE)} FINAL "
        "WHERE at >= {start:DateTime64(3, 'UTC')} AND at < {end:DateTime64(3, 'UTC')} "
        "ORDER BY at, fingerprint, status"
    )
    return store.query_polars(sql, {"start": start, "end": end})
