"""Hot path: one row per request, then per-operation percentiles and time series (Polars).

A request is a trace with a hot-path root (service, operation, version, start, duration, abandoned;
read by :func:`analytics.llm_spans.fetch_roots`) and counts its synchronous LLM calls (the LLM spans
of :func:`analytics.llm_spans.fetch_llm_spans` on its request path). Both reads drop duplicate spans.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import numpy as np
import polars as pl

from analytics._common import Windows, empty, first_of_each, normalize
from analytics.ancestry import boundary_traces, without_queued_calls
from analytics.conventions import IS_HOT_ROOT, Conventions
from analytics.llm_calls import logical_calls, span_attempts
from analytics.llm_spans import fetch_llm_spans, fetch_roots
from analytics.stats import percentile_exprs
from analytics.trace_spans import fetch_structure
from collectors import TRACES_TABLE
from storage import Store

__all__ = [
    "HOT_PATH_SCHEMA",
    "HOT_PATH_SERIES_SCHEMA",
    "REQUESTS_SCHEMA",
    "fetch_requests",
    "hot_path_series",
    "hot_path_summary",
    "request_rows",
    "with_sync_llm_calls",
]

WINDOW = pl.Enum(["baseline", "current"])

REQUESTS_SCHEMA: dict[str, Any] = {
    # cityHash64(TraceId): shipping 64-bit keys instead of 32-char ids for every request keeps the
    # result narrow; the few tail traces get their ids back with their spans.
    "trace_key": pl.UInt64,
    # The key columns stay categorical: every metric groups the requests by them, and grouping by
    # integer codes costs a fraction of hashing strings. analyze() hands out plain strings.
    "service": pl.Categorical,
    "operation": pl.Categorical,
    "version": pl.Categorical,
    "start": pl.Datetime("ns", "UTC"),
    "duration_ms": pl.Float64,
    "abandoned": pl.Boolean,
    "sync_llm_calls": pl.Int64,
    "window": WINDOW,
}

HOT_PATH_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "requests": pl.Int64,
    "p50_ms": pl.Float64,
    "p95_ms": pl.Float64,
    "p99_ms": pl.Float64,
    "p999_ms": pl.Float64,
    "sync_llm_calls_per_request": pl.Float64,
}

HOT_PATH_SERIES_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "bucket_start": pl.Datetime("us", "UTC"),
    "requests": pl.Int64,
    "p50_ms": pl.Float64,
    "p95_ms": pl.Float64,
    "p99_ms": pl.Float64,
    "sync_llm_calls_per_request": pl.Float64,
}

_QUANTILES = {"p50_ms": 0.5, "p95_ms": 0.95, "p99_ms": 0.99, "p999_ms": 0.999}


def request_rows(roots: pl.DataFrame, windows: Windows) -> pl.DataFrame:
    """One row per hot-path request and window its root started in (both when the windows overlap),
    from the roots of :func:`analytics.llm_spans.fetch_roots` (one per trace); ``sync_llm_calls``
    comes from
    :func:`with_sync_llm_calls`. Pure."""
    start = pl.col("start").dt.epoch("ns")
    parts = [
        roots.filter((start >= pl.lit(lo).dt.epoch("ns")) & (start < pl.lit(hi).dt.epoch("ns"))).with_columns(
            pl.lit(name).cast(WINDOW).alias("window")
        )
        for name, lo, hi in (
            ("baseline", windows.baseline_start, windows.baseline_end),
            ("current", windows.start, windows.end),
        )
    ]
    return (
        pl.concat(parts)
        .with_columns(pl.lit(0, pl.Int64).alias("sync_llm_calls"))
        .select(list(REQUESTS_SCHEMA))
    )


def with_sync_llm_calls(requests: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """``sync_llm_calls`` per request: the logical LLM calls on its trace's request path (``calls``:
    ``trace_key`` and ``sync`` per call, :func:`analytics.llm_calls.logical_calls`; an application
    calling again after a failed call makes one call, not two). Pure."""
    # Each sync call finds its request rows by one join on the trace key, and the calls per row are a
    # bincount of those row numbers: half the time of grouping the calls by trace and joining the
    # counts back. A trace in both windows (overlapping windows) has a row in each; both count.
    rows = requests.select("trace_key").with_row_index("row")
    hits = rows.join(calls.filter(pl.col("sync")).select("trace_key"), on="trace_key", how="inner")
    per_row = np.bincount(hits["row"].to_numpy(), minlength=requests.height)
    return requests.with_columns(pl.Series("sync_llm_calls", per_row, dtype=pl.Int64)).select(
        list(REQUESTS_SCHEMA)
    )


def fetch_requests(store: Store, windows: Windows, conventions: Conventions) -> pl.DataFrame:
    """Requests (:data:`REQUESTS_SCHEMA`) with their synchronous LLM calls, read on their own."""
    roots = first_of_each(fetch_roots(store, windows, conventions), "trace_key")
    llm_spans = first_of_each(fetch_llm_spans(store, windows, conventions), "span_key")
    hot = roots["trace_key"]
    structure = fetch_structure(store, boundary_traces(llm_spans, hot), windows, conventions)
    llm_spans = without_queued_calls(llm_spans, structure, hot)
    calls = logical_calls(llm_spans, span_attempts(llm_spans), roots["trace_key"])
    return with_sync_llm_calls(request_rows(roots, windows), calls)


def hot_path_summary(requests: pl.DataFrame) -> pl.DataFrame:
    """Per (service, operation) of the current window: requests, exact p50/p95/p99/p999 (linear
    interpolation), synchronous LLM calls per request. Pure."""
    current = requests.filter(pl.col("window") == "current")
    if current.is_empty():
        return empty(HOT_PATH_SCHEMA)
    return (
        current.group_by("service", "operation")
        .agg(
            pl.len().cast(pl.Int64).alias("requests"),
            *percentile_exprs("duration_ms", _QUANTILES),
            pl.col("sync_llm_calls").mean().alias("sync_llm_calls_per_request"),
        )
        .sort("service", "operation")
        .select(list(HOT_PATH_SCHEMA))
    )


def hot_path_series(requests: pl.DataFrame, every: timedelta) -> pl.DataFrame:
    """Per (service, operation, time bucket of the current window): requests and percentiles. Pure."""
    current = requests.filter(pl.col("window") == "current")
    if current.is_empty():
        return empty(HOT_PATH_SERIES_SCHEMA)
    series_q = {k: v for k, v in _QUANTILES.items() if k != "p999_ms"}
    return (
        current.with_columns(pl.col("start").dt.truncate(every).dt.cast_time_unit("us").alias("bucket_start"))
        .group_by("service", "operation", "bucket_start")
        .agg(
            pl.len().cast(pl.Int64).alias("requests"),
            *percentile_exprs("duration_ms", series_q),
            pl.col("sync_llm_calls").mean().alias("sync_llm_calls_per_request"),
        )
        .sort("service", "operation", "bucket_start")
        .select(list(HOT_PATH_SERIES_SCHEMA))
    )


def latency_good_total_sql(table: str) -> str:
    return f"""
SELECT service, operation, toInt64(countIf(duration_ns < {{threshold_ns:Float64}})) AS good,
       toInt64(count()) AS total
FROM (
    SELECT ServiceName AS service, SpanName AS operation, Duration AS duration_ns
    FROM {table}
    WHERE Timestamp >= {{s:DateTime64(9)}} AND Timestamp < {{e:DateTime64(9)}} AND {IS_HOT_ROOT}
    LIMIT 1 BY TraceId, SpanId
)
GROUP BY service, operation
ORDER BY service, operation
"""


def latency_good_total(
    store: Store,
    start: datetime,
    end: datetime,
    threshold_ms: float,
    conventions: Conventions | None = None,
) -> pl.DataFrame:
    """Per (service, operation) of hot-path requests started in [start, end): ``good`` (faster than
    ``threshold_ms``) and ``total`` — the good/total pair of a latency SLO. One deduplicated GROUP BY."""
    conv = conventions or Conventions()
    windows = Windows.of(start, end)
    params = {
        **conv.sql_parameters(),
        "s": windows.start,
        "e": windows.end,
        "threshold_ns": float(threshold_ms) * 1e6,
    }
    frame = normalize(store.query_polars(latency_good_total_sql(store.table(TRACES_TABLE)), params))
    schema = {"service": pl.String, "operation": pl.String, "good": pl.Int64, "total": pl.Int64}
    if frame.is_empty():
        return empty(schema)
    return frame.cast(pl.Schema(schema))
