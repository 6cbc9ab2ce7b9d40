"""The analytics stage's tables: persisted analysis runs (with typed history per metric), the
per-minute HdrHistogram rollups of hot-path latency, the first-seen times of releases and the
summaries (:mod:`analytics.summary_tables`)."""

from __future__ import annotations

from collections.abc import Callable

from analytics.summary_tables import (
    aggregate_tables,
    aggregate_workflow_tables,
    anatomy_columns,
    anatomy_tables,
    failed_calls_column,
    first_byte_columns,
    hour_tables,
    minutes_layer,
    request_llm_tables,
    summary_tables,
    summary_top_tables,
)
from storage import DDLContext, Migration, register_migrations

__all__ = [
    "DRIFT_REPORTS_TABLE",
    "MIGRATIONS",
    "RELEASE_TIMES_TABLE",
    "ROLLUPS_TABLE",
    "ROLLUP_RUNS_TABLE",
    "migration",
]

ROLLUPS_TABLE = "tailwatch_rollups"
ROLLUP_RUNS_TABLE = "tailwatch_rollup_runs"
RELEASE_TIMES_TABLE = "tailwatch_release_times"
DRIFT_REPORTS_TABLE = "tailwatch_drift_reports"


def _rollups(ctx: DDLContext) -> list[str]:
    body = """    minute DateTime('UTC'),
    service LowCardinality(String),
    operation LowCardinality(String),
    version LowCardinality(String),
    requests UInt64,
    abandoned UInt64,
    histogram String,
    writer LowCardinality(String),
    built_at DateTime64(3, 'UTC')"""
    tail = "PARTITION BY toYYYYMM(minute)\nORDER BY (service, operation, minute, version)"
    return ctx.create_table(ROLLUPS_TABLE, body, tail=tail, shard_key="cityHash64(service, operation)")


def _rollup_runs(ctx: DDLContext) -> list[str]:
    body = """    built_from DateTime('UTC'),
    built_until DateTime('UTC'),
    rows UInt64,
    writer LowCardinality(String),
    built_at DateTime64(3, 'UTC')"""
    return ctx.create_table(ROLLUP_RUNS_TABLE, body, tail="ORDER BY (built_until, writer)")


def _release_times(ctx: DDLContext) -> list[str]:
    # One row per (service, version) and build; readers take min(first_seen), so rows of several
    # builds or writers, or a build repeated after a crash, change nothing.
    body = """    service LowCardinality(String),
    version String,
    first_seen DateTime64(9, 'UTC'),
    writer LowCardinality(String),
    built_at DateTime64(3, 'UTC')"""
    return ctx.create_table(RELEASE_TIMES_TABLE, body, tail="ORDER BY (service, version)")


def _drift_reports(ctx: DDLContext) -> list[str]:
    # One row per (hour, report key) and build; readers take the newest (analytics.drift).
    body = """    end DateTime64(3, 'UTC'),
    key String,
    findings String,
    built_at DateTime64(3, 'UTC')"""
    return ctx.create_table(DRIFT_REPORTS_TABLE, body, tail="ORDER BY (end, key)")


def migration(version: int, name: str, render: Callable[[DDLContext], list[str]]) -> Migration:
    """One step of the analytics component's schema (versions are shared with analytics.persist)."""
    return Migration("analytics", version, name, render)


MIGRATIONS: tuple[Migration, ...] = (
    migration(4, ROLLUPS_TABLE, _rollups),
    migration(5, ROLLUP_RUNS_TABLE, _rollup_runs),
    migration(6, RELEASE_TIMES_TABLE, _release_times),
    migration(11, "tailwatch_summary_* tables", summary_tables),
    migration(
        12, "tailwatch_summary_request_minutes, _top_requests and _llm_call_minutes", summary_top_tables
    ),
    migration(14, "tailwatch_agg_requests", aggregate_tables),
    migration(15, "tailwatch_summary_minutes layer", minutes_layer),
    migration(16, "tailwatch_agg_workflow_hops and _runs", aggregate_workflow_tables),
    migration(17, "tailwatch_drift_reports", _drift_reports),
    migration(18, "tailwatch_summary_llm_calls and _llm_call_minutes failed_calls", failed_calls_column),
    migration(20, "tailwatch_summary_llm_calls and _llm_call_minutes anatomy columns", anatomy_columns),
    migration(21, "tailwatch_agg_llm_anatomy", anatomy_tables),
    migration(
        23,
        "tailwatch_summary_requests, _top_requests and tailwatch_agg_requests first byte",
        first_byte_columns,
    ),
    migration(25, "tailwatch_agg_request_llm", request_llm_tables),
    migration(26, "tailwatch_agg_llm_anatomy_hours and tailwatch_summary_hours", hour_tables),
)

register_migrations(MIGRATIONS)
