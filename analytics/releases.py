"""Hot-path p99 per release: the step at each release and the trend across releases.

A release is a value of the resource attribute ``service.version``; its release time is the first
span seen with it for that service (SQL below). Building the summaries (:func:`analytics.build_summaries`)
records first-seen times as it goes in ``tailwatch_release_times``; an analysis reads those for the
minutes the job covered and scans raw spans of the look-back only where it did not, so a scheduled
analysis does not rescan 30 days of spans every few minutes, and release times outlive the raw
spans' TTL.

A release's step is its own, measured right where it happened and not over the version's whole
life (a provider slowing down three minutes after a release is a regression of its own, not the
release's): *after* is the version's first ``release_step_requests`` requests of an operation, within
``release_step_window`` of its release time; *before* is the same operation's requests in the same
length of time just before the release (at most as many). Requests are attributed to the version
that served them, so a canary is compared like with like. The step is the same in every analysis
whose window ends after it; one ending sooner sees the part of it known by then.

A step is ``significant`` only when both hold:

* statistically: the bootstrap interval of p99(after) − p99(before) excludes 0, with at least
  ``min_release_requests`` requests on each side;
* practically: |Δp99| ≥ max(``min_delta_ms``, ``min_delta_ratio`` × p99 before) — so identical code
  shipped under a new version is not flagged by sampling noise on a big sample.

``coupled`` (per operation): at least ``coupling_min_releases`` versions, Spearman ρ of p99 with
release index ≥ ``coupling_min_rho``, least-squares slope ≥ ``coupling_min_slope_ms`` per release, and
at least one significant upward step: p99 climbs with the release cadence.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, cast

import numpy as np
import polars as pl
import pyarrow as pa

from analytics._common import Windows, empty, normalize
from analytics.conventions import VERSION, Conventions
from analytics.schema import RELEASE_TIMES_TABLE
from analytics.stats import SortedWindow, bootstrap_quantile_delta, percentile, slope, spearman
from collectors import TRACES_TABLE, inspect_traces
from storage import Store, StoreError, as_utc

__all__ = [
    "RELEASES_SCHEMA",
    "RELEASE_COUPLING_SCHEMA",
    "RELEASE_TIMES_SCHEMA",
    "SERVED_SCHEMA",
    "STEP_REQUESTS_SCHEMA",
    "fetch_release_times",
    "first_seen_before_sql",
    "first_seen_sql",
    "p99_step_significance",
    "record_release_times",
    "release_coupling",
    "release_steps",
    "release_times_sql",
    "served_versions",
    "step_reads",
]

RELEASE_TIMES_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "version": pl.String,
    "released_at": pl.Datetime("ns", "UTC"),
}

RELEASES_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "version": pl.String,
    "released_at": pl.Datetime("us", "UTC"),
    "requests_before": pl.Int64,
    "requests_after": pl.Int64,
    "p99_before_ms": pl.Float64,
    "p99_after_ms": pl.Float64,
    "p99_delta_ms": pl.Float64,
    "significant": pl.Boolean,
    "sync_llm_calls_per_request_before": pl.Float64,
    "sync_llm_calls_per_request_after": pl.Float64,
    "p99_delta_ci_low_ms": pl.Float64,
    "p99_delta_ci_high_ms": pl.Float64,
    # What the step was measured over: before = [step_start, released_at), after =
    # [released_at, step_end).
    "step_start": pl.Datetime("us", "UTC"),
    "step_end": pl.Datetime("us", "UTC"),
}

RELEASE_COUPLING_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "releases": pl.Int64,
    "spearman_rho": pl.Float64,
    "p99_slope_ms_per_release": pl.Float64,
    "coupled": pl.Boolean,
}


def first_seen_sql(table: str) -> str:
    """First span per (service, version) in the given time ranges (``lo1..hi1`` or ``lo2..hi2``)."""
    return f"""
SELECT ServiceName AS service, {VERSION} AS version, min(Timestamp) AS first_seen
FROM {table}
WHERE ((Timestamp >= {{lo1:DateTime64(9)}} AND Timestamp < {{hi1:DateTime64(9)}})
    OR (Timestamp >= {{lo2:DateTime64(9)}} AND Timestamp < {{hi2:DateTime64(9)}}))
  AND (empty({{services:Array(String)}}) OR ServiceName IN {{services:Array(String)}})
GROUP BY service, version
HAVING version != ''
"""


def release_times_sql(table: str) -> str:
    """First-seen times recorded by the summary builds."""
    return f"""
SELECT service, version, min(first_seen) AS released_at
FROM {table}
WHERE service IN {{services:Array(String)}}
GROUP BY service, version
"""


def record_release_times(
    store: Store, lo: datetime, hi: datetime, writer: str, built_at: datetime, conventions: Conventions
) -> int:
    """Record the first span of every (service, version) in [lo, hi) (part of a summary build)."""
    params = {**conventions.sql_parameters(), "lo1": lo, "hi1": hi, "lo2": lo, "hi2": lo, "services": []}
    seen = store.query_arrow(inspect_traces(store).adapt(first_seen_sql(store.table(TRACES_TABLE))), params)
    if seen.num_rows:
        store.insert_arrow(
            store.table(RELEASE_TIMES_TABLE),
            pa.table(
                {
                    "service": seen.column("service").cast(pa.string()),
                    "version": seen.column("version").cast(pa.string()),
                    "first_seen": seen.column("first_seen"),
                    "writer": pa.array([writer] * seen.num_rows, pa.string()),
                    "built_at": pa.array([built_at] * seen.num_rows, pa.timestamp("ms", tz="UTC")),
                }
            ),
        )
    return seen.num_rows


def first_seen_before_sql(table: str, pairs: int, value_index: str = "values") -> str:
    """First span of each pair ``i`` — service ``{s<i>}``, version ``{v<i>}`` — before ``{b<i>}``, in
    the time ranges ``lo1..hi1`` or ``lo2..hi2``. One SELECT per pair, so that each pair's bounds
    reach the index analysis as constants: the primary key (service first, time last) keeps the
    service's granules before the bound, and the index over resource attribute values keeps those
    where the version appears at all — around the version's first request, a handful of granules
    instead of the whole look-back. ``value_index`` names that index
    (:attr:`collectors.TracesLayout.resource_value_index`): the 2024-25 layout's bloom filter over
    ``mapValues(ResourceAttributes)`` (``idx_res_attr_value``) or the 2026 layout's index over its
    ``key=value`` items (``idx_res_attr_items``)."""
    selects = [
        f"""
SELECT ServiceName AS service, {VERSION} AS version, min(Timestamp) AS first_seen
FROM {table}
WHERE ServiceName = {{s{i}:String}} AND Timestamp < {{b{i}:DateTime64(9)}}
  AND ((Timestamp >= {{lo1:DateTime64(9)}} AND Timestamp < {{hi1:DateTime64(9)}})
    OR (Timestamp >= {{lo2:DateTime64(9)}} AND Timestamp < {{hi2:DateTime64(9)}}))
  AND {_has_value(value_index, i)} AND version = {{v{i}:String}}
GROUP BY service, version"""
        for i in range(pairs)
    ]
    return "\nUNION ALL\n".join(selects)


# Pairs per query: a few dozen small SELECTs, far below any limit on query size.
_PAIRS_PER_QUERY = 64


# Up to this many spans, one scan is cheaper than the per-version SELECTs. Each of those is planned
# on its own (about 4 ms) and reads a handful of granules: twelve versions took 0.10-0.12 s whatever
# the table's size, while the scan took 0.04-0.06 s over 1M spans and 0.28 s over 10M.
_SCAN_MAX_ROWS = 2_000_000


def _small_scan(store: Store, table: str, parameters: dict[str, Any]) -> bool:
    """Whether :func:`first_seen_sql` would read at most ``_SCAN_MAX_ROWS`` spans, by the engine's
    own estimate from its partition and primary-key pruning (a few ms). A store that gives no
    estimate (a distributed table may not) counts as large, so it is read per version."""
    try:
        # One row per table read: (database, table, parts, rows, marks).
        estimate = store.query_rows(
            inspect_traces(store).adapt(f"EXPLAIN ESTIMATE {first_seen_sql(table)}"), parameters
        )
    except StoreError:
        return False
    return bool(estimate) and sum(int(rows) for _, _, _, rows, _ in estimate) <= _SCAN_MAX_ROWS


def _has_value(value_index: str, i: int) -> str:
    # Written exactly as the index's expression, so the index analysis recognises it.
    if value_index == "items":
        return f"has(ResourceAttributeItems, concat({{cv_version_attr:String}}, '=', {{v{i}:String}}))"
    return f"has(mapValues(ResourceAttributes), {{v{i}:String}})"


def fetch_release_times(
    store: Store,
    first_requests: pl.DataFrame,
    windows: Windows,
    conventions: Conventions,
    covered: tuple[datetime, datetime] | None = None,
) -> pl.DataFrame:
    """Release time of each (service, version) in ``first_requests`` (``service``, ``version``,
    ``start`` of the first request it served): its first span from ``release_lookback`` before the
    windows on, which is that request or an earlier span. The summary builds' records serve the
    minutes in ``covered`` (:func:`analytics.summaries.summary_extent`), raw spans the rest.

    A version's first span is at or before its first request, so only spans before that request
    are read — with the Collector's indexes, the few granules around it."""
    bounds = (
        first_requests.select(
            pl.col("service").cast(pl.String),
            pl.col("version").cast(pl.String),
            pl.col("start").cast(pl.Datetime("ns", "UTC")).alias("released_at"),
        )
        .filter(pl.col("version") != "")
        .group_by("service", "version")
        .agg(pl.col("released_at").min())
        .sort("service", "version")
    )
    if bounds.is_empty():
        return empty(RELEASE_TIMES_SCHEMA)
    lookback = min(windows.start, windows.baseline_start) - conventions.release_lookback
    end = max(windows.end, windows.baseline_end)
    # Raw spans before and after what the job covered (an empty range is lo == hi).
    lo1, hi1, lo2, hi2 = lookback, end, end, end
    frames = [bounds]
    services = bounds["service"].unique().sort().to_list()
    if covered is not None and covered[0] < end and covered[1] > lookback:
        lo1, hi1 = lookback, max(lookback, covered[0])
        lo2, hi2 = min(end, covered[1]), end
        frames.append(
            store.query_polars(release_times_sql(store.table(RELEASE_TIMES_TABLE)), {"services": services})
        )
    ranges = {**conventions.sql_parameters(), "lo1": lo1, "hi1": hi1, "lo2": lo2, "hi2": hi2}
    table = store.table(TRACES_TABLE)
    # One scan of every version before the last first request, or one SELECT per version through the
    # bloom filter over resource attribute values. Without that index each SELECT would rescan the
    # service's spans, so the scan is cheaper; with it, the scan only while the range is small.
    last = cast(datetime, bounds["released_at"].max())
    scan = {**ranges, "hi1": min(hi1, last), "hi2": min(hi2, last), "services": services}
    value_index = inspect_traces(store).resource_value_index
    if value_index is not None and not _small_scan(store, table, scan):
        rows = bounds.rows()
        for chunk in range(0, len(rows), _PAIRS_PER_QUERY):
            pairs = rows[chunk : chunk + _PAIRS_PER_QUERY]
            params = dict(ranges)
            for i, (service, version, bound) in enumerate(pairs):
                params |= {f"s{i}": service, f"v{i}": version, f"b{i}": bound}
            frames.append(
                store.query_polars(
                    inspect_traces(store).adapt(first_seen_before_sql(table, len(pairs), value_index)), params
                )
            )
    else:
        frames.append(store.query_polars(inspect_traces(store).adapt(first_seen_sql(table)), scan))
    frame = pl.concat(
        [
            normalize(f)
            .rename({"first_seen": "released_at"}, strict=False)
            .cast(pl.Schema(RELEASE_TIMES_SCHEMA))
            for f in frames
        ]
    )
    return (
        frame.join(bounds.select("service", "version"), on=["service", "version"], how="semi")
        .group_by("service", "version")
        .agg(pl.col("released_at").min())
        .sort("service", "version")
        .select(list(RELEASE_TIMES_SCHEMA))
    )


def p99_step_significance(
    before: np.ndarray | SortedWindow,
    after: np.ndarray | SortedWindow,
    conv: Conventions,
    delta: float,
    p99_before: float,
) -> tuple[bool, float | None, float | None]:
    """Whether p99 moved from ``before`` to ``after`` (durations, ms) statistically and practically,
    with the bootstrap interval of the move (``None`` below ``min_release_requests`` a side): the
    test of a release step, and of a slice against its control (analytics.slices)."""
    if before.size < conv.min_release_requests or after.size < conv.min_release_requests:
        return (False, None, None)
    low, high = bootstrap_quantile_delta(
        before,
        after,
        0.99,
        samples=conv.bootstrap_samples,
        confidence=conv.bootstrap_confidence,
        seed=conv.bootstrap_seed,
    )
    practical = abs(delta) >= max(conv.min_delta_ms, conv.min_delta_ratio * p99_before)
    statistical = low > 0 or high < 0
    return (practical and statistical, low, high)


STEP_REQUESTS_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "version": pl.String,
    "start": pl.Datetime("ns", "UTC"),
    "duration_ms": pl.Float64,
    "sync_llm_calls": pl.Int64,
}

SERVED_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "version": pl.String,
    "released_at": pl.Datetime("ns", "UTC"),
}


def served_versions(requests: pl.DataFrame, release_times: pl.DataFrame) -> pl.DataFrame:
    """One row per (service, operation, version) served in the current window of ``requests``
    (``service``, ``operation``, ``version``, ``start``, ``window``), with its release time: the
    version's first span (``release_times``), else its first request here. Pure."""
    if requests.is_empty():
        return empty(SERVED_SCHEMA)
    keys = requests.select(
        pl.col("service", "operation", "version").cast(pl.String),
        pl.col("start").cast(pl.Datetime("ns", "UTC")),
        pl.col("window").cast(pl.String),
    )
    first = keys.group_by("service", "version").agg(pl.col("start").min())
    released = first.join(
        release_times.select(pl.col("service", "version").cast(pl.String), "released_at"),
        on=["service", "version"],
        how="left",
    ).select(
        "service",
        "version",
        pl.coalesce(pl.col("released_at"), pl.col("start"))
        .cast(pl.Datetime("ns", "UTC"))
        .alias("released_at"),
    )
    return (
        keys.filter(pl.col("window") == "current")
        .select("service", "operation", "version")
        .unique()
        .join(released, on=["service", "version"], how="left")
        .sort("service", "operation", "released_at", "version")
        .select(list(SERVED_SCHEMA))
    )


def step_reads(served: pl.DataFrame, conventions: Conventions, end: datetime) -> pl.DataFrame:
    """Per (service, version) of ``served``: the release time and what a step reads around it —
    ``lo`` = ``release_step_window`` before it, ``hi`` = as long after it but not past ``end`` (a
    step is what was known at the end of the window analysed). Pure."""
    window = conventions.release_step_window
    return (
        served.select("service", "version", "released_at")
        .unique(["service", "version"])
        .with_columns(
            (pl.col("released_at") - window).alias("lo"),
            pl.min_horizontal(
                pl.col("released_at") + window, pl.lit(as_utc(end)).cast(pl.Datetime("ns", "UTC"))
            ).alias("hi"),
        )
        .sort("service", "version")
    )


def release_steps(
    served: pl.DataFrame, step_requests: pl.DataFrame, conventions: Conventions, end: datetime
) -> pl.DataFrame:
    """The release rows: per (service, operation, version) of ``served`` (:func:`served_versions`),
    the release's own step, from ``step_requests`` (:data:`STEP_REQUESTS_SCHEMA`: at least the
    requests :func:`step_reads` names; more are ignored).

    *After* is the version's first ``release_step_requests`` requests of the operation from its
    release time on, within ``release_step_window`` and not past ``end``; *before* is the requests of
    the operation that started in the same length of time just before the release (any other
    version), the last ``release_step_requests`` of them. A later change on the same version is not
    part of its release's step: it is a regression of its own. Pure."""
    if served.is_empty():
        return empty(RELEASES_SCHEMA)
    n = conventions.release_step_requests
    window = conventions.release_step_window
    by_operation = {
        (str(k[0]), str(k[1])): g.sort("start")
        for k, g in step_requests.cast(pl.Schema(STEP_REQUESTS_SCHEMA)).group_by("service", "operation")
    }
    nothing = empty(STEP_REQUESTS_SCHEMA)
    rows: list[dict[str, Any]] = []
    for row in served.sort("service", "operation", "released_at", "version").iter_rows(named=True):
        released = row["released_at"]
        hi = min(released + window, as_utc(end))
        requests = by_operation.get((row["service"], row["operation"]), nothing)
        after = requests.filter(
            (pl.col("version") == row["version"]) & (pl.col("start") >= released) & (pl.col("start") < hi)
        ).head(n)
        # The after side ends at its n-th request, or at the window's end: the before side is as long.
        step_end = after["start"][-1] + timedelta(microseconds=1) if after.height == n else hi
        span = step_end - released
        before = requests.filter(
            (pl.col("version") != row["version"])
            & (pl.col("start") >= released - span)
            & (pl.col("start") < released)
        ).tail(n)
        rows.append(_release_step(row, before, after, released - span, step_end, conventions))
    frame = pl.DataFrame(
        rows,
        schema={
            **RELEASES_SCHEMA,
            "released_at": pl.Datetime("ns", "UTC"),
            "step_start": pl.Datetime("ns", "UTC"),
            "step_end": pl.Datetime("ns", "UTC"),
        },
    )
    return frame.with_columns(pl.col("released_at", "step_start", "step_end").dt.cast_time_unit("us")).sort(
        "service", "operation", "released_at"
    )


def _release_step(
    row: dict[str, Any],
    before: pl.DataFrame,
    after: pl.DataFrame,
    step_start: datetime,
    step_end: datetime,
    conventions: Conventions,
) -> dict[str, Any]:
    """The step into ``row``'s version from the requests just ``before`` its release to its first
    requests ``after`` it."""
    before_ms = SortedWindow.of(before["duration_ms"].to_numpy())
    after_ms = SortedWindow.of(after["duration_ms"].to_numpy())
    p99_after = percentile(after_ms, 0.99)
    p99_before = percentile(before_ms, 0.99)
    delta = None if p99_after is None or p99_before is None else p99_after - p99_before
    significant, low, high = (
        (False, None, None)
        if delta is None or p99_before is None
        else p99_step_significance(before_ms, after_ms, conventions, delta, p99_before)
    )
    return {
        "service": row["service"],
        "operation": row["operation"],
        "version": row["version"],
        "released_at": row["released_at"],
        "requests_before": before.height,
        "requests_after": after.height,
        "p99_before_ms": p99_before,
        "p99_after_ms": p99_after,
        "p99_delta_ms": delta,
        "significant": significant,
        "sync_llm_calls_per_request_before": before["sync_llm_calls"].mean() if before.height else None,
        "sync_llm_calls_per_request_after": after["sync_llm_calls"].mean() if after.height else None,
        "p99_delta_ci_low_ms": low,
        "p99_delta_ci_high_ms": high,
        "step_start": step_start,
        "step_end": step_end,
    }


def release_coupling(release_rows: pl.DataFrame, conventions: Conventions) -> pl.DataFrame:
    """Per (service, operation): Spearman ρ of p99 with release index, slope, ``coupled``. Pure."""
    rows: list[dict[str, Any]] = []
    for (service, operation), group in release_rows.sort("released_at").group_by(
        "service", "operation", maintain_order=True
    ):
        p99 = group["p99_after_ms"].to_list()
        index = list(range(len(p99)))
        rho = spearman(index, p99)
        step = slope(index, p99)
        upward = bool(((group["significant"]) & (group["p99_delta_ms"] > 0)).any())
        coupled = (
            len(p99) >= conventions.coupling_min_releases
            and rho is not None
            and rho >= conventions.coupling_min_rho
            and step is not None
            and step >= conventions.coupling_min_slope_ms
            and upward
        )
        rows.append(
            {
                "service": str(service),
                "operation": str(operation),
                "releases": len(p99),
                "spearman_rho": rho,
                "p99_slope_ms_per_release": step,
                "coupled": coupled,
            }
        )
    if not rows:
        return empty(RELEASE_COUPLING_SCHEMA)
    return pl.DataFrame(rows, schema=RELEASE_COUPLING_SCHEMA).sort("service", "operation")
