"""The service's own tables (the record of every scheduled job run, the scheduler lease) and their reads.

``tailwatch_job_runs`` is append-only history (one row per run, whatever its outcome), kept for
90 days. ``tailwatch_scheduler_lease`` holds one logical row per lease name; instances append
renewals and readers take the newest, so no update or transaction is needed on any ClickHouse.
"""

from __future__ import annotations

from typing import Any

from storage import LEASE_TABLE, DDLContext, Migration, Store, lease_table, register_migrations

JOB_RUNS_TABLE = "tailwatch_job_runs"

__all__ = ["JOB_RUNS_TABLE", "LEASE_TABLE", "MIGRATIONS", "recent_job_runs"]


def _job_runs(ctx: DDLContext) -> list[str]:
    body = """    job LowCardinality(String),
    run_id String,
    instance String,
    started_at DateTime64(3, 'UTC'),
    finished_at DateTime64(3, 'UTC'),
    status LowCardinality(String),
    error String,
    rows_read UInt64"""
    return ctx.create_table(
        JOB_RUNS_TABLE,
        body,
        tail="PARTITION BY toYYYYMM(started_at)\nORDER BY (job, started_at)\n"
        "TTL toDateTime(started_at) + toIntervalDay(90)",
    )


MIGRATIONS: tuple[Migration, ...] = (
    Migration("service", 1, JOB_RUNS_TABLE, _job_runs),
    # The lease table is storage's now (storage.Lease): the same idempotent DDL.
    Migration("service", 2, LEASE_TABLE, lease_table),
)

register_migrations(MIGRATIONS)


def recent_job_runs(store: Store, limit: int = 100) -> list[dict[str, Any]]:
    """The newest job runs, newest first (``GET /api/v1/jobs``)."""
    rows = store.query_rows(
        "SELECT job, run_id, instance, started_at, finished_at, status, error, rows_read "
        f"FROM {store.table(JOB_RUNS_TABLE)} ORDER BY started_at DESC LIMIT {{limit:UInt32}}",
        {"limit": limit},
    )
    keys = ("job", "run_id", "instance", "started_at", "finished_at", "status", "error", "rows_read")
    return [dict(zip(keys, row, strict=True)) for row in rows]
