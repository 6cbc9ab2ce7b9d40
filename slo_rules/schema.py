"""The rule engine's tables: alert state, alert transitions (history), the notification outbox and
the evaluations that changed them.

State and outbox rows are never updated in place: every change inserts a new row with a higher
``version`` into a ``ReplacingMergeTree``, and readers take the newest row per key (``FINAL``). That
keeps writes append-only (cheap and safe on a cluster) while a restart reads exactly the last
state written.
"""

from __future__ import annotations

from storage import DDLContext, Migration, register_migrations

ALERT_STATE_TABLE = "tailwatch_alert_state"
ALERT_EVENTS_TABLE = "tailwatch_alert_events"
OUTBOX_TABLE = "tailwatch_outbox"
EVALUATIONS_TABLE = "tailwatch_rule_evaluations"
OUTBOX_TTL_DAYS = 30

__all__ = ["ALERT_EVENTS_TABLE", "ALERT_STATE_TABLE", "EVALUATIONS_TABLE", "MIGRATIONS", "OUTBOX_TABLE"]


def _alert_state(ctx: DDLContext) -> list[str]:
    body = """    fingerprint String,
    rule String,
    alertname String,
    severity LowCardinality(String),
    state LowCardinality(String),
    service String,
    operation String,
    queue String,
    workflow String,
    path LowCardinality(String),
    cause LowCardinality(String),
    summary String,
    labels String,
    annotations String,
    active_since Nullable(DateTime64(3, 'UTC')),
    starts_at Nullable(DateTime64(3, 'UTC')),
    ends_at Nullable(DateTime64(3, 'UTC')),
    last_notified_at Nullable(DateTime64(3, 'UTC')),
    updated_at DateTime64(3, 'UTC'),
    version UInt64"""
    return ctx.create_table(
        ALERT_STATE_TABLE,
        body,
        kind="ReplacingMergeTree",
        engine_args="version",
        tail="ORDER BY fingerprint",
    )


def _alert_events(ctx: DDLContext) -> list[str]:
    body = """    fingerprint String,
    rule String,
    alertname String,
    severity LowCardinality(String),
    status LowCardinality(String),
    at DateTime64(3, 'UTC'),
    cause LowCardinality(String),
    service String,
    operation String,
    queue String,
    workflow String,
    path LowCardinality(String),
    summary String,
    labels String,
    annotations String"""
    return ctx.create_table(
        ALERT_EVENTS_TABLE,
        body,
        kind="ReplacingMergeTree",
        tail="ORDER BY (at, fingerprint, status)",
    )


def _outbox(ctx: DDLContext) -> list[str]:
    body = """    id String,
    notifier String,
    notifier_kind LowCardinality(String),
    status LowCardinality(String),
    created_at DateTime64(3, 'UTC'),
    attempts UInt32,
    next_attempt_at DateTime64(3, 'UTC'),
    delivered_at Nullable(DateTime64(3, 'UTC')),
    last_error String,
    notification String,
    version UInt64"""
    return ctx.create_table(
        OUTBOX_TABLE,
        body,
        kind="ReplacingMergeTree",
        engine_args="version",
        # Delivered or dead rows are history after a month; pending ones turn dead after a day.
        tail=f"ORDER BY (notifier, id)\nTTL toDateTime(created_at) + toIntervalDay({OUTBOX_TTL_DAYS})",
    )


def _evaluations(ctx: DDLContext) -> list[str]:
    # One row per evaluation that changed live state: the instant it evaluated (``at``, which a
    # later evaluation at an earlier instant must not rewind past) and when it ran.
    body = """    at DateTime64(3, 'UTC'),
    ran_at DateTime64(3, 'UTC'),
    rules UInt32,
    fired UInt32,
    resolved UInt32,
    errors UInt32"""
    return ctx.create_table(
        EVALUATIONS_TABLE, body, tail="ORDER BY at\nTTL toDateTime(ran_at) + toIntervalDay(30)"
    )


MIGRATIONS: tuple[Migration, ...] = (
    Migration("slo_rules", 1, ALERT_STATE_TABLE, _alert_state),
    Migration("slo_rules", 2, ALERT_EVENTS_TABLE, _alert_events),
    Migration("slo_rules", 3, OUTBOX_TABLE, _outbox),
    Migration("slo_rules", 4, EVALUATIONS_TABLE, _evaluations),
)

register_migrations(MIGRATIONS)
