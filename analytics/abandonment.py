"""Abandonment by response-time bucket: for each ``bucket_ms`` bucket [lo, hi) of hot-path response
time, the share of requests the user abandoned (status 499 or ``tailwatch.abandoned=true``), with a
95% Wilson interval; and the *cliff*: the lower edge of the bucket where the rate rises most over
the bucket before it, among buckets with at least ``cliff_min_requests`` requests and a rise of at
least ``cliff_min_jump``.

Input is the per-request frame of :mod:`analytics.hot_path`; everything here is pure.

The latency is the request's duration, or for the operations the conventions'
``abandonment_latency`` names, its time to first byte (a streamed answer's user leaves while waiting
for the first words, not the last; a request whose server marked no first byte keeps its duration).

In sampled data (a request ``weight`` other than 1) counts are sums of weights (rounded), rates are
weighted shares, and the Wilson interval is taken at Kish's effective sample size (Σw)²/Σw², not at
the weighted count, which would claim ten times the evidence a 1-in-10 sample holds. A bucket takes
part in the cliff by its stored requests (``sampled_requests``): a handful of spans scaled up is still
a handful.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from analytics._common import empty
from analytics.conventions import Conventions
from analytics.hot_path import is_weighted, request_stats
from analytics.stats import percentile_exprs, wilson_interval

__all__ = [
    "ABANDONMENT_SCHEMA",
    "ABANDONMENT_SUMMARY_SCHEMA",
    "abandonment",
    "abandonment_latency_ms",
    "abandonment_summary",
    "cliff",
    "latency_read",
]

ABANDONMENT_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "lo_ms": pl.Int64,
    "hi_ms": pl.Int64,
    "requests": pl.Int64,
    "abandoned": pl.Int64,
    "rate": pl.Float64,
    "rate_low": pl.Float64,
    "rate_high": pl.Float64,
    "sampled_requests": pl.Int64,  # stored requests: = requests unless the data is sampled
}

ABANDONMENT_SUMMARY_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "requests": pl.Int64,
    "abandoned": pl.Int64,
    "rate": pl.Float64,
    "cliff_ms": pl.Int64,
    "p99_ms": pl.Float64,
    "latency": pl.String,  # what the buckets and cliff read: "duration" or "first_byte"
}


def abandonment_latency_ms(requests: pl.DataFrame, conventions: Conventions) -> pl.Expr:
    """Per request row of ``requests``: the latency its abandonment is read against, in ms (its
    ``first_byte_ms`` where ``abandonment_latency`` says so and it has one, else ``duration_ms``)."""
    if not conventions.abandonment_latency or "first_byte_ms" not in requests.columns:
        return pl.col("duration_ms")
    pairs = requests.select(pl.col("service", "operation").cast(pl.String)).unique()
    chosen = [
        f"{s}\x00{o}"
        for s, o in pairs.iter_rows()
        if conventions.abandonment_latency_of(s, o) == "first_byte"
    ]
    if not chosen:
        return pl.col("duration_ms")
    key = pl.concat_str(
        pl.col("service").cast(pl.String), pl.lit("\x00"), pl.col("operation").cast(pl.String)
    )
    return (
        pl.when(key.is_in(chosen))
        .then(pl.col("first_byte_ms").fill_null(pl.col("duration_ms")))
        .otherwise(pl.col("duration_ms"))
    )


def latency_read(conventions: Conventions) -> pl.Expr:
    """``latency``: per (service, operation) row, what its abandonment is read against."""
    return (
        pl.struct(pl.col("service").cast(pl.String), pl.col("operation").cast(pl.String))
        .map_elements(lambda r: conventions.abandonment_latency_of(r["service"], r["operation"]), pl.String)
        .alias("latency")
    )


def abandonment(requests: pl.DataFrame, conventions: Conventions) -> pl.DataFrame:
    """Per (service, operation, bucket) of the current window. Empty buckets are left out."""
    current = requests.filter(pl.col("window") == "current")
    if current.is_empty():
        return empty(ABANDONMENT_SCHEMA)
    width = conventions.bucket_ms
    latency_ms = abandonment_latency_ms(current, conventions)
    bucketed = current.with_columns((latency_ms // width).cast(pl.Int64).alias("bucket"))
    keys = ("service", "operation", "bucket")
    if is_weighted(current):
        w = pl.col("weight").fill_null(1.0)
        weighted = bucketed.group_by(*keys).agg(
            w.sum().alias("_w"),
            w.filter(pl.col("abandoned")).sum().alias("_a"),
            (w * w).sum().alias("_w2"),
            pl.len().cast(pl.Int64).alias("sampled_requests"),
        )
        buckets = weighted.with_columns(
            pl.col("_w").round().cast(pl.Int64).alias("requests"),
            pl.col("_a").round().cast(pl.Int64).alias("abandoned"),
            (pl.col("_a") / pl.col("_w")).alias("rate"),
            (pl.col("_w") ** 2 / pl.col("_w2")).alias("_n_eff"),
        )
        # Wilson at the effective sample size: the interval of a weighted share.
        intervals = [
            wilson_interval(rate * n_eff, n_eff)
            for rate, n_eff in zip(buckets["rate"], buckets["_n_eff"], strict=True)
        ]
    else:
        buckets = bucketed.group_by(*keys).agg(
            pl.len().cast(pl.Int64).alias("requests"),
            pl.col("abandoned").sum().cast(pl.Int64).alias("abandoned"),
        )
        buckets = buckets.with_columns(
            (pl.col("abandoned") / pl.col("requests")).alias("rate"),
            pl.col("requests").alias("sampled_requests"),
        )
        intervals = [
            wilson_interval(a, n) for a, n in zip(buckets["abandoned"], buckets["requests"], strict=True)
        ]
    return (
        buckets.with_columns(
            (pl.col("bucket") * width).alias("lo_ms"),
            ((pl.col("bucket") + 1) * width).alias("hi_ms"),
            pl.Series("rate_low", [lo for lo, _ in intervals], dtype=pl.Float64),
            pl.Series("rate_high", [hi for _, hi in intervals], dtype=pl.Float64),
        )
        .sort("service", "operation", "lo_ms")
        .select(list(ABANDONMENT_SCHEMA))
    )


def cliff(buckets: pl.DataFrame, conventions: Conventions) -> int | None:
    """The cliff of one operation's buckets (sorted by ``lo_ms``), or ``None``. A bucket's support
    is its stored requests (``sampled_requests``, when the buckets carry it), so sampled data needs
    as many spans in a bucket as unsampled data does."""
    support = (
        pl.col("sampled_requests").fill_null(pl.col("requests"))
        if "sampled_requests" in buckets.columns
        else pl.col("requests")
    )
    eligible = buckets.filter(support >= conventions.cliff_min_requests).sort("lo_ms")
    if eligible.height < 2:
        return None
    jumps = eligible.with_columns((pl.col("rate") - pl.col("rate").shift(1)).alias("jump")).drop_nulls("jump")
    best = jumps.sort("jump", descending=True, maintain_order=True).row(0, named=True)
    if best["jump"] < conventions.cliff_min_jump or best["jump"] <= 0:
        return None
    return int(best["lo_ms"])


def abandonment_summary(
    requests: pl.DataFrame, buckets: pl.DataFrame, conventions: Conventions
) -> pl.DataFrame:
    """Per (service, operation): requests, abandoned, overall rate, cliff and p99."""
    current = requests.filter(pl.col("window") == "current")
    if current.is_empty():
        return empty(ABANDONMENT_SUMMARY_SCHEMA)
    if is_weighted(current):
        w = pl.col("weight").fill_null(1.0)
        totals = (
            current.group_by("service", "operation")
            .agg(w.filter(pl.col("abandoned")).sum().alias("_a"), w.sum().alias("_w"))
            .join(
                request_stats(current, ["service", "operation"], {"p99_ms": 0.99}, 0).select(
                    "service", "operation", "requests", "p99_ms"
                ),
                on=["service", "operation"],
            )
            .with_columns(
                pl.col("_a").round().cast(pl.Int64).alias("abandoned"),
                (pl.col("_a") / pl.col("_w")).alias("rate"),
            )
        )
    else:
        totals = current.group_by("service", "operation").agg(
            pl.len().cast(pl.Int64).alias("requests"),
            pl.col("abandoned").sum().cast(pl.Int64).alias("abandoned"),
            *percentile_exprs("duration_ms", {"p99_ms": 0.99}),
        )
        totals = totals.with_columns((pl.col("abandoned") / pl.col("requests")).alias("rate"))
    cliffs = [
        {"service": str(s), "operation": str(o), "cliff_ms": cliff(group, conventions)}
        for (s, o), group in buckets.group_by("service", "operation", maintain_order=True)
    ]
    cliff_frame = pl.DataFrame(
        cliffs,
        # The keys in the requests' own type (categorical from analyze(), strings from callers).
        schema={
            "service": totals.schema["service"],
            "operation": totals.schema["operation"],
            "cliff_ms": pl.Int64,
        },
    )
    return (
        totals.join(cliff_frame, on=["service", "operation"], how="left")
        .with_columns(latency_read(conventions))
        .sort("service", "operation")
        .select(list(ABANDONMENT_SUMMARY_SCHEMA))
    )
