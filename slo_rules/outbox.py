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
from datetime import datetime, timedelta
from typing import Any, Literal

import pyarrow as pa

from slo_rules.notifiers import DeliveryResult, Notification, Notifier, NotifierConfig, build_notifier
from slo_rules.schema import MIGRATIONS, OUTBOX_TABLE
from storage import Store, TailwatchError, as_utc, ensure_schema, utc_now

__all__ = ["DeliveryReport", "OutboxRow", "deliver", "enqueue", "outbox_rows"]

OutboxStatus = Literal["pending", "delivered", "dead"]

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
    unconfigured: int = 0
    undelivered: list[OutboxRow] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.undelivered

    def __str__(self) -> str:
        return (
            f"{self.attempted} attempted, {self.delivered} delivered, {self.retrying} to retry, "
            f"{self.dead} dead, {len(self.undelivered)} undelivered"
        )


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
) -> DeliveryReport:
    """Send every due notification (``force``: every pending one, whatever its backoff).

    Without ``force``, a notifier that fails with a retryable error is skipped for the rest of
    this drain (its later notifications keep their order and are tried on the next drain).
    """
    ensure_schema(store, MIGRATIONS)
    moment = as_utc(now or utc_now())
    report = DeliveryReport()
    configs = {c.name: c for c in notifiers}
    built: dict[str, Notifier] = {}
    broken: set[str] = set()
    try:
        for row in outbox_rows(store, status="pending"):
            if row.notifier not in configs:
                report.unconfigured += 1
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
    return report


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
