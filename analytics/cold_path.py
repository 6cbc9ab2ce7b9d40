"""Cold path: enqueue-to-ready per queued job (SQL join of producers and consumers), then per-queue
percentiles, the starvation verdict, a time series and the CDF (Polars).

A job is a Producer span (the enqueue; queue = ``messaging.destination.name`` or the span name)
and the Consumer span(s) that process it, found through a span link to the producer or, for a single
message, as the producer's child. Enqueue-to-ready = last consumer end − producer start; queue wait
= first consumer start − producer start; processing = the rest. A producer with no consumer started
by the window's end is *pending*. A root span marked ``tailwatch.path=cold`` that is neither a
producer nor a consumer is a job of its own (ready when it ends, no queue wait).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import polars as pl

from analytics._common import Windows, empty, normalize
from analytics.conventions import IS_COLD_MARKED, KIND, QUEUE, Conventions
from analytics.stats import percentile_exprs
from collectors.schema import TRACES_TABLE
from collectors.store import Store

__all__ = [
    "COLD_PATH_CDF_SCHEMA",
    "COLD_PATH_SCHEMA",
    "COLD_PATH_SERIES_SCHEMA",
    "JOBS_SCHEMA",
    "cold_path_cdf",
    "cold_path_series",
    "cold_path_summary",
    "fetch_jobs",
    "jobs_sql",
]

JOBS_SCHEMA: dict[str, Any] = {
    "queue": pl.String,
    "enqueued": pl.Datetime("ns", "UTC"),
    "queue_wait_s": pl.Float64,
    "processing_s": pl.Float64,
    "enqueue_to_ready_s": pl.Float64,
}

COLD_PATH_SCHEMA: dict[str, Any] = {
    "queue": pl.String,
    "jobs": pl.Int64,
    "completed": pl.Int64,
    "pending": pl.Int64,
    "p50_s": pl.Float64,
    "p95_s": pl.Float64,
    "p99_s": pl.Float64,
    "p999_s": pl.Float64,
    "queue_wait_p99_s": pl.Float64,
    "processing_p99_s": pl.Float64,
    "p99_over_p50": pl.Float64,
    "starved": pl.Boolean,
}

COLD_PATH_SERIES_SCHEMA: dict[str, Any] = {
    "queue": pl.String,
    "bucket_start": pl.Datetime("us", "UTC"),
    "jobs": pl.Int64,
    "completed": pl.Int64,
    "pending": pl.Int64,
    "p50_s": pl.Float64,
    "p99_s": pl.Float64,
    "queue_wait_p50_s": pl.Float64,
    "processing_p50_s": pl.Float64,
}

COLD_PATH_CDF_SCHEMA: dict[str, Any] = {
    "queue": pl.String,
    "enqueue_to_ready_s": pl.Float64,
    "cdf": pl.Float64,
}


def jobs_sql(table: str) -> str:
    """One row per job enqueued in [s, e); consumer columns are NULL for pending jobs."""
    window = "Timestamp >= {s:DateTime64(9)} AND Timestamp < {e:DateTime64(9)}"
    return f"""
WITH
producers AS (
    SELECT cityHash64(TraceId, SpanId) AS job_key, any({QUEUE}) AS queue,
           min(toUnixTimestamp64Nano(Timestamp)) AS enqueued_ns
    FROM {table}
    WHERE {window} AND {KIND} = 'Producer'
    GROUP BY job_key
),
consumers AS (
    -- min/max are idempotent, so duplicate consumer spans need no separate dedup.
    SELECT cityHash64(link.1, link.2) AS job_key,
           min(toUnixTimestamp64Nano(Timestamp)) AS started_ns,
           max(toUnixTimestamp64Nano(Timestamp) + toInt64(Duration)) AS ended_ns
    FROM {table}
    ARRAY JOIN if(notEmpty(`Links.SpanId`), arrayZip(`Links.TraceId`, `Links.SpanId`),
                  [(TraceId, ParentSpanId)]) AS link
    WHERE {window} AND {KIND} = 'Consumer'
    GROUP BY job_key
),
standalone AS (
    SELECT any({QUEUE}) AS queue, min(toUnixTimestamp64Nano(Timestamp)) AS enqueued_ns,
           min(toUnixTimestamp64Nano(Timestamp)) AS started_ns,
           max(toUnixTimestamp64Nano(Timestamp) + toInt64(Duration)) AS ended_ns
    FROM {table}
    WHERE {window} AND ParentSpanId = '' AND {KIND} NOT IN ('Producer', 'Consumer') AND {IS_COLD_MARKED}
    GROUP BY cityHash64(TraceId, SpanId)
)
SELECT queue, enqueued_ns, started_ns, ended_ns
FROM producers LEFT JOIN consumers USING (job_key)
UNION ALL
SELECT queue, enqueued_ns, started_ns, ended_ns FROM standalone
"""


def fetch_jobs(store: Store, windows: Windows, conventions: Conventions) -> pl.DataFrame:
    params = {**conventions.sql_parameters(), "s": windows.start, "e": windows.end}
    frame = normalize(
        store.query_polars(jobs_sql(store.table(TRACES_TABLE)), params, settings={"join_use_nulls": 1})
    )
    return jobs_from_raw(frame)


def jobs_from_raw(frame: pl.DataFrame) -> pl.DataFrame:
    """Nanosecond producer/consumer times → per-job seconds. Pure."""
    if frame.is_empty():
        return empty(JOBS_SCHEMA)
    return frame.select(
        pl.col("queue").cast(pl.String),
        pl.col("enqueued_ns").cast(pl.Int64).cast(pl.Datetime("ns", "UTC")).alias("enqueued"),
        ((pl.col("started_ns") - pl.col("enqueued_ns")).clip(lower_bound=0) / 1e9).alias("queue_wait_s"),
        ((pl.col("ended_ns") - pl.col("started_ns")).clip(lower_bound=0) / 1e9).alias("processing_s"),
        ((pl.col("ended_ns") - pl.col("enqueued_ns")).clip(lower_bound=0) / 1e9).alias("enqueue_to_ready_s"),
    ).cast(pl.Schema(JOBS_SCHEMA))


def cold_path_summary(jobs: pl.DataFrame, conventions: Conventions) -> pl.DataFrame:
    """Per queue: jobs, completed, pending, enqueue-to-ready percentiles, starvation. Pure."""
    if jobs.is_empty():
        return empty(COLD_PATH_SCHEMA)
    q = {"p50_s": 0.5, "p95_s": 0.95, "p99_s": 0.99, "p999_s": 0.999}
    done = pl.col("enqueue_to_ready_s").is_not_null()
    frame = (
        jobs.group_by("queue")
        .agg(
            pl.len().cast(pl.Int64).alias("jobs"),
            done.sum().cast(pl.Int64).alias("completed"),
            *percentile_exprs("enqueue_to_ready_s", q),
            *percentile_exprs("queue_wait_s", {"queue_wait_p99_s": 0.99}),
            *percentile_exprs("processing_s", {"processing_p99_s": 0.99}),
        )
        .with_columns(
            (pl.col("jobs") - pl.col("completed")).alias("pending"),
            pl.when(pl.col("p50_s") > 0).then(pl.col("p99_s") / pl.col("p50_s")).alias("p99_over_p50"),
        )
        .with_columns(
            (pl.col("p99_over_p50") > conventions.starvation_ratio).fill_null(False).alias("starved")
        )
    )
    return frame.sort("queue").select(list(COLD_PATH_SCHEMA))


def cold_path_series(jobs: pl.DataFrame, every: timedelta) -> pl.DataFrame:
    """Per (queue, enqueue-time bucket): jobs, completion and percentiles. Pure."""
    if jobs.is_empty():
        return empty(COLD_PATH_SERIES_SCHEMA)
    done = pl.col("enqueue_to_ready_s").is_not_null()
    return (
        jobs.with_columns(pl.col("enqueued").dt.truncate(every).dt.cast_time_unit("us").alias("bucket_start"))
        .group_by("queue", "bucket_start")
        .agg(
            pl.len().cast(pl.Int64).alias("jobs"),
            done.sum().cast(pl.Int64).alias("completed"),
            *percentile_exprs("enqueue_to_ready_s", {"p50_s": 0.5, "p99_s": 0.99}),
            *percentile_exprs("queue_wait_s", {"queue_wait_p50_s": 0.5}),
            *percentile_exprs("processing_s", {"processing_p50_s": 0.5}),
        )
        .with_columns((pl.col("jobs") - pl.col("completed")).alias("pending"))
        .sort("queue", "bucket_start")
        .select(list(COLD_PATH_SERIES_SCHEMA))
    )


def cold_path_cdf(jobs: pl.DataFrame, points: int) -> pl.DataFrame:
    """Per queue, the empirical CDF of enqueue-to-ready at ≤ ``points`` ranks, always including the
    fastest and the slowest job. Ranks are spaced evenly in log(1 − F) beyond the median so the
    tail — where starvation shows — keeps its resolution. Pure."""
    frames: list[pl.DataFrame] = []
    completed = jobs.filter(pl.col("enqueue_to_ready_s").is_not_null())
    for (queue,), group in completed.group_by("queue", maintain_order=True):
        values = np.sort(group["enqueue_to_ready_s"].to_numpy())
        n = values.size
        if n <= points:
            ranks = np.arange(n)
        else:
            half = points // 2
            body = np.linspace(0, n // 2, half)
            tail_fraction = np.geomspace(0.5, 1.0 / n, points - half)
            tail = n - tail_fraction * n
            ranks = np.unique(np.clip(np.concatenate([body, tail]).astype(np.int64), 0, n - 1))
        frames.append(
            pl.DataFrame(
                {
                    "queue": [str(queue)] * ranks.size,
                    "enqueue_to_ready_s": values[ranks],
                    "cdf": (ranks + 1) / n,
                },
                schema=COLD_PATH_CDF_SCHEMA,
            )
        )
    if not frames:
        return empty(COLD_PATH_CDF_SCHEMA)
    return pl.concat(frames).sort("queue", "enqueue_to_ready_s")
