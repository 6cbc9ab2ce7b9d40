"""Hot path: one row per request (SQL), then per-operation percentiles and time series (Polars).

The SQL reduces every trace to its hot-path root (service, operation, version, start, duration,
abandoned) and its synchronous LLM calls, in one GROUP BY TraceId over both windows: duplicates of a
span collapse inside the group (``anyIf`` for the root, ``uniqExactIf(SpanId)`` for LLM calls), and
only the request rows travel to Python.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import polars as pl

from analytics._common import Windows, empty, normalize
from analytics.conventions import (
    ABANDONED,
    IS_COLD_MARKED,
    IS_HOT_ROOT,
    IS_LLM,
    KIND,
    MAYBE_LLM,
    VERSION,
    Conventions,
)
from analytics.stats import percentile_exprs
from collectors.schema import TRACES_TABLE
from collectors.store import Store

__all__ = [
    "HOT_PATH_SCHEMA",
    "HOT_PATH_SERIES_SCHEMA",
    "REQUESTS_SCHEMA",
    "fetch_requests",
    "hot_path_series",
    "hot_path_summary",
    "requests_sql",
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


def requests_sql(table: str) -> str:
    """One row per hot-path request started in either window (``window`` = current | baseline)."""
    return f"""
-- Repeated strings travel as Arrow dictionaries (LowCardinality): the result has a row per request.
SELECT trace_key, toLowCardinality(service) AS service, toLowCardinality(operation) AS operation,
       toLowCardinality(version) AS version, start, duration_ms, abandoned, sync_llm_calls,
       toLowCardinality(w) AS window
FROM (
    SELECT
        trace_key,
        anyIf(ServiceName, is_root) AS service,
        anyIf(SpanName, is_root) AS operation,
        anyIf(version, is_root) AS version,
        minIf(Timestamp, is_root) AS start,
        anyIf(Duration, is_root) / 1e6 AS duration_ms,
        maxIf(is_abandoned, is_root) AS abandoned,
        toInt64(uniqExactIf(span_key, is_sync_llm)) AS sync_llm_calls,
        countIf(is_root) AS roots
    FROM (
        SELECT
            ServiceName, SpanName, Timestamp, Duration,
            -- 64-bit hashes as group keys: hashing 32-char ids once is far cheaper than string
            -- hash tables over millions of traces.
            cityHash64(TraceId) AS trace_key, cityHash64(SpanId) AS span_key,
            {IS_HOT_ROOT} AS is_root,
            if(is_root, {VERSION}, '') AS version,
            is_root AND {ABANDONED} AS is_abandoned,
            -- Synchronous: in the request's own trace (parent links), not marked cold, not a
            -- message consumer (queued work parented to its producer is not on the request path).
            NOT is_root AND {IS_LLM} AND NOT {IS_COLD_MARKED} AND {KIND} != 'Consumer' AS is_sync_llm
        FROM {table}
        -- Roots and possible LLM spans only: the attribute maps of other spans are never read.
        PREWHERE ParentSpanId = '' OR {MAYBE_LLM}
        WHERE ((Timestamp >= {{s:DateTime64(9)}} AND Timestamp < {{e_m:DateTime64(9)}})
           OR (Timestamp >= {{bs:DateTime64(9)}} AND Timestamp < {{be_m:DateTime64(9)}}))
          AND (is_root OR is_sync_llm)
    )
    GROUP BY trace_key
    HAVING roots > 0
)
ARRAY JOIN arrayFilter(x -> x != '', [
    if(start >= {{s:DateTime64(9)}} AND start < {{e:DateTime64(9)}}, 'current', ''),
    if(start >= {{bs:DateTime64(9)}} AND start < {{be:DateTime64(9)}}, 'baseline', '')
]) AS w
"""


def fetch_requests(store: Store, windows: Windows, conventions: Conventions) -> pl.DataFrame:
    params = {**conventions.sql_parameters(), **windows.params(conventions)}
    frame = store.query_polars(
        requests_sql(store.table(TRACES_TABLE)),
        params,
        settings={"output_format_arrow_low_cardinality_as_dictionary": 1},
    )
    if frame.is_empty():
        return empty(REQUESTS_SCHEMA)
    # normalize() would turn the dictionaries into strings: only the timestamp needs it here.
    frame = frame.with_columns(normalize(frame.select("start")))
    return frame.with_columns(
        pl.col("service", "operation", "version").cast(pl.Categorical),
        pl.col("window").cast(pl.String).cast(WINDOW),
        pl.col("abandoned").cast(pl.Boolean),
        pl.col("sync_llm_calls").cast(pl.Int64),
        pl.col("start").dt.cast_time_unit("ns"),
        pl.col("trace_key").cast(pl.UInt64),
    ).select(list(REQUESTS_SCHEMA))


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
