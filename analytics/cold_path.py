"""Cold path: enqueue-to-ready per queued job (producer and consumer spans joined by job), then per-queue
percentiles, the starvation verdict, a time series and the CDF (Polars).

A job is a Producer span (the enqueue; queue = ``messaging.destination.name``, else Celery's
``messaging.destination``, else the span name) and the runs that process it: Consumer spans, or
messaging ``process``/``receive`` spans of any kind (a pull consumer's receive is a Client span),
found through a span link to the producer or, for a single message, as the producer's child (Celery's
default). Producers sharing a ``messaging.message.id`` are one job: a retried Celery task is enqueued
again with the same task id, and its job is ready when a run succeeds, not when the first run fails.
Enqueue-to-ready = end of the last successful run (status not Error, ``celery.state`` not
FAILURE/RETRY; the last run's end when none succeeded) − first producer start; queue wait = first run
start − first producer start; processing = the rest. A job with no run started by the window's end is
*pending*. A root span marked ``tailwatch.path=cold`` that is neither a producer nor a consumer is a
job of its own (ready when it ends, no queue wait).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import polars as pl

from analytics._common import Windows, empty, normalize
from analytics.conventions import (
    IS_BOUNDARY,
    IS_COLD_MARKED,
    KIND,
    MAYBE_BOUNDARY,
    MESSAGE_ID,
    QUEUE,
    RUN_FAILED,
    Conventions,
)
from analytics.stats import INTERPOLATION, percentile_exprs
from collectors import TRACES_TABLE, inspect_traces
from storage import Store

__all__ = [
    "COLD_PATH_CDF_SCHEMA",
    "COLD_PATH_SCHEMA",
    "COLD_PATH_SERIES_SCHEMA",
    "JOBS_SCHEMA",
    "JOB_SPANS_SCHEMA",
    "JOB_STATS_SCHEMA",
    "cold_path_cdf",
    "cold_path_cdf_from_stats",
    "cold_path_from_stats",
    "cold_path_series",
    "cold_path_series_from_stats",
    "cold_path_summary",
    "fetch_job_spans",
    "fetch_jobs",
    "job_stats_sql",
    "jobs_from_raw",
    "jobs_from_spans",
    "jobs_reduction_sql",
    "jobs_sql",
]

JOBS_SCHEMA: dict[str, Any] = {
    "queue": pl.String,
    # cityHash64(TraceId) of the job's (first) producer: the request that enqueued it, when one did
    # (analytics.slices: what a variant's users wait for on the cold path).
    "trace_key": pl.UInt64,
    "enqueued": pl.Datetime("ns", "UTC"),
    "queue_wait_s": pl.Float64,
    "processing_s": pl.Float64,
    "enqueue_to_ready_s": pl.Float64,
    "runs": pl.Int64,  # consumer runs (a retried task runs more than once)
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
    "runs": pl.Int64,
    "retried_jobs": pl.Int64,  # jobs that ran more than once
    # The same queue over the baseline window (null where it enqueued nothing then).
    "baseline_jobs": pl.Int64,
    "baseline_p50_s": pl.Float64,
    "baseline_p99_s": pl.Float64,
    "baseline_queue_wait_p99_s": pl.Float64,
    "baseline_processing_p99_s": pl.Float64,
}

# The summary's own columns, before the baseline's are joined on.
_SUMMARY_COLUMNS = [c for c in COLD_PATH_SCHEMA if not c.startswith("baseline_")]

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
    "window": pl.String,  # "current" or "baseline"
}


# Role of a span in a job: the enqueue, the processing (one row per job it serves), or both at once
# (a root marked cold that is neither: ready when it ends, no queue wait).
_PRODUCER, _CONSUMER, _STANDALONE = 0, 1, 2

JOB_SPANS_SCHEMA: dict[str, Any] = {
    "role": pl.UInt8,
    "job_key": pl.UInt64,  # cityHash64(TraceId, SpanId) of the producer (or standalone span)
    "queue": pl.String,  # empty for consumers
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "message_key": pl.UInt64,  # cityHash64(messaging.message.id) of a producer, 0 without one
    "failed": pl.Boolean,  # a run that did not finish its job
    "trace_key": pl.UInt64,  # cityHash64(TraceId) of a producer or standalone span, 0 for consumers
}


def _cold_roots_marked_in(table: str, column: str) -> str:
    # Written as mapKeys(...) so that the Collector's bloom filter over that map's keys
    # (idx_span_attr_key / idx_res_attr_key) skips every granule without the mark's key: marked roots
    # are few, and checking every root's maps cost as much as all producers and consumers together.
    # One SELECT per map, as one index cannot prune on a condition that involves the other map.
    return f"""
SELECT toUInt8({_STANDALONE}) AS role, cityHash64(TraceId, SpanId) AS job_key, {QUEUE} AS queue,
       toUnixTimestamp64Nano(Timestamp) AS start_ns,
       toUnixTimestamp64Nano(Timestamp) + toInt64(Duration) AS end_ns,
       toUInt64(0) AS message_key, false AS failed, cityHash64(TraceId) AS trace_key
FROM {table}
WHERE Timestamp >= {{s:DateTime64(9)}} AND Timestamp < {{e:DateTime64(9)}} AND ParentSpanId = ''
  AND (has(mapKeys({column}), {{cv_path_attr:String}}) OR {{cv_cold:String}} = '')
  AND {KIND} NOT IN ('Producer', 'Consumer') AND {IS_COLD_MARKED}
"""


def jobs_sql(table: str) -> str:
    """Producer and consumer spans and standalone cold roots started in [s, e), one row per (span,
    job): a consumer names its producer by a span link, or by its parent for a single message. A root
    marked cold in both maps comes twice (duplicates change nothing in :func:`jobs_from_spans`).

    One scan of the kind column for producers and consumers; the producer–consumer join is done in
    Polars (:func:`jobs_from_spans`) on these few rows — in SQL, three scans and a hash join cost
    about twice as much."""
    return f"""
SELECT if({KIND} = 'Producer', {_PRODUCER}, {_CONSUMER}) AS role,
       cityHash64(link.1, link.2) AS job_key, if(role = {_CONSUMER}, '', {QUEUE}) AS queue,
       toUnixTimestamp64Nano(Timestamp) AS start_ns,
       toUnixTimestamp64Nano(Timestamp) + toInt64(Duration) AS end_ns,
       if(role = {_PRODUCER} AND {MESSAGE_ID} != '', cityHash64({MESSAGE_ID}), toUInt64(0)) AS message_key,
       role = {_CONSUMER} AND {RUN_FAILED} AS failed,
       if(role = {_PRODUCER}, cityHash64(TraceId), toUInt64(0)) AS trace_key
FROM {table}
ARRAY JOIN if({KIND} = 'Producer', [(TraceId, SpanId)],
              if(notEmpty(`Links.SpanId`), arrayZip(`Links.TraceId`, `Links.SpanId`),
                 [(TraceId, ParentSpanId)])) AS link
PREWHERE {KIND} = 'Producer' OR {MAYBE_BOUNDARY}
WHERE Timestamp >= {{s:DateTime64(9)}} AND Timestamp < {{e:DateTime64(9)}}
  AND ({KIND} = 'Producer' OR {IS_BOUNDARY})
UNION ALL
{_cold_roots_marked_in(table, "SpanAttributes")}
UNION ALL
{_cold_roots_marked_in(table, "ResourceAttributes")}"""


def jobs_reduction_sql(spans: str) -> str:
    """:func:`jobs_from_spans` in SQL over ``spans``, a query of :data:`JOB_SPANS_SCHEMA` rows: one
    row per job (``queue``, ``trace_key``, ``enqueued_ns``, ``started_ns``, ``ended_ns``, ``runs``),
    the same rows. A long window reduces its jobs where its spans are and reads only the jobs.

    Two GROUP BYs and no join: per producer span key, its producer and its runs (a run's state —
    first start, last end, last successful end, distinct runs — merges by min, max and sum); then
    per job (the producers sharing a message id are one). On a cluster the first runs on the
    shards when the spans are sharded by ``job_key`` (the summaries' job spans are)."""
    return f"""
WITH spans AS ({spans})
SELECT toString(argMin(k_queue, k_enqueued)) AS queue, argMin(k_trace, k_enqueued) AS trace_key,
       min(k_enqueued) AS enqueued_ns,
       if(sum(k_runs) > 0, minIf(k_started, k_runs > 0), NULL) AS started_ns,
       -- Ready when its successful runs ended; a job whose every run failed is over when the last ends.
       if(sum(k_runs) > 0, if(sum(k_ok) > 0, maxIf(k_ok_end, k_ok > 0), maxIf(k_end, k_runs > 0)), NULL)
           AS ended_ns,
       toInt64(sum(k_runs)) AS runs
FROM (
    SELECT job_key AS k_key,
           anyIf(queue, role = {_PRODUCER}) AS k_queue, minIf(start_ns, role = {_PRODUCER}) AS k_enqueued,
           anyIf(trace_key, role = {_PRODUCER}) AS k_trace,
           anyIf(message_key, role = {_PRODUCER}) AS k_message,
           countIf(role = {_PRODUCER}) AS k_producers,
           uniqExactIf((start_ns, end_ns, failed), role = {_CONSUMER}) AS k_runs,
           minIf(start_ns, role = {_CONSUMER}) AS k_started, maxIf(end_ns, role = {_CONSUMER}) AS k_end,
           countIf(role = {_CONSUMER} AND NOT failed) AS k_ok,
           maxIf(end_ns, role = {_CONSUMER} AND NOT failed) AS k_ok_end
    FROM spans WHERE role IN ({_PRODUCER}, {_CONSUMER}) GROUP BY job_key HAVING k_producers > 0
)
GROUP BY if(k_message != 0, k_message, k_key)
UNION ALL
SELECT toString(any(queue)), any(trace_key), min(start_ns), min(start_ns), max(end_ns), toInt64(1)
FROM spans WHERE role = {_STANDALONE} GROUP BY job_key"""


# Per (queue, bucket of enqueue time): the jobs, their runs, and the sorted seconds of each
# duration over the jobs that have it — what the cold path's frames need of a long window's jobs.
JOB_STATS_SCHEMA: dict[str, Any] = {
    "queue": pl.String,
    "bucket_ns": pl.Int64,
    "jobs": pl.Int64,
    "runs": pl.Int64,
    "retried_jobs": pl.Int64,
    "ready_s": pl.List(pl.Float64),
    "wait_s": pl.List(pl.Float64),
    "processing_s": pl.List(pl.Float64),
}


def job_stats_sql(jobs: str) -> str:
    """:data:`JOB_STATS_SCHEMA` over ``jobs`` (a :func:`jobs_reduction_sql`), in buckets of
    ``{every_ns:Int64}``: the durations as :func:`jobs_from_raw` computes them, so the frames
    computed from these lists equal those computed from the job rows; only per-bucket rows cross."""
    return f"""
SELECT toString(j_queue) AS queue, intDiv(j_enqueued, {{every_ns:Int64}}) * {{every_ns:Int64}} AS bucket_ns,
       toInt64(count()) AS jobs, toInt64(sum(j_runs)) AS runs, toInt64(countIf(j_runs > 1)) AS retried_jobs,
       arraySort(groupArrayIf(greatest(j_ended - j_enqueued, 0) / 1e9, j_ended IS NOT NULL)) AS ready_s,
       arraySort(groupArrayIf(greatest(j_started - j_enqueued, 0) / 1e9, j_started IS NOT NULL)) AS wait_s,
       arraySort(groupArrayIf(greatest(j_ended - j_started, 0) / 1e9,
                              j_ended IS NOT NULL AND j_started IS NOT NULL)) AS processing_s
FROM (
    SELECT queue AS j_queue, enqueued_ns AS j_enqueued, started_ns AS j_started, ended_ns AS j_ended,
           runs AS j_runs
    FROM ({jobs})
)
GROUP BY queue, bucket_ns"""


def fetch_job_spans(store: Store, windows: Windows, conventions: Conventions) -> pl.DataFrame:
    """The job spans started in [start, end) (:data:`JOB_SPANS_SCHEMA`): what :func:`fetch_jobs`
    reduces, and what the summaries keep."""
    params = {**conventions.sql_parameters(), "s": windows.start, "e": windows.end}
    frame = store.query_polars(inspect_traces(store).adapt(jobs_sql(store.table(TRACES_TABLE))), params)
    if frame.is_empty():
        return empty(JOB_SPANS_SCHEMA)
    return normalize(frame).cast(pl.Schema(JOB_SPANS_SCHEMA)).select(list(JOB_SPANS_SCHEMA))


def fetch_jobs(store: Store, windows: Windows, conventions: Conventions) -> pl.DataFrame:
    """One row per job enqueued in [start, end) (:data:`JOBS_SCHEMA`)."""
    return jobs_from_raw(jobs_from_spans(fetch_job_spans(store, windows, conventions)))


def jobs_from_spans(spans: pl.DataFrame) -> pl.DataFrame:
    """Job spans (:data:`JOB_SPANS_SCHEMA`) → one row per job: ``queue``, ``trace_key`` (of its
    first producer), ``enqueued_ns``, ``started_ns``/``ended_ns`` (null while no run started) and
    ``runs``. Producers sharing a message id are one job (a retried task), ready at the end of its
    first successful run. Duplicate spans change nothing but ``runs``, which counts distinct runs.
    Pure."""
    empty_raw = pl.DataFrame(
        schema={
            "queue": pl.String,
            "trace_key": pl.UInt64,
            "enqueued_ns": pl.Int64,
            "started_ns": pl.Int64,
            "ended_ns": pl.Int64,
            "runs": pl.Int64,
        }
    )
    if spans.is_empty():
        return empty_raw
    spans = spans.cast(pl.Schema(JOB_SPANS_SCHEMA))
    role = pl.col("role")
    producers = (
        spans.filter(role == _PRODUCER)
        .group_by("job_key")
        .agg(
            pl.col("queue").first(),
            pl.col("start_ns").min(),
            pl.col("message_key").first(),
            pl.col("trace_key").first(),
        )
        .with_columns(
            pl.when(pl.col("message_key") != 0)
            .then(pl.col("message_key"))
            .otherwise(pl.col("job_key"))
            .alias("group_key")
        )
    )
    jobs = producers.group_by("group_key").agg(
        pl.col("queue").sort_by("start_ns").first(),
        pl.col("trace_key").sort_by("start_ns").first(),
        pl.col("start_ns").min().alias("enqueued_ns"),
    )
    runs = (
        spans.filter(role == _CONSUMER)
        .unique(subset=["job_key", "start_ns", "end_ns", "failed"])
        .join(producers.select("job_key", "group_key"), on="job_key", how="inner")
        .group_by("group_key")
        .agg(
            pl.col("start_ns").min().alias("started_ns"),
            # Ready when its successful runs ended (a batch may be split over several); failed runs
            # (a retried task's first tries) do not make it ready, and a job whose every run failed
            # is over when the last one ends.
            pl.coalesce(pl.col("end_ns").filter(~pl.col("failed")).max(), pl.col("end_ns").max()).alias(
                "ended_ns"
            ),
            pl.len().cast(pl.Int64).alias("runs"),
        )
    )
    standalone = (
        spans.filter(role == _STANDALONE)
        .group_by("job_key")
        .agg(
            pl.col("queue").first(),
            pl.col("trace_key").first(),
            pl.col("start_ns").min().alias("enqueued_ns"),
            pl.col("start_ns").min().alias("started_ns"),
            pl.col("end_ns").max().alias("ended_ns"),
            pl.lit(1, pl.Int64).alias("runs"),
        )
    )
    return pl.concat(
        [
            jobs.join(runs, on="group_key", how="left")
            .with_columns(pl.col("runs").fill_null(0))
            .select(empty_raw.columns),
            standalone.select(empty_raw.columns),
        ]
    ).cast(pl.Schema(empty_raw.schema))


def jobs_from_raw(frame: pl.DataFrame) -> pl.DataFrame:
    """Nanosecond producer/consumer times → per-job seconds. Pure."""
    if frame.is_empty():
        return empty(JOBS_SCHEMA)
    return frame.select(
        pl.col("queue").cast(pl.String),
        pl.col("trace_key").cast(pl.UInt64),
        pl.col("enqueued_ns").cast(pl.Int64).cast(pl.Datetime("ns", "UTC")).alias("enqueued"),
        ((pl.col("started_ns") - pl.col("enqueued_ns")).clip(lower_bound=0) / 1e9).alias("queue_wait_s"),
        ((pl.col("ended_ns") - pl.col("started_ns")).clip(lower_bound=0) / 1e9).alias("processing_s"),
        ((pl.col("ended_ns") - pl.col("enqueued_ns")).clip(lower_bound=0) / 1e9).alias("enqueue_to_ready_s"),
        pl.col("runs").cast(pl.Int64) if "runs" in frame.columns else pl.lit(1, pl.Int64).alias("runs"),
    ).cast(pl.Schema(JOBS_SCHEMA))


def cold_path_summary(
    jobs: pl.DataFrame, conventions: Conventions, baseline_jobs: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Per queue: jobs, completed, pending, enqueue-to-ready percentiles, starvation, and the same
    queue's jobs and percentiles over the baseline window (``baseline_jobs``, enqueued then). Pure."""
    base = _summary(baseline_jobs, conventions) if baseline_jobs is not None else empty(COLD_PATH_SCHEMA)
    return _with_baseline(_summary(jobs, conventions), base)


def _with_baseline(current: pl.DataFrame, base: pl.DataFrame) -> pl.DataFrame:
    base = base.select(
        "queue",
        pl.col("jobs").alias("baseline_jobs"),
        pl.col("p50_s").alias("baseline_p50_s"),
        pl.col("p99_s").alias("baseline_p99_s"),
        pl.col("queue_wait_p99_s").alias("baseline_queue_wait_p99_s"),
        pl.col("processing_p99_s").alias("baseline_processing_p99_s"),
    )
    return (
        current.select(_SUMMARY_COLUMNS)
        .join(base, on="queue", how="left")
        .sort("queue")
        .select(list(COLD_PATH_SCHEMA))
    )


_SUMMARY_QUANTILES = {"p50_s": 0.5, "p95_s": 0.95, "p99_s": 0.99, "p999_s": 0.999}


def _summary(jobs: pl.DataFrame, conventions: Conventions) -> pl.DataFrame:
    if jobs.is_empty():
        return empty(COLD_PATH_SCHEMA)
    done = pl.col("enqueue_to_ready_s").is_not_null()
    frame = jobs.group_by("queue").agg(
        pl.len().cast(pl.Int64).alias("jobs"),
        done.sum().cast(pl.Int64).alias("completed"),
        *percentile_exprs("enqueue_to_ready_s", _SUMMARY_QUANTILES),
        *percentile_exprs("queue_wait_s", {"queue_wait_p99_s": 0.99}),
        *percentile_exprs("processing_s", {"processing_p99_s": 0.99}),
        pl.col("runs").sum().cast(pl.Int64).alias("runs"),
        (pl.col("runs") > 1).sum().cast(pl.Int64).alias("retried_jobs"),
    )
    return _finish_summary(frame, conventions)


def _finish_summary(frame: pl.DataFrame, conventions: Conventions) -> pl.DataFrame:
    frame = frame.with_columns(
        (pl.col("jobs") - pl.col("completed")).alias("pending"),
        pl.when(pl.col("p50_s") > 0).then(pl.col("p99_s") / pl.col("p50_s")).alias("p99_over_p50"),
    ).with_columns((pl.col("p99_over_p50") > conventions.starvation_ratio).fill_null(False).alias("starved"))
    return (
        frame.sort("queue")
        .select(_SUMMARY_COLUMNS)
        .with_columns(
            pl.lit(None, COLD_PATH_SCHEMA[c]).alias(c) for c in COLD_PATH_SCHEMA if c.startswith("baseline_")
        )
    )


def _list_quantiles(column: str, quantiles: dict[str, float]) -> list[pl.Expr]:
    """:func:`analytics.stats.percentile_exprs` over the values of a list column."""
    return [
        pl.col(column)
        .list.eval(pl.element().quantile(q, interpolation=INTERPOLATION))
        .list.first()
        .alias(name)
        for name, q in quantiles.items()
    ]


def _per_queue(stats: pl.DataFrame) -> pl.DataFrame:
    return stats.group_by("queue").agg(
        pl.col("jobs").sum(),
        pl.col("runs").sum(),
        pl.col("retried_jobs").sum(),
        pl.col("ready_s").explode(),
        pl.col("wait_s").explode(),
        pl.col("processing_s").explode(),
    )


def cold_path_from_stats(
    stats: pl.DataFrame, conventions: Conventions, baseline_stats: pl.DataFrame | None = None
) -> pl.DataFrame:
    """:func:`cold_path_summary` from :data:`JOB_STATS_SCHEMA` rows instead of job rows. Pure."""

    def summary(frame: pl.DataFrame | None) -> pl.DataFrame:
        if frame is None or frame.is_empty():
            return empty(COLD_PATH_SCHEMA)
        per_queue = _per_queue(frame).with_columns(
            pl.col("ready_s").list.len().cast(pl.Int64).alias("completed"),
            *_list_quantiles("ready_s", _SUMMARY_QUANTILES),
            *_list_quantiles("wait_s", {"queue_wait_p99_s": 0.99}),
            *_list_quantiles("processing_s", {"processing_p99_s": 0.99}),
        )
        return _finish_summary(per_queue, conventions)

    return _with_baseline(summary(stats), summary(baseline_stats))


def cold_path_series_from_stats(stats: pl.DataFrame) -> pl.DataFrame:
    """:func:`cold_path_series` from :data:`JOB_STATS_SCHEMA` rows in the series' buckets. Pure."""
    if stats.is_empty():
        return empty(COLD_PATH_SERIES_SCHEMA)
    return (
        stats.with_columns(
            pl.col("bucket_ns").cast(pl.Datetime("ns", "UTC")).dt.cast_time_unit("us").alias("bucket_start"),
            pl.col("ready_s").list.len().cast(pl.Int64).alias("completed"),
            *_list_quantiles("ready_s", {"p50_s": 0.5, "p99_s": 0.99}),
            *_list_quantiles("wait_s", {"queue_wait_p50_s": 0.5}),
            *_list_quantiles("processing_s", {"processing_p50_s": 0.5}),
        )
        .with_columns((pl.col("jobs") - pl.col("completed")).alias("pending"))
        .sort("queue", "bucket_start")
        .select(list(COLD_PATH_SERIES_SCHEMA))
        .cast(pl.Schema(COLD_PATH_SERIES_SCHEMA))
    )


def cold_path_cdf_from_stats(
    stats: pl.DataFrame, points: int, baseline_stats: pl.DataFrame | None = None
) -> pl.DataFrame:
    """:func:`cold_path_cdf` from :data:`JOB_STATS_SCHEMA` rows. Pure."""

    def ready(frame: pl.DataFrame | None) -> pl.DataFrame | None:
        if frame is None:
            return None
        if frame.is_empty():
            return pl.DataFrame(schema={"queue": pl.String, "enqueue_to_ready_s": pl.Float64})
        return (
            _per_queue(frame)
            .select("queue", pl.col("ready_s").alias("enqueue_to_ready_s"))
            .explode("enqueue_to_ready_s")
        )

    current = ready(stats)
    assert current is not None
    return cold_path_cdf(current, points, ready(baseline_stats))


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


def cold_path_cdf(jobs: pl.DataFrame, points: int, baseline_jobs: pl.DataFrame | None = None) -> pl.DataFrame:
    """Per queue, the empirical CDF of enqueue-to-ready at ≤ ``points`` ranks, always including the
    fastest and the slowest job. Ranks are spaced evenly in log(1 − F) beyond the median so the
    tail — where starvation shows — keeps its resolution. With ``baseline_jobs``, the baseline
    window's CDF too (``window`` "baseline"), for the queues of the current window. Pure."""
    current = _cdf(jobs, points, "current")
    if baseline_jobs is None or current.is_empty():
        return current
    queues = current["queue"].unique().implode()
    baseline = _cdf(baseline_jobs.filter(pl.col("queue").is_in(queues)), points, "baseline")
    return pl.concat([current, baseline]).sort(
        "window", "queue", "enqueue_to_ready_s", "cdf", descending=[True, False, False, False]
    )


def _cdf(jobs: pl.DataFrame, points: int, window: str) -> pl.DataFrame:
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
                    "window": [window] * ranks.size,
                },
                schema=COLD_PATH_CDF_SCHEMA,
            )
        )
    if not frames:
        return empty(COLD_PATH_CDF_SCHEMA)
    # Ties in value keep their rank order: a sort on the value alone may swap them.
    return pl.concat(frames).sort("queue", "enqueue_to_ready_s", "cdf")
