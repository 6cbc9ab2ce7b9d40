"""Hot path: one row per request, then per-operation percentiles and time series (Polars).

A request is a trace with a hot-path root (service, operation, version, start, duration, abandoned;
read by :func:`analytics.llm_spans.fetch_roots`) and counts its synchronous LLM calls (the LLM spans
of :func:`analytics.llm_spans.fetch_llm_spans` on its request path). Both reads drop duplicate spans.

In sampled data each request carries a ``weight``, the number of requests its root span stands for
(:data:`analytics.conventions.WEIGHT`). Counts are sums of weights and percentiles are those of the
population the weights describe (:func:`weighted_quantiles`); where every weight is 1 the exact
percentiles of the unsampled code path are kept, so unsampled answers do not change. Beside each
figure: the stored requests behind it, Kish's effective sample size and how many stored requests lie
at or above the p99 (:func:`request_stats`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import polars as pl

from analytics._common import Windows, empty, first_of_each, normalize
from analytics.ancestry import boundary_traces, without_queued_calls
from analytics.conventions import IS_HOT_ROOT, WEIGHT, Conventions
from analytics.llm_calls import logical_calls, span_attempts
from analytics.llm_spans import fetch_llm_spans, fetch_roots
from analytics.stats import INTERPOLATION, percentile_exprs
from analytics.trace_spans import fetch_structure
from collectors import TRACES_TABLE, inspect_traces
from storage import Store

__all__ = [
    "HOT_PATH_SCHEMA",
    "HOT_PATH_SERIES_SCHEMA",
    "REQUESTS_SCHEMA",
    "fetch_requests",
    "first_byte_stats",
    "hot_path_series",
    "hot_path_summary",
    "is_weighted",
    "request_rows",
    "request_stats",
    "weighted_quantiles",
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
    "weight": pl.Float64,  # requests the root stands for: 1.0 unless sampled
    "sync_llm_calls": pl.Int64,
    # Time to the response's first byte where the server marks it (a streamed endpoint's user sees
    # this, not the duration; null without a mark), and whether the body went out in several sends.
    "first_byte_ms": pl.Float64,
    "streamed": pl.Boolean,
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
    # Behind the figures (docs/analytics.md, "Sampled data"): ``requests`` is the weighted count,
    # these are the stored requests, Kish's effective sample size (Σw)²/Σw² (= the stored count when
    # the weights are equal), the stored requests at or above the p99, and whether that p99 of
    # sampled data rests on fewer than ``min_sampled_tail`` of them.
    "sampled_requests": pl.Int64,
    "effective_sample_size": pl.Float64,
    "p99_tail_samples": pl.Int64,
    "p99_warning": pl.Boolean,
    # Streamed endpoints: the requests whose server marked its first byte, those streamed, and the
    # time to first byte's percentiles (null where no request has a mark).
    "first_byte_requests": pl.Int64,
    "streamed_requests": pl.Int64,
    "ttfb_p50_ms": pl.Float64,
    "ttfb_p99_ms": pl.Float64,
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
    "sampled_requests": pl.Int64,
    "ttfb_p99_ms": pl.Float64,  # of the bucket's requests with a first byte (streamed endpoints)
}

_QUANTILES = {"p50_ms": 0.5, "p95_ms": 0.95, "p99_ms": 0.99, "p999_ms": 0.999}
FIRST_BYTE_QUANTILES = {"ttfb_p50_ms": 0.5, "ttfb_p99_ms": 0.99}


def request_rows(roots: pl.DataFrame, windows: Windows) -> pl.DataFrame:
    """One row per hot-path request and window its root started in (both when the windows overlap),
    from the roots of :func:`analytics.llm_spans.fetch_roots` (one per trace); ``sync_llm_calls``
    comes from
    :func:`with_sync_llm_calls`. Pure."""
    if "weight" not in roots.columns:
        roots = roots.with_columns(pl.lit(1.0, pl.Float64).alias("weight"))
    if "first_byte_ms" not in roots.columns:
        roots = roots.with_columns(pl.lit(None, pl.Float64).alias("first_byte_ms"))
    if "streamed" not in roots.columns:
        roots = roots.with_columns(pl.lit(False).alias("streamed"))
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


# --- weights (sampled data) ------------------------------------------------------------------


def is_weighted(frame: pl.DataFrame) -> bool:
    """Whether any request of ``frame`` stands for other than exactly one (a ``weight`` ≠ 1). Frames
    without the column (hand-built ones, older callers) are unweighted. Pure."""
    return "weight" in frame.columns and bool((frame["weight"].fill_null(1.0) != 1.0).any())


def weighted_quantiles(
    values: np.ndarray, weights: np.ndarray, bounds: np.ndarray, quantiles: Sequence[float]
) -> np.ndarray:
    """Per group, the type-7 quantiles of the population the weights describe: ``values`` sorted
    within each group, groups contiguous, ``bounds`` their first rows plus the length at the end.
    Result: one row per group, one column per quantile. Pure.

    A request of weight w counts as w requests of its latency (a 1-in-10 sample's request as ten),
    so with W the group's total weight, position h = (W − 1)·q of the expanded population is read
    from the cumulative weights and interpolated linearly with the next position, as numpy's default
    interpolates between ranks: with every weight 1 this is exactly the unweighted type 7. Weights
    need not be integers (1/p of a sampling threshold). One cumulative sum over all groups and a
    binary search per group and quantile, instead of a window function over many small groups.
    """
    cum = np.cumsum(weights, dtype=np.float64)
    first, end = bounds[:-1], bounds[1:]
    before = np.where(first > 0, cum[np.maximum(first - 1, 0)], 0.0)
    total = cum[end - 1] - before
    out = np.empty((first.size, len(quantiles)), dtype=np.float64)
    for j, q in enumerate(quantiles):
        h = np.maximum((total - 1.0) * q, 0.0)
        lo = np.floor(h)
        # The row holding expanded position k is the first whose cumulative weight exceeds k.
        i_lo = np.clip(np.searchsorted(cum, before + lo, side="right"), first, end - 1)
        i_hi = np.clip(np.searchsorted(cum, before + lo + 1.0, side="right"), first, end - 1)
        out[:, j] = values[i_lo] + (h - lo) * (values[i_hi] - values[i_lo])
    return out


def request_stats(
    requests: pl.DataFrame, keys: Sequence[str], quantiles: dict[str, float], min_sampled_tail: int
) -> pl.DataFrame:
    """Per group of ``keys``: ``requests`` (the weighted count, rounded), the named percentiles of
    ``duration_ms``, ``sync_llm_calls_per_request`` (weighted mean; when the column is there),
    ``sampled_requests``, ``effective_sample_size``, ``p99_tail_samples`` and ``p99_warning`` (see
    :data:`HOT_PATH_SCHEMA`). Unweighted requests take the exact percentiles of Polars, as before
    sampling was read; weighted ones :func:`weighted_quantiles`. Pure."""
    calls = "sync_llm_calls" in requests.columns
    p99 = pl.col("duration_ms").quantile(0.99, interpolation=INTERPOLATION)
    if not is_weighted(requests):
        return requests.group_by(*keys).agg(
            pl.len().cast(pl.Int64).alias("requests"),
            *percentile_exprs("duration_ms", quantiles),
            *([pl.col("sync_llm_calls").mean().alias("sync_llm_calls_per_request")] if calls else []),
            pl.len().cast(pl.Int64).alias("sampled_requests"),
            pl.len().cast(pl.Float64).alias("effective_sample_size"),
            (pl.col("duration_ms") >= p99).sum().cast(pl.Int64).alias("p99_tail_samples"),
            pl.lit(False).alias("p99_warning"),
        )
    ordered = requests.with_columns(pl.col("weight").fill_null(1.0)).sort(*keys, "duration_ms")
    ids = ordered.select(pl.struct(*keys).rle_id()).to_series().to_numpy()
    first = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    bounds = np.r_[first, ordered.height]
    values = ordered["duration_ms"].to_numpy()
    weights = ordered["weight"].to_numpy()
    names = list(quantiles)
    found = weighted_quantiles(values, weights, bounds, [*quantiles.values(), 0.99])
    total = np.add.reduceat(weights, first)
    stored = np.diff(bounds)
    p99_rows = np.repeat(found[:, -1], stored)
    tail = np.add.reduceat((values >= p99_rows).astype(np.int64), first)
    sampled = np.maximum.reduceat(weights, first) > 1.0
    columns: list[pl.Series] = [
        pl.Series("requests", np.rint(total), dtype=pl.Float64).cast(pl.Int64),
        *(pl.Series(name, found[:, j], dtype=pl.Float64) for j, name in enumerate(names)),
    ]
    if calls:
        weighted_calls = np.add.reduceat(weights * ordered["sync_llm_calls"].to_numpy(), first)
        columns.append(pl.Series("sync_llm_calls_per_request", weighted_calls / total, dtype=pl.Float64))
    columns += [
        pl.Series("sampled_requests", stored, dtype=pl.Int64),
        pl.Series("effective_sample_size", total**2 / np.add.reduceat(weights**2, first), dtype=pl.Float64),
        pl.Series("p99_tail_samples", tail, dtype=pl.Int64),
        pl.Series("p99_warning", sampled & (tail < min_sampled_tail), dtype=pl.Boolean),
    ]
    return ordered[first].select(*keys).with_columns(columns)


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


def first_byte_stats(requests: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """Per group of ``keys``: ``first_byte_requests`` and ``streamed_requests`` (weighted counts,
    rounded) and the time to first byte's ``ttfb_p50_ms``/``ttfb_p99_ms`` over the requests with
    one (null where none has). Pure."""
    w = pl.col("weight").fill_null(1.0) if "weight" in requests.columns else pl.lit(1.0)
    marked = pl.col("first_byte_ms").is_not_null()
    counts = requests.group_by(*keys).agg(
        w.filter(marked).sum().round().cast(pl.Int64).alias("first_byte_requests"),
        w.filter(pl.col("streamed").fill_null(False)).sum().round().cast(pl.Int64).alias("streamed_requests"),
    )
    with_mark = requests.filter(marked).with_columns(pl.col("first_byte_ms").alias("duration_ms"))
    if with_mark.is_empty():
        return counts.with_columns(pl.lit(None, pl.Float64).alias(c) for c in FIRST_BYTE_QUANTILES)
    quantiles = request_stats(with_mark.drop("sync_llm_calls", strict=False), keys, FIRST_BYTE_QUANTILES, 0)
    return counts.join(quantiles.select(*keys, *FIRST_BYTE_QUANTILES), on=list(keys), how="left")


def hot_path_summary(requests: pl.DataFrame, min_sampled_tail: int = 10) -> pl.DataFrame:
    """Per (service, operation) of the current window: requests, exact p50/p95/p99/p999 (linear
    interpolation; of the weighted population in sampled data), synchronous LLM calls per request
    and the sample behind them (:func:`request_stats`), the time to first byte
    (:func:`first_byte_stats`). Pure."""
    current = requests.filter(pl.col("window") == "current")
    if current.is_empty():
        return empty(HOT_PATH_SCHEMA)
    if "first_byte_ms" not in current.columns:
        current = current.with_columns(
            pl.lit(None, pl.Float64).alias("first_byte_ms"), pl.lit(False).alias("streamed")
        )
    keys = ["service", "operation"]
    return (
        request_stats(current, keys, _QUANTILES, min_sampled_tail)
        .join(first_byte_stats(current, keys), on=keys, how="left")
        .sort("service", "operation")
        .select(list(HOT_PATH_SCHEMA))
    )


def hot_path_series(requests: pl.DataFrame, every: timedelta, min_sampled_tail: int = 10) -> pl.DataFrame:
    """Per (service, operation, time bucket of the current window): requests and percentiles
    (weighted in sampled data) and the stored requests behind them. Pure."""
    current = requests.filter(pl.col("window") == "current")
    if current.is_empty():
        return empty(HOT_PATH_SERIES_SCHEMA)
    series_q = {k: v for k, v in _QUANTILES.items() if k != "p999_ms"}
    bucketed = current.with_columns(
        pl.col("start").dt.truncate(every).dt.cast_time_unit("us").alias("bucket_start")
    )
    if "first_byte_ms" not in bucketed.columns:
        bucketed = bucketed.with_columns(
            pl.lit(None, pl.Float64).alias("first_byte_ms"), pl.lit(False).alias("streamed")
        )
    keys = ["service", "operation", "bucket_start"]
    return (
        request_stats(bucketed, keys, series_q, min_sampled_tail)
        .join(first_byte_stats(bucketed, keys).select(*keys, "ttfb_p99_ms"), on=keys, how="left")
        .sort("service", "operation", "bucket_start")
        .select(list(HOT_PATH_SERIES_SCHEMA))
    )


def latency_good_total_sql(table: str, rounded: bool = True) -> str:
    good, total = "sumIf(weight, duration_ns < {threshold_ns:Float64})", "sum(weight)"
    if rounded:
        good, total = f"toInt64(round({good}))", f"toInt64(round({total}))"
    return f"""
SELECT service, operation, {good} AS good, {total} AS total
FROM (
    -- Sampled data: each root counts as the requests it stands for (a sum of 1.0s is the count).
    SELECT ServiceName AS service, SpanName AS operation, Duration AS duration_ns, {WEIGHT} AS weight
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
    *,
    rounded: bool = True,
) -> pl.DataFrame:
    """Per (service, operation) of hot-path requests started in [start, end): ``good`` (faster than
    ``threshold_ms``) and ``total`` — the good/total pair of a latency SLO, weighted by the sample rate
    in sampled data (rounded, unless ``rounded`` is False: sums of parts to add up). One deduplicated
    GROUP BY of the spans."""
    conv = conventions or Conventions()
    windows = Windows.of(start, end)
    params = {
        **conv.sql_parameters(),
        "s": windows.start,
        "e": windows.end,
        "threshold_ns": float(threshold_ms) * 1e6,
    }
    frame = normalize(
        store.query_polars(
            inspect_traces(store).adapt(latency_good_total_sql(store.table(TRACES_TABLE), rounded)), params
        )
    )
    count = pl.Int64 if rounded else pl.Float64
    schema = {"service": pl.String, "operation": pl.String, "good": count, "total": count}
    if frame.is_empty():
        return empty(schema)
    return frame.cast(pl.Schema(schema))
