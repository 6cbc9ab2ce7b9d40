"""The hot/cold boundary: each hot operation's latency budget, what its synchronous model calls cost
against it, and what to do about it (Polars and numpy, pure).

* **Budget** — the first ``Conventions.latency_budgets`` entry whose service and operation globs
  match, else the operation's abandonment cliff (the bucket where users start leaving), else none.
  A request is over budget when its latency is at or above the budget (the boundary convention of
  the 500 ms buckets); per day = count × 86400 / window seconds.
* **Counterfactual** — each request's latency without its synchronous LLM calls: minus the time
  those calls cover within the request (the union of their intervals, clipped to the root span;
  for the tail traces attribution walked, the LLM time on the critical path when that is less),
  plus ``sync_llm_replacement_ms`` per call removed.
* **Abandoned requests saved** — with the operation's abandonment curve (rate per bucket), Σ over
  requests of rate(bucket(latency)) − rate(bucket(counterfactual latency)), per day.
* **Recommendation** — ``keep`` (p99 < budget), ``move_off_hot_path`` (p99 ≥ budget, counterfactual
  p99 < budget), ``optimise_internal`` (both ≥ budget), with the numbers behind it as sentences.
* **Sampled data** — each request counts as its ``weight`` (the requests its root stands for):
  counts over budget and abandoned requests saved are sums of weights, p99s those of the weighted
  population (:func:`analytics.hot_path.weighted_quantiles`); beside them the stored requests, the
  effective sample size and the warning of :data:`analytics.hot_path.HOT_PATH_SCHEMA`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Literal

import numpy as np
import polars as pl

from analytics._common import empty
from analytics.conventions import Conventions
from analytics.hot_path import weighted_quantiles

__all__ = [
    "BOUNDARY_RELEASES_SCHEMA",
    "BOUNDARY_SCHEMA",
    "COUNTERFACTUAL_SCHEMA",
    "OperationSample",
    "Recommendation",
    "boundary",
    "boundary_of",
    "budget_for",
    "counterfactual",
    "sync_llm_union_ns",
    "union_ns_per_row",
    "with_critical_path",
]

Recommendation = Literal["keep", "move_off_hot_path", "optimise_internal"]
BudgetSource = Literal["config", "cliff"]

BOUNDARY_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "requests": pl.Int64,
    "p99_ms": pl.Float64,
    "budget_ms": pl.Float64,  # null when none
    "budget_source": pl.String,  # "config", "cliff" or null
    "requests_over_budget": pl.Int64,
    "requests_over_budget_per_day": pl.Float64,
    "sync_llm_calls_per_request": pl.Float64,
    "p99_without_sync_llm_ms": pl.Float64,
    "requests_over_budget_without_sync_llm": pl.Int64,
    "abandoned_saved_per_day": pl.Float64,  # null without an abandonment curve
    "recommendation": pl.String,  # Recommendation, null without a budget
    "reasons": pl.List(pl.String),
    # The sample behind the p99s (as in the hot_path frame): stored requests, Kish's effective
    # sample size, and whether the p99 of sampled data rests on fewer than min_sampled_tail of them.
    "sampled_requests": pl.Int64,
    "effective_sample_size": pl.Float64,
    "p99_warning": pl.Boolean,
    # The cheapest what-if option that brings the p99 under budget ("timeout_fallback T=p95
    # F=50ms"), from analytics.what_if.with_cheapest_option; null when none does or none was asked.
    "cheapest_option": pl.String,
}

BOUNDARY_RELEASES_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "version": pl.String,
    "released_at": pl.Datetime("us", "UTC"),
    "requests": pl.Int64,
    "p99_ms": pl.Float64,
    "budget_share": pl.Float64,  # p99 / budget, null without a budget
}

# The current window's requests with their counterfactual latency (what boundary() and the slices read).
COUNTERFACTUAL_SCHEMA: dict[str, Any] = {
    "trace_key": pl.UInt64,
    "service": pl.String,
    "operation": pl.String,
    "version": pl.String,
    "duration_ms": pl.Float64,
    "abandoned": pl.Boolean,
    "sync_llm_calls": pl.Int64,
    "sync_llm_ms": pl.Float64,  # time the synchronous LLM calls hold within the request
    "without_sync_llm_ms": pl.Float64,
    "weight": pl.Float64,  # requests the root stands for: 1.0 unless sampled
}

_NONE = np.iinfo(np.int64).min


def sync_llm_union_ns(requests: pl.DataFrame, calls: pl.DataFrame) -> np.ndarray:
    """Per row of ``requests`` (``trace_key``, ``start``, ``duration_ms``): the nanoseconds covered by
    the union of its synchronous LLM calls' intervals (``calls``: ``trace_key``, ``start_ns``,
    ``end_ns``, ``sync``, one row per logical call, :func:`analytics.llm_calls.logical_calls`),
    clipped to the request. Sequential calls on the critical path: exactly the time they hold it.
    Pure."""
    out = np.zeros(requests.height, dtype=np.float64)
    sync = calls.filter(pl.col("sync")).select("trace_key", "start_ns", "end_ns")
    if requests.is_empty() or sync.is_empty():
        return out
    lo = pl.col("start").dt.epoch("ns")
    rows = requests.select(
        "trace_key",
        lo.alias("lo"),
        # duration_ms is Duration / 1e6: rounding gives the root's nanoseconds back exactly.
        (lo + (pl.col("duration_ms") * 1e6).round().cast(pl.Int64)).alias("hi"),
    ).with_row_index("row")
    hits = (
        rows.join(sync, on="trace_key", how="inner")
        .select(
            "row",
            pl.max_horizontal("start_ns", "lo").alias("s"),
            pl.min_horizontal("end_ns", "hi").alias("e"),
        )
        .filter(pl.col("e") > pl.col("s"))
        .sort("row", "s")
    )
    if hits.is_empty():
        return out
    return union_ns_per_row(
        hits["row"].to_numpy(), hits["s"].to_numpy(), hits["e"].to_numpy(), requests.height
    )


def union_ns_per_row(row: np.ndarray, s: np.ndarray, e: np.ndarray, rows: int) -> np.ndarray:
    """Per row index in ``[0, rows)``: the nanoseconds covered by the union of its intervals
    ``[s, e)`` (int64 arrays sorted by ``row`` then ``s``). Pure."""
    if row.size == 0:
        return np.zeros(rows, dtype=np.float64)
    # The latest end of the request's earlier intervals (sorted by start): a segmented prefix max,
    # by doubling — a request has a handful of calls, so a few vector passes instead of a window
    # function over hundreds of thousands of tiny groups.
    covered = np.full(row.size, _NONE, dtype=np.int64)
    same = row[1:] == row[:-1]
    covered[1:] = np.where(same, e[:-1], _NONE)
    step = 1
    while step < row.size:
        same = row[step:] == row[:-step]
        if not same.any():
            break
        shifted = np.where(same, covered[:-step], _NONE)
        covered = covered.copy()
        covered[step:] = np.maximum(covered[step:], shifted)
        step *= 2
    added = np.clip(e - np.maximum(s, covered), 0, None)
    return np.bincount(row, weights=added.astype(np.float64), minlength=rows)


def counterfactual(
    requests: pl.DataFrame,
    calls: pl.DataFrame,
    walked: pl.DataFrame | None,
    conventions: Conventions,
) -> pl.DataFrame:
    """The current window's requests (:data:`COUNTERFACTUAL_SCHEMA`) from the request rows of both
    windows (:data:`analytics.hot_path.REQUESTS_SCHEMA`), the logical LLM calls and, for the traces
    whose critical path was walked, ``walked`` (``trace_key``, ``llm_ns``: LLM time on the critical
    path). Pure."""
    current = requests.filter(pl.col("window") == "current")
    if current.is_empty():
        return empty(COUNTERFACTUAL_SCHEMA)
    sync_ms: pl.Expr | pl.Series = (
        pl.col("sync_llm_ms")  # known: the summaries keep it per request
        if "sync_llm_ms" in current.columns
        else pl.Series("sync_llm_ms", sync_llm_union_ns(current, calls) / 1e6, dtype=pl.Float64)
    )
    frame = current.select(
        "trace_key",
        pl.col("service").cast(pl.String),
        pl.col("operation").cast(pl.String),
        pl.col("version").cast(pl.String),
        "duration_ms",
        "abandoned",
        "sync_llm_calls",
        sync_ms,
        (pl.col("weight").fill_null(1.0) if "weight" in current.columns else pl.lit(1.0)).alias("weight"),
    )
    return with_critical_path(frame, walked, conventions)


def with_critical_path(
    requests: pl.DataFrame, walked: pl.DataFrame | None, conventions: Conventions
) -> pl.DataFrame:
    """:func:`counterfactual` requests with, for the traces whose critical path was walked
    (``walked``: ``trace_key``, ``llm_ns``), the LLM time on it where that is less than the union —
    a call running beside longer internal work does not shorten the request by its whole length —
    and ``without_sync_llm_ms`` from it. Pure."""
    frame = requests
    if walked is not None and not walked.is_empty() and not frame.is_empty():
        frame = frame.join(
            walked.select("trace_key", (pl.col("llm_ns") / 1e6).alias("_walked_ms")),
            on="trace_key",
            how="left",
            maintain_order="left",
        ).with_columns(
            pl.min_horizontal("sync_llm_ms", pl.col("_walked_ms").fill_null(math.inf)).alias("sync_llm_ms")
        )
    return (
        frame.with_columns(
            (
                pl.col("duration_ms")
                - pl.col("sync_llm_ms")
                + pl.col("sync_llm_calls") * conventions.sync_llm_replacement_ms
            ).alias("without_sync_llm_ms")
        )
        .select(list(COUNTERFACTUAL_SCHEMA))
        .cast(pl.Schema(COUNTERFACTUAL_SCHEMA))
    )


# An operation without abandonment buckets: nothing to save.
NO_CURVE = pl.DataFrame(schema={"lo_ms": pl.Int64, "rate": pl.Float64, "abandoned": pl.Int64})


def abandonment_by_operation(
    abandonment_summary: pl.DataFrame, buckets: pl.DataFrame
) -> tuple[dict[tuple[str, str], Any], dict[tuple[str, str], pl.DataFrame]]:
    """Per (service, operation): its abandonment cliff (for the budget) and its curve (the buckets,
    for the abandoned requests saved). An operation whose abandonment is read against its time to
    first byte has neither here: its curve is not one of the duration this report moves."""
    by_first_byte = set()
    if "latency" in abandonment_summary.columns:
        by_first_byte = {
            (str(s), str(o))
            for s, o in abandonment_summary.filter(pl.col("latency") == "first_byte")
            .select("service", "operation")
            .rows()
        }
    cliffs = {
        (str(service), str(operation)): cliff
        for service, operation, cliff in abandonment_summary.select("service", "operation", "cliff_ms").rows()
        if (str(service), str(operation)) not in by_first_byte
    }
    curves = {
        (str(key[0]), str(key[1])): curve
        for key, curve in (
            buckets.partition_by("service", "operation", as_dict=True) if not buckets.is_empty() else {}
        ).items()
        if (str(key[0]), str(key[1])) not in by_first_byte
    }
    return cliffs, curves


def budget_for(
    service: str, operation: str, cliff_ms: int | None, conventions: Conventions
) -> tuple[float | None, BudgetSource | None]:
    """(budget ms, source) of one operation: the first configured glob match, else its cliff."""
    for service_glob, operation_glob, budget_ms in conventions.latency_budgets:
        if fnmatchcase(service, service_glob) and fnmatchcase(operation, operation_glob):
            return float(budget_ms), "config"
    if cliff_ms is not None:
        return float(cliff_ms), "cliff"
    return None, None


def _p99(values: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Type-7 p99; of the weighted population when ``weights`` (not all 1) are given."""
    if weights is None:
        return float(np.quantile(values, 0.99, method="linear"))
    order = np.argsort(values, kind="stable")
    bounds = np.array([0, values.size])
    return float(weighted_quantiles(values[order], weights[order], bounds, [0.99])[0, 0])


def _weights(group: pl.DataFrame) -> np.ndarray | None:
    """The group's request weights, or ``None`` when every request stands for itself."""
    if "weight" not in group.columns:
        return None
    weights = group["weight"].fill_null(1.0).to_numpy()
    return None if bool((weights == 1.0).all()) else weights


def _count_over(values: np.ndarray, budget: float, weights: np.ndarray | None) -> int:
    """Requests at or over the budget: stored ones, or the weighted count (rounded) when sampled."""
    over = values >= budget
    return int(over.sum()) if weights is None else round(float(weights[over].sum()))


def _version_p99s(group: pl.DataFrame, weighted: bool) -> pl.DataFrame:
    """Per version of one operation: requests and p99 (weighted when ``weighted``)."""
    if not weighted:
        return group.group_by("version").agg(
            pl.len().alias("requests"), pl.col("duration_ms").quantile(0.99, interpolation="linear")
        )
    rows = []
    for (version,), part in group.group_by("version"):
        weights = part["weight"].fill_null(1.0).to_numpy()
        rows.append((version, round(float(weights.sum())), _p99(part["duration_ms"].to_numpy(), weights)))
    return pl.DataFrame(
        rows,
        schema={"version": group.schema["version"], "requests": pl.Int64, "duration_ms": pl.Float64},
        orient="row",
    )


def _ms(value: float) -> str:
    return f"{value:,.0f} ms"


def _count(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.1f}"


def _calls(value: float) -> str:
    return f"{value:.1f} sync model call{'' if value == 1.0 else 's'}/request"


def _saved_per_day(
    latency: np.ndarray,
    without: np.ndarray,
    curve: pl.DataFrame,
    bucket_ms: int,
    per_day: float,
    weights: np.ndarray | None = None,
    without_weights: np.ndarray | None = None,
) -> float | None:
    """Expected abandoned requests a day saved, from the operation's curve (``lo_ms``, ``rate``,
    ``abandoned``); ``None`` when nobody abandoned (no curve to read). A bucket the counterfactual
    reaches but no request fell in takes the rate of the nearest observed bucket below it (the
    fastest observed one when none is below)."""
    if curve.is_empty() or int(curve["abandoned"].sum()) == 0:
        return None
    ordered = curve.sort("lo_ms")
    index = ordered["lo_ms"].to_numpy() // bucket_ms
    rates = ordered["rate"].to_numpy()

    def rate(values: np.ndarray) -> np.ndarray:
        buckets = np.floor(values / bucket_ms).astype(np.int64)
        at = np.clip(np.searchsorted(index, buckets, side="right") - 1, 0, index.size - 1)
        return rates[at]

    if weights is None and without_weights is None:
        return float((rate(latency) - rate(without)).sum()) * per_day

    # Sums of rates over each distribution (a histogram's latency and counterfactual buckets differ).
    def total(rates_: np.ndarray, w: np.ndarray | None) -> float:
        return float(rates_.sum() if w is None else (rates_ * w).sum())

    return (total(rate(latency), weights) - total(rate(without), without_weights)) * per_day


@dataclass(frozen=True)
class OperationSample:
    """What the boundary reads of one operation's requests: its latency and counterfactual latency
    distributions as values with weights (stored requests, each weight 1 unless sampled — or the
    buckets of a merged histogram, each weighted by its count), and the figures beside them."""

    latency: np.ndarray
    latency_weights: np.ndarray | None  # None: every request stands for itself, one value each
    without: np.ndarray
    without_weights: np.ndarray | None
    sampled: bool  # the data is sampled (weights ≠ 1): the sentences and warning say so
    stored: int  # stored requests
    total: float  # the requests they stand for
    n_eff: float
    calls: float  # synchronous LLM calls per request (weighted mean)
    versions: pl.DataFrame  # version, requests, duration_ms (its p99)


def _tail_samples(sample: OperationSample, p99: float, stored_counts: np.ndarray | None) -> int:
    at_or_above = sample.latency >= p99
    if stored_counts is None:
        return int(at_or_above.sum())
    return int(stored_counts[at_or_above].sum())


def _sample_of(group: pl.DataFrame) -> OperationSample:
    """One operation's :func:`counterfactual` requests as an :class:`OperationSample`."""
    latency = group["duration_ms"].to_numpy()
    weights = _weights(group)
    total = float(latency.size) if weights is None else float(weights.sum())
    per_request = group["sync_llm_calls"].cast(pl.Float64).to_numpy()
    return OperationSample(
        latency=latency,
        latency_weights=weights,
        without=group["without_sync_llm_ms"].to_numpy(),
        without_weights=weights,
        sampled=weights is not None,
        stored=int(latency.size),
        total=total,
        n_eff=float(latency.size) if weights is None else total**2 / float((weights**2).sum()),
        calls=float(per_request.mean() if weights is None else (per_request * weights).sum() / total),
        versions=_version_p99s(group, weights is not None),
    )


def boundary(
    requests: pl.DataFrame,
    abandonment_summary: pl.DataFrame,
    buckets: pl.DataFrame,
    release_rows: pl.DataFrame,
    window_seconds: float,
    conventions: Conventions,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(boundary, boundary_releases) from the :func:`counterfactual` requests, the abandonment
    summary (cliffs) and buckets (the curve), the release rows (release times) and the window's
    length. Pure."""
    if requests.is_empty():
        return empty(BOUNDARY_SCHEMA), empty(BOUNDARY_RELEASES_SCHEMA)
    samples = {
        (str(key[0]), str(key[1])): (_sample_of(group), None)
        for key, group in requests.partition_by("service", "operation", as_dict=True).items()
    }
    return boundary_of(samples, abandonment_summary, buckets, release_rows, window_seconds, conventions)


def boundary_of(
    samples: Mapping[tuple[str, str], tuple[OperationSample, np.ndarray | None]],
    abandonment_summary: pl.DataFrame,
    buckets: pl.DataFrame,
    release_rows: pl.DataFrame,
    window_seconds: float,
    conventions: Conventions,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(boundary, boundary_releases) from each operation's :class:`OperationSample` and, for a
    histogram's, the stored requests per latency value (for the tail count). Pure."""
    if not samples:
        return empty(BOUNDARY_SCHEMA), empty(BOUNDARY_RELEASES_SCHEMA)
    per_day = 86400.0 / window_seconds
    cliffs, curves = abandonment_by_operation(abandonment_summary, buckets)
    released = {
        (r["service"], r["operation"], r["version"]): r["released_at"]
        for r in release_rows.select("service", "operation", "version", "released_at").iter_rows(named=True)
    }
    rows: list[dict[str, Any]] = []
    release_out: list[dict[str, Any]] = []
    for (service, operation), (sample, stored_counts) in sorted(samples.items(), key=lambda kv: kv[0]):
        latency, without = sample.latency, sample.without
        weights, without_weights = sample.latency_weights, sample.without_weights
        total, calls, n_eff = sample.total, sample.calls, sample.n_eff
        budget, source = budget_for(service, operation, cliffs.get((service, operation)), conventions)
        p99, p99_without = _p99(latency, weights), _p99(without, without_weights)
        curve = curves.get((service, operation), NO_CURVE)
        saved = _saved_per_day(
            latency, without, curve, conventions.bucket_ms, per_day, weights, without_weights
        )
        tail_samples = _tail_samples(sample, p99, stored_counts)
        warning = sample.sampled and tail_samples < conventions.min_sampled_tail
        over = over_without = None
        recommendation: Recommendation | None = None
        reasons: list[str] = []
        if budget is None:
            reasons.append("no latency budget: none configured and the abandonment curve has no cliff")
        else:
            over = _count_over(latency, budget, weights)
            over_without = _count_over(without, budget, without_weights)
            if p99 < budget:
                recommendation = "keep"
            elif p99_without < budget:
                recommendation = "move_off_hot_path"
            else:
                recommendation = "optimise_internal"
            reasons.append(f"p99 {_ms(p99)} {'≥' if p99 >= budget else '<'} budget {_ms(budget)} ({source})")
            reasons.append(
                f"{over:,} of {round(total):,} requests ({over / total:.1%}) at or over budget: "
                f"{over * per_day:,.0f} a day"
            )
        if calls > 0:
            sentence = f"without {_calls(calls)} p99 would be {_ms(p99_without)}"
            if conventions.sync_llm_replacement_ms:
                sentence += f" (each replaced by {_ms(conventions.sync_llm_replacement_ms)})"
            if budget is not None and over_without is not None:
                sentence += (
                    f", {'≥' if p99_without >= budget else '<'} budget; "
                    f"{over_without * per_day:,.0f} requests a day still over"
                )
            reasons.append(sentence)
        else:
            reasons.append("no synchronous model call on this path: its time is internal work")
        if saved is not None and calls > 0:
            reasons.append(f"≈ {_count(saved)} abandoned requests a day saved without them (curve)")
        if sample.sampled:
            reasons.append(
                f"sampled: {sample.stored:,} stored requests stand for {round(total):,} "
                f"(effective sample size {n_eff:,.0f}); {tail_samples:,} of them at or above the p99"
                + (f", fewer than {conventions.min_sampled_tail}: the p99 is rough" if warning else "")
            )
        shares: list[tuple[Any, str, float | None]] = []
        for version, count, p99_version in sample.versions.iter_rows():
            at = released.get((service, operation, version))
            share = p99_version / budget if budget is not None else None
            release_out.append(
                {
                    "service": service,
                    "operation": operation,
                    "version": version,
                    "released_at": at,
                    "requests": count,
                    "p99_ms": p99_version,
                    "budget_share": share,
                }
            )
            shares.append((at, version, share))
        if budget is not None and len(shares) > 1:
            ordered = sorted(shares, key=lambda r: (r[0] is None, r[0] or 0, r[1]))[-4:]
            reasons.append(
                "budget spent per release: "
                + " → ".join(f"{v} {s:.0%}" for _, v, s in ordered if s is not None)
            )
        rows.append(
            {
                "service": service,
                "operation": operation,
                "requests": sample.stored if not sample.sampled else round(total),
                "p99_ms": p99,
                "budget_ms": budget,
                "budget_source": source,
                "requests_over_budget": over,
                "requests_over_budget_per_day": None if over is None else over * per_day,
                "sync_llm_calls_per_request": calls,
                "p99_without_sync_llm_ms": p99_without,
                "requests_over_budget_without_sync_llm": over_without,
                "abandoned_saved_per_day": saved,
                "recommendation": recommendation,
                "reasons": reasons,
                "sampled_requests": sample.stored,
                "effective_sample_size": n_eff,
                "p99_warning": warning,
                "cheapest_option": None,
            }
        )
    releases_frame = (
        pl.DataFrame(release_out, schema=BOUNDARY_RELEASES_SCHEMA).sort(
            "service", "operation", "released_at", "version", nulls_last=True
        )
        if release_out
        else empty(BOUNDARY_RELEASES_SCHEMA)
    )
    return pl.DataFrame(rows, schema=BOUNDARY_SCHEMA), releases_frame
