"""Per-minute aggregates: what a long window's hot-path metrics are merged from.

Every summarised minute (:mod:`analytics.summaries`) also writes, per (minute, service, operation,
version), the mergeable state of the hot-path metrics to ``tailwatch_agg_requests``:

=================  =========================================================================
state              merges by
=================  =========================================================================
``requests``       sum — stored requests
``weight``         sum — Σw, the requests they stand for (sampled data; 1 each otherwise)
``weight_sq``      sum — Σw², for Kish's effective sample size (Σw)²/Σw²
``weight_min/max`` min / max — whether the data is sampled at all
``sync_llm_calls`` sum — Σ w·(synchronous LLM calls of the request)
``abandoned``      sum — Σ w over abandoned requests
``lat_*``          sum per bucket — latency in log buckets (:mod:`analytics.sketch`): Σw and the
                   stored count per bucket
``ab_*``           sum per bucket — per ``bucket_ms`` bucket of latency: Σw, Σw², Σw abandoned,
                   stored count (the abandonment curve, exact; the latency is the time to first
                   byte for the operations ``abandonment_latency`` says so)
``first_byte``     sum — Σ w over requests whose server marked its first byte
``streamed``       sum — Σ w over requests whose body went out in several sends
``fb_*``           sum per bucket — time to first byte in log buckets, as ``lat_*``
=================  =========================================================================

A window's whole minutes merge in ClickHouse (``GROUP BY`` over ``ARRAY JOIN`` of the bucket arrays:
one row per operation and bucket comes back, whatever the traffic); the requests of its partly
covered minutes are bucketed here the same way and added. The metric functions below read the
merged state only. Counts, sums, rates, the abandonment curve and its cliff are exact; percentiles
are within :data:`analytics.sketch.RELATIVE_ERROR` (0.5%) of the exact ones.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import numpy as np
import polars as pl

from analytics._common import empty
from analytics.abandonment import (
    ABANDONMENT_SCHEMA,
    ABANDONMENT_SUMMARY_SCHEMA,
    abandonment_latency_ms,
    cliff,
    latency_read,
)
from analytics.boundary import OperationSample
from analytics.conventions import Conventions
from analytics.hot_path import (
    FIRST_BYTE_QUANTILES,
    HOT_PATH_SCHEMA,
    HOT_PATH_SERIES_SCHEMA,
    weighted_quantiles,
)
from analytics.sketch import bucket_expr, bucket_value_expr
from analytics.stats import wilson_interval

__all__ = [
    "ABANDONMENT_STATE_SCHEMA",
    "AGG_REQUESTS_SCHEMA",
    "COUNTERFACTUAL_STATE_SCHEMA",
    "LATENCY_STATE_SCHEMA",
    "TOTALS_STATE_SCHEMA",
    "VERSION_LATENCY_STATE_SCHEMA",
    "abandonment_from_state",
    "abandonment_state",
    "abandonment_summary_from_state",
    "aggregate_requests",
    "boundary_samples",
    "counterfactual_state",
    "hot_path_from_state",
    "hot_path_series_from_state",
    "latency_state",
    "tail_stats_from_state",
    "totals_state",
    "version_latency_state",
]

_KEYS = ["service", "operation", "version"]

AGG_REQUESTS_SCHEMA: dict[str, Any] = {
    "start": pl.Datetime("ns", "UTC"),  # the minute
    "service": pl.String,
    "operation": pl.String,
    "version": pl.String,
    "bucket_ms": pl.UInt32,
    "requests": pl.UInt64,
    "weight": pl.Float64,
    "weight_sq": pl.Float64,
    "weight_min": pl.Float64,
    "weight_max": pl.Float64,
    "sync_llm_calls": pl.Float64,
    "abandoned": pl.Float64,
    "lat_bucket": pl.List(pl.Int16),
    "lat_weight": pl.List(pl.Float64),
    "lat_n": pl.List(pl.UInt64),
    "ab_bucket": pl.List(pl.Int64),
    "ab_weight": pl.List(pl.Float64),
    "ab_weight_sq": pl.List(pl.Float64),
    "ab_abandoned": pl.List(pl.Float64),
    "ab_n": pl.List(pl.UInt64),
    "cf_calls": pl.List(pl.UInt16),
    "cf_bucket": pl.List(pl.Int16),
    "cf_weight": pl.List(pl.Float64),
    "cf_n": pl.List(pl.UInt64),
    "first_byte": pl.Float64,
    "streamed": pl.Float64,
    "fb_bucket": pl.List(pl.Int16),
    "fb_weight": pl.List(pl.Float64),
    "fb_n": pl.List(pl.UInt64),
}

# The merged state a window's metrics read: per group (``service``, ``operation`` and the group's
# own keys, e.g. a series bucket) and bucket.
TOTALS_STATE_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "requests": pl.Int64,
    "weight": pl.Float64,
    "weight_sq": pl.Float64,
    "weight_min": pl.Float64,
    "weight_max": pl.Float64,
    "sync_llm_calls": pl.Float64,
    "abandoned": pl.Float64,
    "first_byte": pl.Float64,
    "streamed": pl.Float64,
}
LATENCY_STATE_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "bucket": pl.Int16,
    "weight": pl.Float64,
    "n": pl.Int64,
}
ABANDONMENT_STATE_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "bucket": pl.Int64,
    "weight": pl.Float64,
    "weight_sq": pl.Float64,
    "abandoned": pl.Float64,
    "n": pl.Int64,
}


def aggregate_requests(
    requests: pl.DataFrame, conventions: Conventions, walked: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Per (minute, service, operation, version) of ``requests`` (the stored request rows: ``start``,
    ``trace_key``, the keys, ``duration_ms``, ``abandoned``, ``weight``, ``sync_llm_calls``,
    ``sync_llm_ms``, ``first_byte_ms``, ``streamed``): the aggregate row
    (:data:`AGG_REQUESTS_SCHEMA`; abandonment buckets of the conventions' ``bucket_ms`` and
    ``abandonment_latency``). ``walked`` (``trace_key``, ``llm_ns``): the LLM time on the critical
    path of the traces walked when the minute was summarised, which the counterfactual takes where
    it is less than the union of the calls (as :func:`analytics.boundary.with_critical_path`). Pure."""
    if requests.is_empty():
        return empty(AGG_REQUESTS_SCHEMA)
    keys = ["start", *_KEYS]
    bucket_ms = conventions.bucket_ms
    w = pl.col("w")
    abandonment_ms = abandonment_latency_ms(requests, conventions)
    sync_ms = pl.col("sync_llm_ms").fill_null(0.0)
    if walked is not None and not walked.is_empty():
        requests = requests.join(
            walked.select("trace_key", (pl.col("llm_ns") / 1e6).alias("_walked_ms")),
            on="trace_key",
            how="left",
        )
        sync_ms = pl.min_horizontal(sync_ms, pl.col("_walked_ms").fill_null(math.inf))
    rows = requests.select(
        pl.col("start").cast(pl.Datetime("ns", "UTC")).dt.truncate("1m"),
        pl.col(*_KEYS).cast(pl.String),
        pl.col("weight").fill_null(1.0).alias("w"),
        pl.col("abandoned").fill_null(False),
        pl.col("sync_llm_calls").cast(pl.Float64),
        bucket_expr("duration_ms").alias("lat"),
        (abandonment_ms // bucket_ms).cast(pl.Int64).alias("ab"),
        pl.col("sync_llm_calls").cast(pl.UInt16).alias("calls"),
        (pl.col("duration_ms") - sync_ms).alias("_cf"),
        pl.col("first_byte_ms"),
        pl.col("streamed").fill_null(False),
    ).with_columns(bucket_expr("_cf").alias("cf"), bucket_expr("first_byte_ms").alias("fb"))
    totals = rows.group_by(keys).agg(
        pl.len().cast(pl.UInt64).alias("requests"),
        w.sum().alias("weight"),
        (w * w).sum().alias("weight_sq"),
        w.min().alias("weight_min"),
        w.max().alias("weight_max"),
        (w * pl.col("sync_llm_calls")).sum().alias("sync_llm_calls"),
        w.filter(pl.col("abandoned")).sum().alias("abandoned"),
        w.filter(pl.col("first_byte_ms").is_not_null()).sum().alias("first_byte"),
        w.filter(pl.col("streamed")).sum().alias("streamed"),
    )
    latency = (
        rows.group_by(*keys, "lat")
        .agg(w.sum().alias("lat_weight"), pl.len().cast(pl.UInt64).alias("lat_n"))
        .sort("lat")
        .group_by(keys)
        .agg(pl.col("lat").alias("lat_bucket"), "lat_weight", "lat_n")
    )
    abandonment = (
        rows.group_by(*keys, "ab")
        .agg(
            w.sum().alias("ab_weight"),
            (w * w).sum().alias("ab_weight_sq"),
            w.filter(pl.col("abandoned")).sum().alias("ab_abandoned"),
            pl.len().cast(pl.UInt64).alias("ab_n"),
        )
        .sort("ab")
        .group_by(keys)
        .agg(pl.col("ab").alias("ab_bucket"), "ab_weight", "ab_weight_sq", "ab_abandoned", "ab_n")
    )
    # The latency without the synchronous calls, per number of calls: the replacement time of
    # each removed call (a convention) is added when read.
    counterfactual = (
        rows.group_by(*keys, "calls", "cf")
        .agg(w.sum().alias("cf_weight"), pl.len().cast(pl.UInt64).alias("cf_n"))
        .sort("calls", "cf")
        .group_by(keys)
        .agg(pl.col("calls").alias("cf_calls"), pl.col("cf").alias("cf_bucket"), "cf_weight", "cf_n")
    )
    first_byte = (
        rows.filter(pl.col("first_byte_ms").is_not_null())
        .group_by(*keys, "fb")
        .agg(w.sum().alias("fb_weight"), pl.len().cast(pl.UInt64).alias("fb_n"))
        .sort("fb")
        .group_by(keys)
        .agg(pl.col("fb").alias("fb_bucket"), "fb_weight", "fb_n")
    )
    return (
        totals.join(latency, on=keys, how="left")
        .join(abandonment, on=keys, how="left")
        .join(counterfactual, on=keys, how="left")
        .join(first_byte, on=keys, how="left")
        .with_columns(
            # An empty histogram, not a null one, where no request of the group marks a first byte.
            pl.col("fb_bucket").fill_null(pl.lit([], pl.List(pl.Int16))),
            pl.col("fb_weight").fill_null(pl.lit([], pl.List(pl.Float64))),
            pl.col("fb_n").fill_null(pl.lit([], pl.List(pl.UInt64))),
        )
        .with_columns(pl.lit(bucket_ms, pl.UInt32).alias("bucket_ms"))
        .sort(keys)
        .select(list(AGG_REQUESTS_SCHEMA))
        .cast(pl.Schema(AGG_REQUESTS_SCHEMA))
    )


# --- the state of request rows, as the SQL merge returns it for whole minutes ---------------------


def _rows(requests: pl.DataFrame, extra: list[pl.Expr]) -> pl.DataFrame:
    if "first_byte_ms" not in requests.columns:
        requests = requests.with_columns(
            pl.lit(None, pl.Float64).alias("first_byte_ms"), pl.lit(False).alias("streamed")
        )
    return requests.select(
        pl.col("service", "operation").cast(pl.String),
        *extra,
        pl.col("weight").fill_null(1.0).alias("w"),
        pl.col("abandoned").fill_null(False),
        pl.col("sync_llm_calls").cast(pl.Float64),
        pl.col("duration_ms"),
        pl.col("first_byte_ms"),
        pl.col("streamed").fill_null(False),
    )


def totals_state(requests: pl.DataFrame, group: list[pl.Expr] | None = None) -> pl.DataFrame:
    """:data:`TOTALS_STATE_SCHEMA` (plus the ``group`` columns) of request rows. Pure."""
    extra = group or []
    rows = _rows(requests, extra)
    w = pl.col("w")
    return rows.group_by("service", "operation", *(e.meta.output_name() for e in extra)).agg(
        pl.len().cast(pl.Int64).alias("requests"),
        w.sum().alias("weight"),
        (w * w).sum().alias("weight_sq"),
        w.min().alias("weight_min"),
        w.max().alias("weight_max"),
        (w * pl.col("sync_llm_calls")).sum().alias("sync_llm_calls"),
        w.filter(pl.col("abandoned")).sum().alias("abandoned"),
        w.filter(pl.col("first_byte_ms").is_not_null()).sum().alias("first_byte"),
        w.filter(pl.col("streamed")).sum().alias("streamed"),
    )


def latency_state(
    requests: pl.DataFrame, group: list[pl.Expr] | None = None, column: str = "duration_ms"
) -> pl.DataFrame:
    """:data:`LATENCY_STATE_SCHEMA` (plus the ``group`` columns) of request rows: the histogram of
    ``column`` (``first_byte_ms``: of the requests with a first byte). Pure."""
    extra = group or []
    rows = _rows(requests, extra).filter(pl.col(column).is_not_null())
    rows = rows.with_columns(bucket_expr(column).alias("bucket"))
    return rows.group_by("service", "operation", *(e.meta.output_name() for e in extra), "bucket").agg(
        pl.col("w").sum().alias("weight"), pl.len().cast(pl.Int64).alias("n")
    )


def abandonment_state(requests: pl.DataFrame, conventions: Conventions) -> pl.DataFrame:
    """:data:`ABANDONMENT_STATE_SCHEMA` of request rows. Pure."""
    rows = _rows(requests, [])
    rows = rows.with_columns(
        (abandonment_latency_ms(rows, conventions) // conventions.bucket_ms).cast(pl.Int64).alias("bucket")
    )
    w = pl.col("w")
    return rows.group_by("service", "operation", "bucket").agg(
        w.sum().alias("weight"),
        (w * w).sum().alias("weight_sq"),
        w.filter(pl.col("abandoned")).sum().alias("abandoned"),
        pl.len().cast(pl.Int64).alias("n"),
    )


VERSION_LATENCY_STATE_SCHEMA: dict[str, Any] = {**LATENCY_STATE_SCHEMA, "version": pl.String}
COUNTERFACTUAL_STATE_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "calls": pl.Int64,
    "bucket": pl.Int16,
    "weight": pl.Float64,
    "n": pl.Int64,
}


def version_latency_state(requests: pl.DataFrame) -> pl.DataFrame:
    """:data:`VERSION_LATENCY_STATE_SCHEMA` of request rows. Pure."""
    return latency_state(requests, [pl.col("version").cast(pl.String)])


def counterfactual_state(requests: pl.DataFrame) -> pl.DataFrame:
    """:data:`COUNTERFACTUAL_STATE_SCHEMA` of request rows (with ``sync_llm_ms``): the latency without
    the synchronous LLM calls (the union of their intervals) per number of calls. Pure."""
    rows = requests.select(
        pl.col("service", "operation").cast(pl.String),
        pl.col("sync_llm_calls").cast(pl.Int64).alias("calls"),
        pl.col("weight").fill_null(1.0).alias("w"),
        bucket_expr(pl.col("duration_ms") - pl.col("sync_llm_ms").fill_null(0.0)).alias("bucket"),
    )
    return rows.group_by("service", "operation", "calls", "bucket").agg(
        pl.col("w").sum().alias("weight"), pl.len().cast(pl.Int64).alias("n")
    )


def boundary_samples(
    totals: pl.DataFrame, versions: pl.DataFrame, without: pl.DataFrame, replacement_ms: float
) -> dict[tuple[str, str], tuple[OperationSample, np.ndarray]]:
    """Per operation, the :class:`analytics.boundary.OperationSample` of merged state (totals,
    latency per version, counterfactual per number of calls) and its stored requests per latency
    value: what :func:`analytics.boundary.boundary_of` reads. Pure."""
    merged = totals.group_by("service", "operation").agg(
        pl.col("requests").sum(),
        pl.col("weight").sum(),
        pl.col("weight_sq").sum(),
        pl.col("weight_min").min(),
        pl.col("weight_max").max(),
        pl.col("sync_llm_calls").sum(),
    )
    by_version = versions.group_by("service", "operation", "version", "bucket").agg(
        pl.col("weight", "n").sum()
    )
    latency = (
        by_version.group_by("service", "operation", "bucket")
        .agg(pl.col("weight", "n").sum())
        .with_columns(bucket_value_expr("bucket").alias("value"))
        .sort("service", "operation", "value")
    )
    cf = (
        without.group_by("service", "operation", "calls", "bucket")
        .agg(pl.col("weight").sum())
        .with_columns((bucket_value_expr("bucket") + pl.col("calls") * replacement_ms).alias("value"))
        .sort("service", "operation", "value")
    )
    lat_parts = latency.partition_by("service", "operation", as_dict=True)
    cf_parts = cf.partition_by("service", "operation", as_dict=True)
    version_parts = by_version.partition_by("service", "operation", as_dict=True)
    out: dict[tuple[str, str], tuple[OperationSample, np.ndarray]] = {}
    for row in merged.iter_rows(named=True):
        key = (row["service"], row["operation"])
        lat = lat_parts.get(key)
        if lat is None or row["requests"] == 0:
            continue
        without_part = cf_parts.get(key, cf.clear())
        sampled = row["weight_min"] != 1.0 or row["weight_max"] != 1.0
        version_rows = []
        for (version,), part in version_parts[key].partition_by("version", as_dict=True).items():
            part = part.with_columns(bucket_value_expr("bucket").alias("value")).sort("value")
            values, weights = part["value"].to_numpy(), part["weight"].to_numpy()
            p99 = weighted_quantiles(values, weights, np.array([0, values.size]), [0.99])[0, 0]
            count = round(float(weights.sum())) if sampled else int(part["n"].sum())
            version_rows.append((str(version), count, float(p99)))
        total = float(row["weight"])
        out[key] = (
            OperationSample(
                latency=lat["value"].to_numpy(),
                latency_weights=lat["weight"].to_numpy(),
                without=without_part["value"].to_numpy(),
                without_weights=without_part["weight"].to_numpy(),
                sampled=sampled,
                stored=int(row["requests"]),
                total=total,
                n_eff=total**2 / float(row["weight_sq"]) if sampled else float(row["requests"]),
                calls=float(row["sync_llm_calls"]) / total,
                versions=pl.DataFrame(
                    version_rows,
                    schema={"version": pl.String, "requests": pl.Int64, "duration_ms": pl.Float64},
                    orient="row",
                ),
            ),
            lat["n"].to_numpy(),
        )
    return out


# --- metrics from merged state ------------------------------------------------------------------

_QUANTILES = {"p50_ms": 0.5, "p95_ms": 0.95, "p99_ms": 0.99, "p999_ms": 0.999}


def _quantiles(latency: pl.DataFrame, keys: list[str], quantiles: dict[str, float]) -> pl.DataFrame:
    """Per group of ``keys``: the named quantiles of the bucketed (weighted) population, and the
    stored requests at or above its p99 (``p99_tail_samples``)."""
    ordered = (
        latency.filter(pl.col("weight") > 0)
        .with_columns(bucket_value_expr("bucket").alias("value"))
        .sort(*keys, "bucket")
    )
    if ordered.is_empty():
        return pl.DataFrame(
            schema={
                **dict.fromkeys(keys, pl.String),
                **dict.fromkeys(quantiles, pl.Float64),
                "tail": pl.Int64,
            }
        )
    ids = ordered.select(pl.struct(*keys).rle_id()).to_series().to_numpy()
    first = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    bounds = np.r_[first, ordered.height]
    values = ordered["value"].to_numpy()
    found = weighted_quantiles(values, ordered["weight"].to_numpy(), bounds, [*quantiles.values(), 0.99])
    p99 = np.repeat(found[:, -1], np.diff(bounds))
    tail = np.add.reduceat(np.where(values >= p99, ordered["n"].to_numpy(), 0), first)
    columns = [pl.Series(name, found[:, j], dtype=pl.Float64) for j, name in enumerate(quantiles)]
    return ordered[first].select(*keys).with_columns(*columns, pl.Series("tail", tail, dtype=pl.Int64))


def _stats(
    totals: pl.DataFrame, latency: pl.DataFrame, keys: list[str], quantiles: dict[str, float], min_tail: int
) -> pl.DataFrame:
    """What :func:`analytics.hot_path.request_stats` computes, from merged state."""
    merged = totals.group_by(keys).agg(
        pl.col("requests").sum(),
        pl.col("weight").sum(),
        pl.col("weight_sq").sum(),
        pl.col("weight_min").min(),
        pl.col("weight_max").max(),
        pl.col("sync_llm_calls").sum(),
    )
    latency = latency.group_by(*keys, "bucket").agg(pl.col("weight").sum(), pl.col("n").sum())
    weighted = pl.col("weight_min") != 1.0
    weighted = weighted | (pl.col("weight_max") != 1.0)
    return merged.join(_quantiles(latency, keys, quantiles), on=keys, how="inner").with_columns(
        pl.when(weighted)
        .then(pl.col("weight").round())
        .otherwise(pl.col("requests"))
        .cast(pl.Int64)
        .alias("requests"),
        (pl.col("sync_llm_calls") / pl.col("weight")).alias("sync_llm_calls_per_request"),
        pl.col("requests").cast(pl.Int64).alias("sampled_requests"),
        pl.when(weighted)
        .then(pl.col("weight") ** 2 / pl.col("weight_sq"))
        .otherwise(pl.col("requests").cast(pl.Float64))
        .alias("effective_sample_size"),
        pl.col("tail").alias("p99_tail_samples"),
        (weighted & (pl.col("weight_max") > 1.0) & (pl.col("tail") < min_tail)).alias("p99_warning"),
    )


def tail_stats_from_state(
    totals: pl.DataFrame, latency: pl.DataFrame, q: float, min_sampled_tail: int
) -> pl.DataFrame:
    """Per (service, operation): ``n`` requests (the weighted count, rounded, in sampled data) and
    their ``q`` quantile ``p99``, from merged state — what :func:`analytics.attribution.window_stats`
    computes from rows, the quantile within the sketch's relative error. Pure."""
    schema = {"service": pl.String, "operation": pl.String, "n": pl.Int64, "p99": pl.Float64}
    if totals.is_empty():
        return empty(schema)
    stats = _stats(totals, latency, ["service", "operation"], {"p99": q}, min_sampled_tail)
    return stats.select("service", "operation", pl.col("requests").alias("n"), "p99").cast(pl.Schema(schema))


def hot_path_from_state(
    totals: pl.DataFrame, latency: pl.DataFrame, min_sampled_tail: int, first_byte: pl.DataFrame | None = None
) -> pl.DataFrame:
    """:data:`analytics.hot_path.HOT_PATH_SCHEMA` from the current window's merged state (with
    ``first_byte``, the time to first byte's histogram as :data:`LATENCY_STATE_SCHEMA`). Pure."""
    if totals.is_empty():
        return empty(HOT_PATH_SCHEMA)
    keys = ["service", "operation"]
    stats = _stats(totals, latency, keys, _QUANTILES, min_sampled_tail)
    counts = totals.group_by(keys).agg(pl.col("first_byte", "streamed").sum())
    stats = stats.join(counts, on=keys, how="left").with_columns(
        pl.col("first_byte").fill_null(0.0).round().cast(pl.Int64).alias("first_byte_requests"),
        pl.col("streamed").fill_null(0.0).round().cast(pl.Int64).alias("streamed_requests"),
    )
    if first_byte is not None and not first_byte.is_empty():
        fb = first_byte.group_by(*keys, "bucket").agg(pl.col("weight").sum(), pl.col("n").sum())
        stats = stats.join(_quantiles(fb, keys, FIRST_BYTE_QUANTILES).drop("tail"), on=keys, how="left")
    else:
        stats = stats.with_columns(pl.lit(None, pl.Float64).alias(c) for c in FIRST_BYTE_QUANTILES)
    return stats.sort(keys).select(list(HOT_PATH_SCHEMA)).cast(pl.Schema(HOT_PATH_SCHEMA))


def hot_path_series_from_state(
    totals: pl.DataFrame, latency: pl.DataFrame, min_sampled_tail: int, first_byte: pl.DataFrame | None = None
) -> pl.DataFrame:
    """:data:`analytics.hot_path.HOT_PATH_SERIES_SCHEMA` from merged state per ``bucket_start`` (with
    ``first_byte``, the time to first byte's histogram per ``bucket_start``). Pure."""
    if totals.is_empty():
        return empty(HOT_PATH_SERIES_SCHEMA)
    keys = ["service", "operation", "bucket_start"]
    series_q = {k: v for k, v in _QUANTILES.items() if k != "p999_ms"}
    stats = _stats(totals, latency, keys, series_q, min_sampled_tail)
    if first_byte is not None and not first_byte.is_empty():
        fb = first_byte.group_by(*keys, "bucket").agg(pl.col("weight").sum(), pl.col("n").sum())
        p99 = _quantiles(fb, keys, {"ttfb_p99_ms": 0.99}).drop("tail")
        stats = stats.join(
            p99.with_columns(pl.col("bucket_start").cast(stats.schema["bucket_start"])), on=keys, how="left"
        )
    else:
        stats = stats.with_columns(pl.lit(None, pl.Float64).alias("ttfb_p99_ms"))
    return stats.sort(keys).select(list(HOT_PATH_SERIES_SCHEMA)).cast(pl.Schema(HOT_PATH_SERIES_SCHEMA))


def abandonment_from_state(state: pl.DataFrame, conventions: Conventions) -> pl.DataFrame:
    """:data:`analytics.abandonment.ABANDONMENT_SCHEMA` from merged abandonment state: the same
    counts, rates and Wilson intervals as from the request rows. Pure."""
    if state.is_empty():
        return empty(ABANDONMENT_SCHEMA)
    width = conventions.bucket_ms
    buckets = state.group_by("service", "operation", "bucket").agg(
        pl.col("weight", "weight_sq", "abandoned", "n").sum()
    )
    weighted = bool((buckets["weight"] != buckets["n"].cast(pl.Float64)).any())
    if weighted:
        buckets = buckets.with_columns(
            pl.col("weight").round().cast(pl.Int64).alias("requests"),
            pl.col("abandoned").round().cast(pl.Int64).alias("_abandoned"),
            (pl.col("abandoned") / pl.col("weight")).alias("rate"),
            (pl.col("weight") ** 2 / pl.col("weight_sq")).alias("_n_eff"),
            pl.col("n").alias("sampled_requests"),
        )
        intervals = [
            wilson_interval(rate * n_eff, n_eff)
            for rate, n_eff in zip(buckets["rate"], buckets["_n_eff"], strict=True)
        ]
    else:
        buckets = buckets.with_columns(
            pl.col("n").alias("requests"),
            pl.col("abandoned").round().cast(pl.Int64).alias("_abandoned"),
            pl.col("n").alias("sampled_requests"),
        ).with_columns((pl.col("_abandoned") / pl.col("requests")).alias("rate"))
        intervals = [
            wilson_interval(a, n) for a, n in zip(buckets["_abandoned"], buckets["requests"], strict=True)
        ]
    return (
        buckets.with_columns(
            pl.col("_abandoned").alias("abandoned"),
            (pl.col("bucket") * width).alias("lo_ms"),
            ((pl.col("bucket") + 1) * width).alias("hi_ms"),
            pl.Series("rate_low", [lo for lo, _ in intervals], dtype=pl.Float64),
            pl.Series("rate_high", [hi for _, hi in intervals], dtype=pl.Float64),
        )
        .sort("service", "operation", "lo_ms")
        .select(list(ABANDONMENT_SCHEMA))
        .cast(pl.Schema(ABANDONMENT_SCHEMA))
    )


def abandonment_summary_from_state(
    totals: pl.DataFrame, latency: pl.DataFrame, buckets: pl.DataFrame, conventions: Conventions
) -> pl.DataFrame:
    """:data:`analytics.abandonment.ABANDONMENT_SUMMARY_SCHEMA` from merged state and the
    abandonment curve (:func:`abandonment_from_state`). Pure."""
    if totals.is_empty():
        return empty(ABANDONMENT_SUMMARY_SCHEMA)
    keys = ["service", "operation"]
    stats = _stats(totals, latency, keys, {"p99_ms": 0.99}, 0)
    abandoned = totals.group_by(keys).agg(pl.col("abandoned").sum(), pl.col("weight").sum().alias("_w"))
    cliffs = pl.DataFrame(
        [
            {"service": str(s), "operation": str(o), "cliff_ms": cliff(group, conventions)}
            for (s, o), group in buckets.group_by("service", "operation", maintain_order=True)
        ],
        schema={"service": pl.String, "operation": pl.String, "cliff_ms": pl.Int64},
    )
    return (
        stats.select(*keys, "requests", "p99_ms")
        .join(abandoned, on=keys)
        .with_columns(
            pl.col("abandoned").round().cast(pl.Int64),
            (pl.col("abandoned") / pl.col("_w")).alias("rate"),
            latency_read(conventions),
        )
        .join(cliffs, on=keys, how="left")
        .sort(keys)
        .select(list(ABANDONMENT_SUMMARY_SCHEMA))
        .cast(pl.Schema(ABANDONMENT_SUMMARY_SCHEMA))
    )


def series_bucket(every: timedelta) -> pl.Expr:
    """The series bucket of a request row's ``start`` (as :func:`analytics.hot_path.hot_path_series`)."""
    return pl.col("start").dt.truncate(every).dt.cast_time_unit("us").alias("bucket_start")
