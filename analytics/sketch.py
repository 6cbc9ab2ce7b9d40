"""Log-bucketed latency histograms: the mergeable state of a latency distribution.

A value x (milliseconds) falls in bucket ``i = ceil(log(x) / log(γ))`` with γ = (1 + α)/(1 − α),
the bucket of values in (γ^(i−1), γ^i]; the bucket is read back as ``2·γ^i / (γ + 1)``, which is
within a relative α of every value it holds (DDSketch's mapping, Masson et al., VLDB 2019). With
α = :data:`RELATIVE_ERROR` = 0.5%, a millisecond to a day spans about 1,600 buckets, a minute of one
operation's requests a few dozen. Values at or below :data:`MIN_MS` (a microsecond; zero included)
share one bucket read back as 0.

Bucket counts add, so per-minute histograms merge into any window's by summing counts per bucket
(``sumMap`` in ClickHouse). A quantile of the merged histogram is the type-7 quantile (numpy's
``linear``) of the sample in which every value is replaced by its bucket's value: the two order
statistics it interpolates are each within α of the true ones, so the quantile is within a relative
α of the exact one. Counts may be weights (sampled data): the quantile of the weighted population,
as :func:`analytics.hot_path.weighted_quantiles` reads it.

:class:`BucketSample` presents a histogram as a sorted sample (:class:`analytics.stats.SortedWindow`),
so the percentile and bootstrap code of exact samples runs on it unchanged: a bootstrap over buckets
is a draw of order statistics from the bucketed empirical distribution (a multinomial resample).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import polars as pl

from analytics.stats import SortedWindow

__all__ = [
    "GAMMA",
    "MIN_MS",
    "RELATIVE_ERROR",
    "ZERO_BUCKET",
    "BucketSample",
    "bucket_expr",
    "bucket_index",
    "bucket_value",
    "bucket_value_expr",
]

RELATIVE_ERROR = 0.005
GAMMA = (1.0 + RELATIVE_ERROR) / (1.0 - RELATIVE_ERROR)
_LOG_GAMMA = math.log(GAMMA)
MIN_MS = 1e-3
# Every value at or below MIN_MS (and any negative clock-skew artefact): read back as 0.
ZERO_BUCKET = -32768


def bucket_index(ms: np.ndarray | Sequence[float]) -> np.ndarray:
    """The bucket of each value (int16). Pure."""
    values = np.asarray(ms, dtype=np.float64)
    out = np.full(values.shape, ZERO_BUCKET, dtype=np.int16)
    positive = values > MIN_MS
    out[positive] = np.ceil(np.log(values[positive]) / _LOG_GAMMA).astype(np.int16)
    return out


def bucket_value(index: np.ndarray | Sequence[int]) -> np.ndarray:
    """The value each bucket is read back as: within a relative :data:`RELATIVE_ERROR` of every
    value it holds (0 for :data:`ZERO_BUCKET`). Pure."""
    idx = np.asarray(index, dtype=np.int64)
    out = 2.0 * np.exp(idx * _LOG_GAMMA) / (GAMMA + 1.0)
    return np.where(idx == ZERO_BUCKET, 0.0, out)


def bucket_expr(column: str | pl.Expr) -> pl.Expr:
    """:func:`bucket_index` as a Polars expression over a column (or expression) of milliseconds."""
    value = (pl.col(column) if isinstance(column, str) else column).cast(pl.Float64)
    return (
        pl.when(value > MIN_MS).then((value.log() / _LOG_GAMMA).ceil()).otherwise(ZERO_BUCKET).cast(pl.Int16)
    )


def bucket_value_expr(column: str) -> pl.Expr:
    """:func:`bucket_value` as a Polars expression over a column of bucket indexes."""
    idx = pl.col(column).cast(pl.Int64)
    return (
        pl.when(idx == ZERO_BUCKET)
        .then(0.0)
        .otherwise(2.0 * (idx.cast(pl.Float64) * _LOG_GAMMA).exp() / (GAMMA + 1.0))
    )


class BucketSample(SortedWindow):
    """A histogram as a sorted sample: ``size`` values, the value at a rank being the value of the
    bucket that rank falls in. ``buckets`` need not be sorted; ``counts`` are integers (a sample,
    not weights)."""

    def __init__(self, buckets: np.ndarray | Sequence[int], counts: np.ndarray | Sequence[int]) -> None:
        idx = np.asarray(buckets, dtype=np.int64)
        n = np.asarray(counts, dtype=np.int64)
        order = np.argsort(idx, kind="stable")
        keep = n[order] > 0
        self.bucket_values = bucket_value(idx[order][keep])
        self.cumulative = np.cumsum(n[order][keep])
        size = int(self.cumulative[-1]) if self.cumulative.size else 0
        super().__init__(self.bucket_values, 0, size)

    @property
    def complete(self) -> bool:
        return False  # not the sample's values themselves: read through take()

    def take(self, ranks: np.ndarray) -> np.ndarray:
        at = np.searchsorted(self.cumulative, np.asarray(ranks, dtype=np.int64), side="right")
        return self.bucket_values[np.minimum(at, self.bucket_values.size - 1)]
