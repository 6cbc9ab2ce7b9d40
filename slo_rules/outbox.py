"""The durable outbox: one row per (notification, notifier), drained by :func:`deliver`.

Delivery semantics (also in docs/alerting.md):

- :func:`enqueue` runs inside rule evaluation; a notification exists in the store before anyone
  tries to send it, so a receiver that is down, or a process that dies, loses nothing.
- :func:`deliver` sends what is due in creation order and records each 2xx *immediately* as
  ``delivered``. A crash between the receiver's 2xx and that record means the notification is
  sent once more after the restart, with the same ``Idempotency-Key``: receivers that keep the
  keys they have seen (for at least a day) see every transition exactly once.
- Failures (429, 5xx, network) are retried with exponential backoff and jitter, never earlier than
  a ``Retry-After``; other 4xx answers and notifications older than ``max_age`` become ``dead``.
- Alertmanager items are snapshots (every alert it should know at one evaluation, re-posted each
  evaluation; Alertmanager deduplicates by label set). An undelivered snapshot that a newer one
  for the same notifier follows is ``superseded``: the newer one says everything it said, with
  fresher ``endsAt``. So a notifier that is down is retried once per evaluation with the newest
  snapshot, and the backoff paces the retries of one snapshot between evaluations.

Rows are never updated: each change inserts a newer version (ReplacingMergeTree), and readers take
the newest row per (notifier, id).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pyarrow as pa
from prometheus_client import CollectorRegistry

from slo_rules.metrics import DeliveryMetrics, delivery_metrics
from slo_rules.notifiers import DeliveryResult, Notification, Notifier, NotifierConfig, build_notifier
from slo_rules.schema import MIGRATIONS, OUTBOX_TABLE
from storage import Store, TailwatchError, as_utc, ensure_schema, utc_now

__all__ = [
    "SNAPSHOT_KINDS",
    "DeliveryReport",
    "NotifierStatus",
    "OutboxRow",
    "deliver",
    "delivery_status",
    "enqueue",
    "outbox_rows",
]

OutboxStatus = Literal["pending", "delivered", "dead", "superseded"]
# Notifier kinds whose every item is a full snapshot, replacing the ones before it.
SNAPSHOT_KINDS = frozenset({"alertmanager"})

log = logging.getLogger("tailwatch.slo_rules")

_TS = pa.timestamp("ms", tz="UTC")
_OUTBOX_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("notifier", pa.string()),
        ("notifier_kind", pa.string()),
        ("status", pa.string()),
        ("created_at", _TS),
        ("attempts", pa.uint32()),
        ("next_attempt_at", _TS),
        ("delivered_at", _TS),
        ("last_error", pa.string()),
        ("notification", pa.string()),
        ("version", pa.uint64()),
    ]
)

_last_version = 0
_version_lock = threading.Lock()


def next_version() -> int:
    """A strictly increasing version (ns clock), so the newest insert always wins the merge."""
    global _last_version
    with _version_lock:
        _last_version = max(time.time_ns(), _last_version + 1)
        return _last_version


@dataclass(frozen=True)
class OutboxRow:
    id: str
    notifier: str
    notifier_kind: str
    status: OutboxStatus
    created_at: datetime
    attempts: int
    next_attempt_at: datetime
    delivered_at: datetime | None
    last_error: str
    notification: str
    version: int

    def replace(self, **changes: Any) -> OutboxRow:
        values = {**self.__dict__, **changes, "version": next_version()}
        return OutboxRow(**values)


@dataclass
class DeliveryReport:
    """What one drain did, and what is still waiting (``undelivered``: pending or dead rows)."""

    attempted: int = 0
    delivered: int = 0
    retrying: int = 0
    dead: int = 0
    superseded: int = 0
    unconfigured: int = 0
    undelivered: list[OutboxRow] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # Notifiers that pending rows were queued for and this drain was not given: name -> kind.
    unconfigured_notifiers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.undelivered

    def reason(self, row: OutboxRow) -> str:
        """Why ``row`` is still undelivered, in one phrase."""
        if row.notifier in self.unconfigured_notifiers:
            return f"not attempted: no {row.notifier_kind} notifier named {row.notifier!r} is configured"
        if row.status == "dead":
            return f"dead after {row.attempts} attempts: {row.last_error}".rstrip(": ")
        if row.attempts == 0:
            return f"not attempted yet, due at {row.next_attempt_at.strftime('%Y-%m-%dT%H:%M:%SZ')}"
        when = row.next_attempt_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"{row.attempts} failed attempts, retry at {when}: {row.last_error}".rstrip(": ")

    def __str__(self) -> str:
        text = (
            f"{self.attempted} attempted, {self.delivered} delivered, {self.retrying} to retry, "
            f"{self.dead} dead, {len(self.undelivered)} undelivered"
        )
        if self.unconfigured:
            text += f" ({self.unconfigured} for notifiers not configured here)"
        return text + (f", {self.superseded} superseded" if self.superseded else "")


def _write(store: Store, rows: Sequence[OutboxRow]) -> None:
    if not rows:
        return
    columns: dict[str, list[Any]] = {name: [] for name in _OUTBOX_SCHEMA.names}
    for row in rows:
        for name in _OUTBOX_SCHEMA.names:
            columns[name].append(getattr(row, name))
    store.insert_arrow(OUTBOX_TABLE, pa.Table.from_pydict(columns, schema=_OUTBOX_SCHEMA))


def outbox_rows(
    store: Store, *, status: OutboxStatus | None = None, notifier: str | None = None
) -> list[OutboxRow]:
    """The newest version of every outbox row, optionally filtered, oldest first."""
    where = ["1"]
    params: dict[str, Any] = {}
    if not store.table_exists(OUTBOX_TABLE):
        return []
    if status is not None:
        where.append("status = {status:String}")
        params["status"] = status
    if notifier is not None:
        where.append("notifier = {notifier:String}")
        params["notifier"] = notifier
    # LIMIT 1 BY inside the subquery picks the newest version before the filter runs (a filter
    # pushed below it would resurrect older versions of a row).
    sql = (
        "SELECT id, notifier, notifier_kind, status, created_at, attempts, next_attempt_at, delivered_at, "
        "last_error, notification, version FROM ("
        f"SELECT * FROM {store.table(OUTBOX_TABLE)} ORDER BY version DESC LIMIT 1 BY notifier, id"
        f") WHERE {' AND '.join(where)} ORDER BY created_at, id"
    )
    out = []
    for r in store.query_rows(sql, params):
        out.append(
            OutboxRow(
                id=r[0],
                notifier=r[1],
                notifier_kind=r[2],
                status=r[3],
                created_at=as_utc(r[4]),
                attempts=int(r[5]),
                next_attempt_at=as_utc(r[6]),
                delivered_at=as_utc(r[7]) if r[7] is not None else None,
                last_error=r[8],
                notification=r[9],
                version=int(r[10]),
            )
        )
    return out


def enqueue(
    store: Store, items: Sequence[tuple[NotifierConfig, Notification]], *, now: datetime | None = None
) -> int:
    """Record notifications to send. Ids already in the outbox for that notifier are skipped."""
    if not items:
        return 0
    moment = as_utc(now or utc_now())
    ids = sorted({n.id for _, n in items})
    existing = {
        (r[0], r[1])
        for r in store.query_rows(
            f"SELECT DISTINCT notifier, id FROM {store.table(OUTBOX_TABLE)} "
            "WHERE id IN {ids:Array(String)}",
            {"ids": ids},
        )
    }
    rows = []
    for config, notification in items:
        if (config.name, notification.id) in existing:
            continue
        existing.add((config.name, notification.id))
        rows.append(
            OutboxRow(
                id=notification.id,
                notifier=config.name,
                notifier_kind=config.kind,
                status="pending",
                created_at=moment,
                attempts=0,
                next_attempt_at=moment,
                delivered_at=None,
                last_error="",
                notification=notification.to_json(),
                version=next_version(),
            )
        )
    _write(store, rows)
    return len(rows)


def backoff(attempts: int, *, base_s: float = 5.0, cap_s: float = 300.0) -> float:
    """Seconds before the next outbox attempt: 5 s, 10 s, 20 s … capped at 5 min, jittered down by ≤ 50%."""
    ceiling = min(cap_s, base_s * 2 ** max(0, attempts - 1))
    return random.uniform(ceiling / 2, ceiling)


def deliver(
    store: Store,
    notifiers: Sequence[NotifierConfig],
    *,
    force: bool = False,
    now: datetime | None = None,
    max_age: timedelta = timedelta(hours=24),
    notifier_factory: Callable[[NotifierConfig], Notifier] | None = None,
    registry: CollectorRegistry | None = None,
) -> DeliveryReport:
    """Send every due notification (``force``: every pending one, whatever its backoff).

    Without ``force``, a notifier that fails with a retryable error is skipped for the rest of
    this drain (its later notifications keep their order and are tried on the next drain).
    With ``registry``, the outcomes are counted there (:class:`slo_rules.metrics.DeliveryMetrics`).
    """
    ensure_schema(store, MIGRATIONS)
    moment = as_utc(now or utc_now())
    report = DeliveryReport()
    metrics = delivery_metrics(registry) if registry is not None else None
    configs = {c.name: c for c in notifiers}
    built: dict[str, Notifier] = {}
    broken: set[str] = set()
    try:
        for row in _supersede(store, outbox_rows(store, status="pending"), report, metrics):
            if row.notifier not in configs:
                # Queued by an evaluation that had this notifier (the service's configuration, or
                # an earlier command's --webhook); it stays pending until a drain that has it.
                report.unconfigured += 1
                report.unconfigured_notifiers[row.notifier] = row.notifier_kind
                report.undelivered.append(row)
                continue
            if row.notifier in broken or (not force and row.next_attempt_at > moment):
                report.undelivered.append(row)
                continue
            if row.notifier not in built:
                factory = notifier_factory or build_notifier
                try:
                    built[row.notifier] = factory(configs[row.notifier])
                except TailwatchError as exc:
                    # A misconfigured notifier (its secret variable unset) holds back only its own
                    # rows, which stay pending until the configuration is fixed.
                    report.errors.append(str(exc))
                    log.error("notifier %s cannot send: %s", row.notifier, exc)
                    broken.add(row.notifier)
                    report.undelivered.append(row)
                    continue
            report.attempted += 1
            result = _send(built[row.notifier], row)
            updated = _after_send(row, result, moment, max_age)
            _write(store, [updated])
            if metrics is not None:
                _count(metrics, updated, result)
            if updated.status == "delivered":
                report.delivered += 1
                continue
            report.undelivered.append(updated)
            if updated.status == "dead":
                report.dead += 1
            else:
                report.retrying += 1
                if not force:
                    broken.add(row.notifier)
    finally:
        for notifier in built.values():
            close = getattr(notifier, "close", None)
            if close is not None:
                close()
    if metrics is not None:
        waiting: dict[tuple[str, str], int] = {(c.name, c.kind): 0 for c in notifiers}
        for row in report.undelivered:
            if row.status == "pending":
                key = (row.notifier, row.notifier_kind)
                waiting[key] = waiting.get(key, 0) + 1
        for (name, kind), count in waiting.items():
            metrics.pending.labels(name, kind).set(count)
    return report


def _supersede(
    store: Store, rows: list[OutboxRow], report: DeliveryReport, metrics: DeliveryMetrics | None
) -> list[OutboxRow]:
    """The pending rows to consider: of a snapshot notifier's, only the newest.

    The older ones are marked ``superseded`` (their bodies dropped: a snapshot is re-derived every
    evaluation, so only its delivery record is worth keeping) and never sent.
    """
    newest: dict[str, OutboxRow] = {}
    for row in rows:  # oldest first
        if row.notifier_kind in SNAPSHOT_KINDS:
            newest[row.notifier] = row
    kept: list[OutboxRow] = []
    replaced: list[OutboxRow] = []
    for row in rows:
        latest = newest.get(row.notifier)
        if row.notifier_kind in SNAPSHOT_KINDS and latest is not None and latest is not row:
            replaced.append(row.replace(status="superseded", notification=""))
            if metrics is not None:
                metrics.sent.labels(row.notifier, row.notifier_kind, "superseded").inc()
        else:
            kept.append(row)
    _write(store, replaced)
    report.superseded += len(replaced)
    return kept


def _count(metrics: DeliveryMetrics, row: OutboxRow, result: DeliveryResult) -> None:
    labels = (row.notifier, row.notifier_kind)
    failed = result.attempts - (1 if result.ok else 0)
    if failed:
        metrics.requests.labels(*labels, "error").inc(failed)
    if result.ok:
        metrics.requests.labels(*labels, "ok").inc()
        metrics.last_success.labels(*labels).set(time.time())
    outcome = {"delivered": "delivered", "dead": "dead"}.get(row.status, "retry")
    metrics.sent.labels(*labels, outcome).inc()


def _send(notifier: Notifier, row: OutboxRow) -> DeliveryResult:
    # Notifiers return results rather than raise; anything else is a defect, retried like a
    # transient failure so that the row is kept (and gives up after ``max_age``) instead of
    # stopping every other notification of the drain.
    try:
        return notifier.send(Notification.from_json(row.notification))
    except Exception as exc:
        log.exception("notifier %s failed on %s", row.notifier, row.id)
        return DeliveryResult(ok=False, error=f"{type(exc).__name__}: {exc}", retryable=True)


def _after_send(row: OutboxRow, result: DeliveryResult, moment: datetime, max_age: timedelta) -> OutboxRow:
    attempts = row.attempts + result.attempts
    if result.ok:
        return row.replace(
            status="delivered",
            attempts=attempts,
            delivered_at=utc_now(),
            last_error="",
            # A delivered snapshot is history; the next evaluation derives a new one anyway.
            notification="" if row.notifier_kind in SNAPSHOT_KINDS else row.notification,
        )
    if not result.retryable or moment - row.created_at >= max_age:
        reason = result.error if not result.retryable else f"gave up after {max_age}: {result.error}"
        return row.replace(status="dead", attempts=attempts, last_error=reason[:500])
    wait = max(backoff(attempts), result.retry_after_s or 0.0)
    return row.replace(
        attempts=attempts,
        next_attempt_at=moment + timedelta(seconds=wait),
        last_error=result.error[:500],
    )


NotifierHealth = Literal["ok", "pending", "failing"]


@dataclass(frozen=True)
class NotifierStatus:
    """One notifier's delivery record over a period (``tailwatch alerts list`` prints one line each).

    ``state``: ``failing`` when its newest item was refused or is waiting for a retry (then
    ``last_error`` and ``next_attempt_at`` say why and when), ``pending`` when items wait for their
    first attempt, else ``ok``.
    """

    notifier: str
    kind: str
    state: NotifierHealth
    pending: int
    dead: int
    superseded: int
    delivered: int
    last_delivered_at: datetime | None
    last_error: str
    attempts: int
    next_attempt_at: datetime | None

    def __str__(self) -> str:
        parts = [f"{self.state}"]
        if self.state == "failing":
            when = f", next attempt {_when(self.next_attempt_at)}" if self.next_attempt_at else ""
            parts.append(f"{self.attempts} failed attempts{when}: {self.last_error}")
        counts = [
            f"{n} {what}"
            for n, what in (
                (self.pending, "pending"),
                (self.dead, "dead"),
                (self.superseded, "superseded"),
                (self.delivered, "delivered"),
            )
            if n
        ]
        if counts:
            parts.append(", ".join(counts))
        parts.append(f"last delivered {_when(self.last_delivered_at) if self.last_delivered_at else 'never'}")
        return "; ".join(parts)


def _when(value: datetime) -> str:
    return as_utc(value).strftime("%Y-%m-%d %H:%M:%SZ")


def delivery_status(store: Store, since: datetime | None = None) -> list[NotifierStatus]:
    """Per notifier, what happened to the items created since ``since`` (default: all kept)."""
    if not store.table_exists(OUTBOX_TABLE):
        return []
    sql = (
        "SELECT notifier, any(notifier_kind), countIf(status = 'pending'), countIf(status = 'dead'), "
        "countIf(status = 'superseded'), countIf(status = 'delivered'), "
        "maxIf(delivered_at, status = 'delivered'), "
        # The newest item decides whether the notifier is failing now.
        "argMax(status, (created_at, id)), argMax(last_error, (created_at, id)), "
        "argMax(attempts, (created_at, id)), argMax(next_attempt_at, (created_at, id)) "
        f"FROM (SELECT * FROM {store.table(OUTBOX_TABLE)} ORDER BY version DESC LIMIT 1 BY notifier, id) "
        "WHERE created_at >= {since:DateTime64(3, 'UTC')} GROUP BY notifier ORDER BY notifier"
    )
    since = since or datetime(1970, 1, 1, tzinfo=UTC)
    out = []
    for r in store.query_rows(sql, {"since": since}):
        newest_status, newest_error, newest_attempts = str(r[7]), str(r[8]), int(r[9])
        failing = newest_status == "dead" or (newest_status == "pending" and newest_attempts > 0)
        state: NotifierHealth = "failing" if failing else ("pending" if int(r[2]) else "ok")
        out.append(
            NotifierStatus(
                notifier=str(r[0]),
                kind=str(r[1]),
                state=state,
                pending=int(r[2]),
                dead=int(r[3]),
                superseded=int(r[4]),
                delivered=int(r[5]),
                last_delivered_at=as_utc(r[6]) if r[6] is not None and int(r[5]) else None,
                last_error=newest_error if failing else "",
                attempts=newest_attempts if failing else 0,
                next_attempt_at=as_utc(r[10]) if failing and newest_status == "pending" else None,
            )
        )
    return out
