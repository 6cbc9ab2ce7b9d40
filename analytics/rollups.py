"""Per-minute HdrHistogram rollups of hot-path latency, for windows too long to rescan.

``build_rollups`` is a job (not on the ingest path): it reads the hot-path roots of the minutes
since the last build from raw spans (and records the first-seen time of each release in them, see
:mod:`analytics.releases`), deduplicated in SQL, and writes one row per (minute, service,
operation, version) to ``tailwatch_rollups``: request and abandonment counts and an HdrHistogram
(V2 compressed, base64; microseconds, 3 significant digits → ≤ 0.1% value error) of the latencies.
SQL pre-aggregates the values to 4 significant digits with counts, so the Python side records a
few hundred (value, count) pairs per minute instead of every request.

Histograms with the same settings add exactly, so rows merge across minutes, versions and writers
(several rows for one minute from different writers simply add up). Which minutes are covered is
recorded in ``tailwatch_rollup_runs``; the job only ever builds after its latest watermark, and
minutes younger than ``ROLLUP_SETTLE`` are left for the next run so late spans are not missed.

For windows longer than ``Conventions.rollup_min_window`` the hot-path percentiles come from the
rollups of the covered whole minutes plus the raw requests of whatever the rollups do not cover, so
the result never depends on whether the job has run.

Sampled data: each value is recorded with the number of requests its spans stand for (the sum of
their weights, :data:`analytics.conventions.WEIGHT`), and the request and abandonment counts are
such sums. A histogram counts in integers, so those sums are rounded per (minute, operation,
version, value): a weight of 1/p from a sampling threshold (9.999… for p = 0.1) becomes 10, an
error far below the sampling's own. Unsampled data sums 1.0s, the exact counts as before.
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta
from typing import Any

import polars as pl
import pyarrow as pa
from hdrh.histogram import HdrHistogram

from analytics._common import Windows, ceil_minute, empty, floor_minute, normalize
from analytics.conventions import ABANDONED, IS_HOT_ROOT, WEIGHT, Conventions
from analytics.hot_path import HOT_PATH_SCHEMA, is_weighted
from analytics.releases import record_release_times
from analytics.schema import MIGRATIONS, ROLLUP_RUNS_TABLE, ROLLUPS_TABLE
from collectors import TRACES_TABLE, inspect_traces
from storage import Store, as_utc, ensure_schema

__all__ = [
    "HIGHEST_US",
    "ROLLUP_SETTLE",
    "build_rollups",
    "coverage",
    "long_window_hot_path",
    "new_histogram",
    "rollup_percentiles",
]

ROLLUP_SETTLE = timedelta(minutes=2)
HIGHEST_US = 24 * 3600 * 1_000_000  # a day, in microseconds: anything slower is clamped
_QUANTILES = {"p50_ms": 50.0, "p95_ms": 95.0, "p99_ms": 99.0, "p999_ms": 99.9}


def new_histogram(significant_digits: int = 3) -> HdrHistogram:
    return HdrHistogram(1, HIGHEST_US, significant_digits)


def rollup_source_sql(table: str) -> str:
    """Hot-path roots of [lo, hi) per (minute, service, operation, version, value at 4 digits)."""
    return f"""
SELECT minute, service, operation, version, groupArray((q_us, n)) AS values,
       toUInt64(sum(n)) AS requests, toUInt64(sum(ab)) AS abandoned
FROM (
    SELECT toStartOfMinute(ts) AS minute, service, operation, version,
           -- 4 significant digits: far below the histogram's own 3-digit resolution.
           toUInt64(greatest(1, least({{highest:Float64}},
               round(us / exp10(greatest(0, floor(log10(greatest(us, 1))) - 3)))
               * exp10(greatest(0, floor(log10(greatest(us, 1))) - 3))))) AS q_us,
           -- The requests each value stands for (weights summed, then rounded: see the module).
           toUInt64(round(sum(weight))) AS n, toUInt64(round(sumIf(weight, is_abandoned))) AS ab
    FROM (
        SELECT Timestamp AS ts, ServiceName AS service, SpanName AS operation,
               ResourceAttributes[{{cv_version_attr:String}}] AS version,
               Duration / 1000 AS us, {ABANDONED} AS is_abandoned, {WEIGHT} AS weight
        FROM {table}
        WHERE Timestamp >= {{lo:DateTime64(9)}} AND Timestamp < {{hi:DateTime64(9)}} AND {IS_HOT_ROOT}
        LIMIT 1 BY TraceId, SpanId
    )
    GROUP BY minute, service, operation, version, q_us
)
GROUP BY minute, service, operation, version
ORDER BY minute, service, operation, version
"""


def coverage(store: Store) -> tuple[datetime, datetime] | None:
    """[from, until) the rollups cover, or ``None`` before the first build."""
    if not store.table_exists(ROLLUP_RUNS_TABLE):
        return None
    row = store.query_rows(
        f"SELECT count(), min(built_from), max(built_until) FROM {store.table(ROLLUP_RUNS_TABLE)}"
    )[0]
    if not row[0]:
        return None
    return (as_utc(row[1]), as_utc(row[2]))


def build_rollups(store: Store, until: datetime | None = None, conventions: Conventions | None = None) -> int:
    """Roll up every whole minute from the last watermark (or the first span) to ``until`` (default:
    now − ``ROLLUP_SETTLE``). Returns the number of rollup rows written."""
    conv = conventions or Conventions()
    ensure_schema(store, MIGRATIONS)
    limit = floor_minute(as_utc(until) if until is not None else datetime.now(UTC) - ROLLUP_SETTLE)
    covered = coverage(store)
    if covered is not None:
        lo = covered[1]
    else:
        first = store.query_value(
            f"SELECT min(Timestamp) FROM {store.table(TRACES_TABLE)} "
            f"WHERE Timestamp < {{hi:DateTime64(9)}} AND ParentSpanId = ''",
            {"hi": limit},
        )
        if first is None or first.year < 1971:
            return 0
        lo = floor_minute(as_utc(first))
    if lo >= limit:
        return 0
    params = {**conv.sql_parameters(), "lo": lo, "hi": limit, "highest": HIGHEST_US}
    source = store.query_arrow(
        inspect_traces(store).adapt(rollup_source_sql(store.table(TRACES_TABLE))), params
    )
    writer = f"{socket.gethostname()}:{os.getpid()}"
    built_at = datetime.now(UTC)
    histograms: list[str] = []
    for values in source.column("values").to_pylist():
        hist = new_histogram(conv.rollup_significant_digits)
        for item in values:
            value, count = (item["1"], item["2"]) if isinstance(item, dict) else item
            hist.record_value(int(value), int(count))
        histograms.append(hist.encode().decode("ascii"))
    rows = source.num_rows
    if rows:
        store.insert_arrow(
            store.table(ROLLUPS_TABLE),
            pa.table(
                {
                    "minute": source.column("minute"),
                    "service": source.column("service").cast(pa.string()),
                    "operation": source.column("operation").cast(pa.string()),
                    "version": source.column("version").cast(pa.string()),
                    "requests": source.column("requests"),
                    "abandoned": source.column("abandoned"),
                    "histogram": pa.array(histograms, pa.string()),
                    "writer": pa.array([writer] * rows, pa.string()),
                    "built_at": pa.array([built_at] * rows, pa.timestamp("ms", tz="UTC")),
                }
            ),
        )
    record_release_times(store, lo, limit, writer, built_at, conv)
    # The watermark is written after the rows: a crash in between rebuilds those minutes' rows again
    # only if the run row is missing, and then readers never saw them as covered.
    store.insert_arrow(
        store.table(ROLLUP_RUNS_TABLE),
        pa.table(
            {
                "built_from": pa.array([lo], pa.timestamp("s", tz="UTC")),
                "built_until": pa.array([limit], pa.timestamp("s", tz="UTC")),
                "rows": pa.array([rows], pa.uint64()),
                "writer": [writer],
                "built_at": pa.array([built_at], pa.timestamp("ms", tz="UTC")),
            }
        ),
    )
    return rows


def _fetch_rollups(store: Store, lo: datetime, hi: datetime) -> pl.DataFrame:
    frame = store.query_polars(
        f"SELECT service, operation, groupArray(histogram) AS histograms, toInt64(sum(requests)) AS requests "
        f"FROM {store.table(ROLLUPS_TABLE)} "
        "WHERE minute >= {lo:DateTime} AND minute < {hi:DateTime} GROUP BY service, operation",
        {"lo": lo, "hi": hi},
    )
    return normalize(frame)


def rollup_percentiles(
    histograms: list[str],
    raw_ms: list[float],
    significant_digits: int = 3,
    raw_weights: list[float] | None = None,
) -> dict[str, Any]:
    """Merge minute histograms and raw latencies (ms; each counted ``raw_weights`` times, rounded,
    when sampled); percentiles in ms. Pure.

    HdrHistogram answers with the highest value equivalent to the percentile's bucket, so results
    are within the histogram's resolution (0.1% at 3 digits) of the nearest-rank value.
    """
    merged = new_histogram(significant_digits)
    for encoded in histograms:
        merged.decode_and_add(encoded)
    if raw_weights is None:
        for ms in raw_ms:
            merged.record_value(max(1, min(HIGHEST_US, round(ms * 1000))))
    else:
        for ms, weight in zip(raw_ms, raw_weights, strict=True):
            merged.record_value(max(1, min(HIGHEST_US, round(ms * 1000))), max(1, round(weight)))
    out: dict[str, Any] = {"requests": int(merged.get_total_count())}
    for name, pct in _QUANTILES.items():
        out[name] = merged.get_value_at_percentile(pct) / 1000.0 if out["requests"] else None
    return out


def long_window_hot_path(
    store: Store, windows: Windows, conventions: Conventions, requests: pl.DataFrame, exact: pl.DataFrame
) -> pl.DataFrame:
    """For a window longer than ``rollup_min_window``: hot-path percentiles from rollups plus the raw
    requests of the parts the rollups do not cover. Shorter windows keep the exact ``exact`` frame."""
    if windows.end - windows.start <= conventions.rollup_min_window:
        return exact
    covered = coverage(store)
    if covered is None:
        return exact
    lo = max(ceil_minute(windows.start), covered[0])
    hi = min(floor_minute(windows.end), covered[1])
    if hi <= lo:
        return exact
    rolled = _fetch_rollups(store, lo, hi)
    current = requests.filter(pl.col("window") == "current")
    raw = current.filter((pl.col("start") < lo) | (pl.col("start") >= hi))
    raw_by_op = {
        (str(s), str(o)): g["duration_ms"].to_list()
        for (s, o), g in raw.group_by("service", "operation", maintain_order=True)
    }
    weighted = is_weighted(current)
    raw_weights = (
        {
            (str(s), str(o)): g["weight"].fill_null(1.0).to_list()
            for (s, o), g in raw.group_by("service", "operation", maintain_order=True)
        }
        if weighted
        else {}
    )
    hist_by_op = {
        (str(r["service"]), str(r["operation"])): list(r["histograms"]) for r in rolled.iter_rows(named=True)
    }
    # Calls per request and the sample behind the figures come from the window's requests, which
    # analyze() reads in full anyway (the exact frame): the stored requests a rollup counted are
    # the same ones, and its p99 is within the histogram's 0.1% of the exact one they were counted at.
    beside = [
        "sync_llm_calls_per_request",
        "sampled_requests",
        "effective_sample_size",
        "p99_tail_samples",
        "p99_warning",
    ]
    llm = exact.select("service", "operation", *beside)
    rows = []
    for key in sorted(set(raw_by_op) | set(hist_by_op)):
        stats = rollup_percentiles(
            hist_by_op.get(key, []),
            raw_by_op.get(key, []),
            conventions.rollup_significant_digits,
            raw_weights.get(key, []) if weighted else None,
        )
        rows.append({"service": key[0], "operation": key[1], **stats})
    if not rows:
        return empty(HOT_PATH_SCHEMA)
    frame = pl.DataFrame(rows).join(
        llm.cast({"service": pl.String, "operation": pl.String}), on=["service", "operation"], how="left"
    )
    schema = {k: v for k, v in HOT_PATH_SCHEMA.items() if k in frame.columns}
    return frame.cast(pl.Schema(schema)).select(list(HOT_PATH_SCHEMA))
