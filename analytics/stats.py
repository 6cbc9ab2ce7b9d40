"""Statistics shared by the metrics: exact percentiles, Wilson intervals (and Newcombe's interval of a
difference of two proportions built from them), bootstrap of a quantile delta, Spearman correlation
and least-squares slope.

Percentiles are exact and use **linear interpolation between closest ranks** (Hyndman–Fan type 7:
numpy's default, ClickHouse's ``quantileExactInclusive``, Polars ``interpolation="linear"``): for n
sorted values and quantile q, h = (n − 1)·q and the result is x[⌊h⌋] + (h − ⌊h⌋)·(x[⌊h⌋+1] − x[⌊h⌋]).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final, Literal

import numpy as np
import polars as pl

__all__ = [
    "INTERPOLATION",
    "bootstrap_quantile_delta",
    "percentile",
    "percentile_exprs",
    "proportion_delta_interval",
    "slope",
    "spearman",
    "wilson_interval",
]

INTERPOLATION: Final[Literal["linear"]] = "linear"
_Z95 = 1.959963984540054


class OutsideWindow(Exception):
    """A rank of a :class:`SortedWindow` outside the values it holds."""


class SortedWindow:
    """Part of a sorted sample of ``size`` values: those at 0-based ranks ``first`` …
    ``first + len(values) − 1`` — what the order statistics near one quantile read, without the
    rest of the sample (the summaries read the ranks around a p99 in SQL). Pure."""

    def __init__(self, values: np.ndarray, first: int, size: int) -> None:
        self.values = np.asarray(values, dtype=np.float64)
        self.first = int(first)
        self.size = int(size)

    @classmethod
    def of(cls, values: np.ndarray) -> SortedWindow:
        """A whole sample."""
        ordered = np.sort(np.asarray(values, dtype=np.float64))
        return cls(ordered, 0, ordered.size)

    @property
    def complete(self) -> bool:
        return self.first == 0 and self.values.size == self.size

    def take(self, ranks: np.ndarray) -> np.ndarray:
        """The values at 0-based ``ranks``; :class:`OutsideWindow` for a rank it does not hold."""
        local = np.asarray(ranks, dtype=np.int64) - self.first
        if local.size and (local.min() < 0 or local.max() >= self.values.size):
            raise OutsideWindow(f"ranks {int(ranks.min())}..{int(ranks.max())} outside {self.first}..")
        return self.values[local]

    def with_values(self, extra: np.ndarray) -> SortedWindow:
        """This sample with ``extra`` values added: exact at the ranks of the values between this
        window's smallest and largest (the others only move the ranks)."""
        extra = np.asarray(extra, dtype=np.float64)
        if extra.size == 0:
            return self
        if self.complete:
            return SortedWindow.of(np.concatenate([self.values, extra]))
        if self.values.size == 0:
            raise OutsideWindow("an empty window cannot take values")
        lo, hi = self.values[0], self.values[-1]
        inside = extra[(extra >= lo) & (extra <= hi)]
        below = int((extra < lo).sum())
        merged = np.sort(np.concatenate([self.values, inside]))
        return SortedWindow(merged, self.first + below, self.size + extra.size)


def polars_quantile(sample: SortedWindow, q: float) -> float | None:
    """The linear quantile of ``sample`` in Polars' arithmetic (``Series.quantile(q, "linear")``:
    a + (b − a)·t), which the per-operation p99s of the Polars metrics use. Pure."""
    n = sample.size
    if n == 0:
        return None
    h = (n - 1) * q
    lo = math.floor(h)
    a, b = sample.take(np.array([lo, min(lo + 1, n - 1)]))
    return float(a + (b - a) * (h - lo))


def percentile(values: Sequence[float] | np.ndarray | SortedWindow, q: float) -> float | None:
    """Exact type-7 percentile of ``values`` (``q`` in [0, 1]); ``None`` for no values."""
    if isinstance(values, SortedWindow):
        if values.size == 0:
            return None
        # numpy's "linear" method step by step (its virtual index and its lerp), so that a window
        # and the whole sample give the same float.
        n = values.size
        virtual = (n - 1) * q
        lo = min(max(math.floor(virtual), 0), n - 1)
        t = virtual - math.floor(virtual)
        a, b = values.take(np.array([lo, min(lo + 1, n - 1)]))
        diff = b - a
        return float(b - diff * (1.0 - t) if t >= 0.5 else a + diff * t)
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return None
    return float(np.quantile(arr, q, method="linear"))


def percentile_exprs(column: str, quantiles: dict[str, float], scale: float = 1.0) -> list[pl.Expr]:
    """One Polars aggregation per named quantile (a list inside one ``agg`` is not supported)."""
    return [
        (pl.col(column).quantile(q, interpolation=INTERPOLATION) * scale).alias(name)
        for name, q in quantiles.items()
    ]


def wilson_interval(successes: int, trials: int, z: float = _Z95) -> tuple[float | None, float | None]:
    """The Wilson score interval of a binomial proportion (95% by default)."""
    if trials <= 0:
        return (None, None)
    p = successes / trials
    denom = 1.0 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def proportion_delta_interval(
    successes_a: int, trials_a: int, successes_b: int, trials_b: int, z: float = _Z95
) -> tuple[float | None, float | None]:
    """Interval of the difference of two binomial proportions p_a − p_b from their Wilson
    intervals (Newcombe's hybrid score method, 95% by default); ``None`` when a side is empty."""
    la, ua = wilson_interval(successes_a, trials_a, z)
    lb, ub = wilson_interval(successes_b, trials_b, z)
    if la is None or ua is None or lb is None or ub is None:
        return (None, None)
    pa, pb = successes_a / trials_a, successes_b / trials_b
    delta = pa - pb
    return (
        delta - math.sqrt((pa - la) ** 2 + (ub - pb) ** 2),
        delta + math.sqrt((ua - pa) ** 2 + (pb - lb) ** 2),
    )


def _sorted(values: np.ndarray | SortedWindow) -> np.ndarray | SortedWindow:
    if isinstance(values, SortedWindow):
        return values.values if values.complete else values
    return np.sort(np.asarray(values, dtype=np.float64))


def _bootstrap_order_statistic(
    sorted_values: np.ndarray | SortedWindow, q: float, samples: int, rng: np.random.Generator
) -> np.ndarray:
    """Bootstrap replicates of the q-quantile (nearest rank) without resampling n values each time.

    The j-th order statistic of n uniform draws is Beta(j, n − j + 1); a resample of the data is
    the data's empirical quantile function applied to such draws. So each replicate costs one Beta
    draw instead of an O(n) resample — exact for the nearest-rank estimator, and what keeps the test
    cheap on hundreds of thousands of requests.
    """
    n = sorted_values.size
    j = min(n, max(1, math.ceil(q * n)))
    u = rng.beta(j, n - j + 1, size=samples)
    index = np.clip(np.ceil(u * n).astype(np.int64) - 1, 0, n - 1)
    if isinstance(sorted_values, SortedWindow):
        return sorted_values.take(index)
    return sorted_values[index]


def bootstrap_quantile_delta(
    before: np.ndarray | SortedWindow,
    after: np.ndarray | SortedWindow,
    q: float,
    *,
    samples: int,
    confidence: float,
    seed: int,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``quantile(after) − quantile(before)``."""
    rng = np.random.default_rng(seed)
    b = _bootstrap_order_statistic(_sorted(before), q, samples, rng)
    a = _bootstrap_order_statistic(_sorted(after), q, samples, rng)
    deltas = a - b
    alpha = (1.0 - confidence) / 2.0
    return (float(np.quantile(deltas, alpha)), float(np.quantile(deltas, 1.0 - alpha)))


def _ranks(values: np.ndarray) -> np.ndarray:
    # Average ranks for ties, as Spearman's definition requires.
    frame = pl.DataFrame({"v": values})
    return frame.select(pl.col("v").rank("average")).to_series().to_numpy().astype(np.float64)


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson on average ranks); ``None`` below 3 points or constant input."""
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    if xa.size < 3 or xa.size != ya.size:
        return None
    rx, ry = _ranks(xa), _ranks(ya)
    sx, sy = rx.std(), ry.std()
    if sx == 0 or sy == 0:
        return None
    return float(((rx - rx.mean()) * (ry - ry.mean())).mean() / (sx * sy))


def slope(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Least-squares slope of y on x; ``None`` below 2 points."""
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    if xa.size < 2 or xa.size != ya.size:
        return None
    var = ((xa - xa.mean()) ** 2).sum()
    if var == 0:
        return None
    return float(((xa - xa.mean()) * (ya - ya.mean())).sum() / var)
