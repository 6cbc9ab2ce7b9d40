"""The analytics stage's tables: persisted analysis runs (with typed history per metric), the
per-minute HdrHistogram rollups of hot-path latency and the first-seen times of releases."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from storage import DDLContext, Migration, register_migrations

__all__ = [
    "FRAMES_TABLE",
    "HISTORY_FRAMES",
    "MIGRATIONS",
    "RELEASE_TIMES_TABLE",
    "ROLLUPS_TABLE",
    "ROLLUP_RUNS_TABLE",
    "RUNS_TABLE",
    "clickhouse_type",
    "history_table",
]

RUNS_TABLE = "tailwatch_analysis_runs"
FRAMES_TABLE = "tailwatch_analysis_frames"
ROLLUPS_TABLE = "tailwatch_rollups"
ROLLUP_RUNS_TABLE = "tailwatch_rollup_runs"
RELEASE_TIMES_TABLE = "tailwatch_release_times"

# Frames kept as typed tables too, so rules and dashboards can query history in SQL
# (e.g. p99 of an operation across the last 50 runs).
HISTORY_FRAMES = (
    "hot_path",
    "releases",
    "release_coupling",
    "cold_path",
    "abandonment_summary",
    "retry_amplification",
    "attribution",
    "llm_signals",
)


def history_table(frame: str) -> str:
    return f"tailwatch_analysis_{frame}"


def clickhouse_type(dtype: Any) -> str:
    """The ClickHouse column type a Polars column of the analysis frames is stored as."""
    if dtype == pl.String:
        return "String"
    if dtype == pl.Boolean:
        return "Nullable(Bool)"
    if dtype == pl.Int64:
        return "Nullable(Int64)"
    if dtype == pl.Float64:
        return "Nullable(Float64)"
    if isinstance(dtype, pl.Datetime):
        return "Nullable(DateTime64(6, 'UTC'))"
    if isinstance(dtype, pl.List) and dtype.inner == pl.String:
        return "Array(String)"
    raise TypeError(f"no ClickHouse type for {dtype}")


def _runs(ctx: DDLContext) -> list[str]:
    body = """    run_id String,
    created_at DateTime64(3, 'UTC'),
    start DateTime64(9, 'UTC'),
    end DateTime64(9, 'UTC'),
    baseline_start DateTime64(9, 'UTC'),
    baseline_end DateTime64(9, 'UTC'),
    bucket_ms UInt32,
    conventions String,
    result String"""
    return ctx.create_table(RUNS_TABLE, body, tail="ORDER BY (start, end, created_at)")


def _frames(ctx: DDLContext) -> list[str]:
    body = """    run_id String,
    frame LowCardinality(String),
    ipc String CODEC(ZSTD(3))"""
    return ctx.create_table(FRAMES_TABLE, body, tail="ORDER BY (run_id, frame)")


def _history(ctx: DDLContext) -> list[str]:
    from analytics.analysis import FRAME_SCHEMAS

    statements: list[str] = []
    for frame in HISTORY_FRAMES:
        columns = [
            "    run_id String",
            "    created_at DateTime64(3, 'UTC')",
            "    window_start DateTime64(9, 'UTC')",
            "    window_end DateTime64(9, 'UTC')",
        ]
        columns += [f"    `{name}` {clickhouse_type(dtype)}" for name, dtype in FRAME_SCHEMAS[frame].items()]
        order = "(window_end, run_id)"
        statements += ctx.create_table(history_table(frame), ",\n".join(columns), tail=f"ORDER BY {order}")
    return statements


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


def _cold_path_runs(ctx: DDLContext) -> list[str]:
    # Tables made before the cold path counted runs: a fresh store has the columns from v3 already.
    return [
        f"ALTER TABLE {ctx.name(history_table('cold_path'))}{ctx.on_cluster} "
        "ADD COLUMN IF NOT EXISTS `runs` Int64, ADD COLUMN IF NOT EXISTS `retried_jobs` Int64"
    ]


def _m(version: int, name: str, render: Callable[[DDLContext], list[str]]) -> Migration:
    return Migration("analytics", version, name, render)


MIGRATIONS: tuple[Migration, ...] = (
    _m(1, RUNS_TABLE, _runs),
    _m(2, FRAMES_TABLE, _frames),
    _m(3, "tailwatch_analysis_<frame> history", _history),
    _m(4, ROLLUPS_TABLE, _rollups),
    _m(5, ROLLUP_RUNS_TABLE, _rollup_runs),
    _m(6, RELEASE_TIMES_TABLE, _release_times),
    _m(7, "tailwatch_analysis_cold_path runs", _cold_path_runs),
)

register_migrations(MIGRATIONS)
