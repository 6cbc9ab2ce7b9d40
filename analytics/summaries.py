"""Summaries: each minute of spans reduced once to what the metrics read, so that a window's
analysis costs what its new minutes cost, not what the window holds.

``build_summaries`` is a job. For every whole minute from its last watermark to now minus
:func:`summary_settle` (the trace margin and a minute: a request's LLM calls and a job's run have
arrived by then) it runs the first half of an analysis — the span reads and everything that takes a
whole trace to decide — and writes the narrow rows of :mod:`analytics.summary_tables`: one per
hot-path request (with its synchronous LLM calls and the time they hold it), per logical LLM call,
per job span, per span of a workflow trace, per flag evaluation, and the critical path of the
slowest requests of each minute and operation (those at or above the minute's
``1 − summary_walk_share`` quantile), walked once.

Late and repeated spans: each summarised minute records how many span rows it held. Every build
counts the rows of the minutes within ``summary_late_horizon`` again (one read of the timestamp
column); a minute whose count changed is summarised again, with the trace margin before it (a late
LLM call changes the request it belongs to), its old rows deleted first. Rows are read deduplicated,
so a retried export changes a count but never a figure.

``summarised_inputs`` is the other half: for a window and its baseline it reads the stored rows of
the covered minutes and extracts the rest (the minutes not summarised yet, typically the last few)
from raw spans the same way, so every window — whole minutes or not, covered or not — gets the same
frames a full analysis builds; :func:`analytics.analyze` runs the same metric code on them. Tail
traces whose critical path was not walked (a burst minute whose own tail starts above the window's
p99) are walked then, from their minutes' spans, and kept.

Retention: the summaries keep ``summary_retention`` (default 90 days) whatever the span table's TTL,
dropped by whole days.
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import cached_property
from typing import Any, cast

import numpy as np
import polars as pl

from analytics._common import Windows, ceil_minute, empty, first_of_each, floor_minute, normalize
from analytics.aggregates import (
    ABANDONMENT_STATE_SCHEMA,
    AGG_REQUESTS_SCHEMA,
    COUNTERFACTUAL_STATE_SCHEMA,
    LATENCY_STATE_SCHEMA,
    TOTALS_STATE_SCHEMA,
    VERSION_LATENCY_STATE_SCHEMA,
    abandonment_state,
    aggregate_requests,
    counterfactual_state,
    latency_state,
    series_bucket,
    tail_stats_from_state,
    totals_state,
    version_latency_state,
)
from analytics.ancestry import boundary_traces, without_queued_calls
from analytics.attribution import CRITICAL_PATH_SCHEMA, critical_path, tail_spans
from analytics.boundary import sync_llm_union_ns
from analytics.cold_path import (
    JOB_SPANS_SCHEMA,
    JOB_STATS_SCHEMA,
    JOBS_SCHEMA,
    fetch_job_spans,
    job_stats_sql,
    jobs_from_raw,
    jobs_reduction_sql,
    jobs_sql,
)
from analytics.conventions import Conventions
from analytics.hot_path import REQUESTS_SCHEMA, WINDOW, request_rows, with_sync_llm_calls
from analytics.hot_path import latency_good_total as raw_good_total
from analytics.llm_anatomy import ANATOMY_BUCKETS_SCHEMA, anatomy_buckets
from analytics.llm_calls import CALLS_SCHEMA, logical_calls, span_attempts
from analytics.llm_spans import fetch_llm_spans, fetch_roots
from analytics.releases import STEP_REQUESTS_SCHEMA, record_release_times
from analytics.request_costs import REQUEST_LLM_STATE_SCHEMA, request_llm_state
from analytics.retries import (
    RETRY_HOP_STATE_SCHEMA,
    RETRY_RUN_STATE_SCHEMA,
    WORKFLOW_SPANS_SCHEMA,
    retry_state,
    workflow_spans,
    workflows_from_spans,
)
from analytics.schema import MIGRATIONS
from analytics.sketch import bucket_expr
from analytics.slices import FLAG_EVALUATIONS_SCHEMA, fetch_flag_evaluations
from analytics.stats import OutsideWindow, SortedWindow, polars_quantile
from analytics.summary_tables import (
    AGG_LLM_ANATOMY_HOURS_TABLE,
    AGG_LLM_ANATOMY_TABLE,
    AGG_REQUEST_LLM_TABLE,
    AGG_REQUESTS_TABLE,
    AGG_WORKFLOW_HOPS_TABLE,
    AGG_WORKFLOW_RUNS_TABLE,
    CALL_MINUTES_TABLE,
    CALLS_TABLE,
    EVALUATIONS_TABLE,
    HOUR_TABLES,
    HOURS_TABLE,
    JOB_SPANS_TABLE,
    MINUTES_TABLE,
    REQUEST_MINUTES_TABLE,
    REQUESTS_TABLE,
    SUMMARY_TABLES,
    TAIL_WALKS_TABLE,
    TOP_REQUESTS_TABLE,
    WORKFLOW_SPANS_TABLE,
)
from analytics.trace_spans import fetch_trace_spans, with_span_attributes
from collectors import TRACES_TABLE, distributed_parts, inspect_traces
from storage import Lease, Store, StoreError, as_utc, ensure_schema, quote_identifier

__all__ = [
    "SummaryBuild",
    "SummaryInputs",
    "build_summaries",
    "extract_range",
    "latency_good_total",
    "step_requests",
    "summarised_inputs",
    "summary_coverage",
    "summary_extent",
    "summary_settle",
]

_MINUTE = timedelta(minutes=1)
_HOUR = timedelta(hours=1)
# The layout a minute is summarised with: 1 adds the per-minute aggregates (analytics.aggregates),
# 2 the workflow runs' (analytics.retries.retry_state), 3 the LLM calls that failed after their
# retries (failed_calls), 4 the calls' anatomy (tokens, cache, first token, and
# tailwatch_agg_llm_anatomy), 5 the requests' time to first byte. A build summarises again every
# minute recorded with an older layout.
LAYER = 5
# Recorded for a chunk's minutes before its rows are written, replaced by LAYER once they all are:
# a build killed in between leaves them so, and the next build summarises them again (after
# deleting whatever part of their rows was written).
IN_PROGRESS = 255
# A chunk of a sparse store can span many days (one partition each): its rows go in one insert.
_ACROSS_DAYS = {"max_partitions_per_insert_block": 0}
# How long a summary build's lease lasts without renewal (it renews after every chunk): a build
# killed mid-way holds off the others no longer than this.
_LEASE_TTL_S = 300.0
_Q = 0.99  # the quantile whose ranks (and bootstrap draws) the top requests must hold
_KEY_SCHEMA: dict[str, Any] = {"service": pl.String, "operation": pl.String}
_TOP_ROW_SCHEMA: dict[str, Any] = {
    **_KEY_SCHEMA,
    "version": pl.String,
    "window": pl.String,
    "trace_key": pl.UInt64,
    "start": pl.Datetime("ns", "UTC"),
    "duration_ms": pl.Float64,
}
_TOP_ROW_COLUMNS = list(_TOP_ROW_SCHEMA)
_LOOSE_SCHEMA: dict[str, Any] = {**_TOP_ROW_SCHEMA, "weight": pl.Float64, "sync_llm_calls": pl.Int64}
_TOP_COUNTS_SCHEMA: dict[str, Any] = {
    **_KEY_SCHEMA,
    "version": pl.String,
    "window": pl.String,
    "n": pl.Int64,
    "floor": pl.Float64,
    "sync": pl.Int64,
    "first_start": pl.Datetime("ns", "UTC"),
}
_TAIL_SCHEMA: dict[str, Any] = {
    **_KEY_SCHEMA,
    "window": pl.String,
    "trace_key": pl.UInt64,
    "duration_ms": pl.Float64,
    "start": pl.Datetime("ns", "UTC"),
}
# Repeated strings arrive as Arrow dictionaries (Polars categoricals): a fraction of the bytes.
_DICTIONARIES = "SETTINGS output_format_arrow_low_cardinality_as_dictionary = 1"
# Tail traces to walk at read time whose minutes lie this close are read together.
_WALK_GAP = timedelta(minutes=15)

# A request row as stored: the request columns but the window, and the time its synchronous LLM
# calls hold it (the union of their intervals, clipped to it).
STORED_REQUESTS_SCHEMA: dict[str, Any] = {
    **{k: v for k, v in REQUESTS_SCHEMA.items() if k != "window"},
    "service": pl.String,
    "operation": pl.String,
    "version": pl.String,
    "sync_llm_ms": pl.Float64,
}
# A logical LLM call: the call columns but the window, with its span times.
STORED_CALLS_SCHEMA: dict[str, Any] = {
    **{k: v for k, v in CALLS_SCHEMA.items() if k != "window"},
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
}
WALKS_SCHEMA: dict[str, Any] = {
    "trace_key": pl.UInt64,
    "trace_id": pl.String,
    "start": pl.Datetime("ns", "UTC"),
    "llm_ns": pl.Int64,
}
REQUEST_MINUTES_SCHEMA: dict[str, Any] = {
    "start": pl.Datetime("ns", "UTC"),  # the minute
    "service": pl.String,
    "operation": pl.String,
    "version": pl.String,
    "requests": pl.Int64,
    "weight_max": pl.Float64,
    "weight_min": pl.Float64,
    "sync_llm_calls": pl.Int64,
    "first_start": pl.Datetime("ns", "UTC"),
    "threshold_ms": pl.Float64,  # every request this slow or slower is a top request
}
_SUMS = (
    "attempts",
    "failed_attempts",
    "throttled_attempts",
    "backoff_ns",
    "tokens",
    "failed_calls",
    "input_tokens",
    "output_tokens",
    "cached_tokens",
    "streamed_calls",
    "cached_calls",
)
# The logical LLM calls summed per provider, model and path: per minute as kept, per window as read.
_CALL_SUMS: dict[str, Any] = {
    "provider": pl.String,
    "model": pl.String,
    "sync": pl.Boolean,
    "calls": pl.Int64,
    **dict.fromkeys(_SUMS, pl.Int64),
}
CALL_MINUTES_SCHEMA: dict[str, Any] = {"start": pl.Datetime("ns", "UTC"), **_CALL_SUMS}
STORED_WORKFLOW_SPANS_SCHEMA: dict[str, Any] = {**WORKFLOW_SPANS_SCHEMA, "wf_start_ns": pl.Int64}
STORED_EVALUATIONS_SCHEMA: dict[str, Any] = {**FLAG_EVALUATIONS_SCHEMA, "span_ns": pl.Int64}


def summary_settle(conventions: Conventions) -> timedelta:
    """How long a minute waits before it is summarised: the trace margin (a request's LLM calls and
    its trace's spans have started by then) and a minute for the exporters' batches."""
    return conventions.trace_margin + _MINUTE


# --- one range of spans, reduced ---------------------------------------------------------------


@dataclass
class RangeRows:
    """What the spans of [lo, hi) reduce to, in the summary tables' columns."""

    lo: datetime
    hi: datetime
    requests: pl.DataFrame  # STORED_REQUESTS_SCHEMA
    top_requests: pl.DataFrame  # STORED_REQUESTS_SCHEMA: the requests at or above their threshold
    request_minutes: pl.DataFrame  # REQUEST_MINUTES_SCHEMA
    calls: pl.DataFrame  # STORED_CALLS_SCHEMA, calls started in [lo, hi)
    call_minutes: pl.DataFrame  # CALL_MINUTES_SCHEMA: their totals per minute
    walks: pl.DataFrame  # WALKS_SCHEMA, one row per walked trace
    paths: pl.DataFrame  # CRITICAL_PATH_SCHEMA rows of the walked traces
    job_spans: pl.DataFrame  # JOB_SPANS_SCHEMA
    workflow_spans: pl.DataFrame  # STORED_WORKFLOW_SPANS_SCHEMA, workflows started in [lo, hi)
    evaluations: pl.DataFrame  # STORED_EVALUATIONS_SCHEMA, of spans started in [lo, hi)
    request_aggregates: pl.DataFrame  # analytics.aggregates.AGG_REQUESTS_SCHEMA, per minute
    # analytics.retries.retry_state per minute the workflow runs started (``start``)
    workflow_hop_aggregates: pl.DataFrame
    workflow_run_aggregates: pl.DataFrame
    # analytics.llm_anatomy.anatomy_buckets per minute the calls started (``start``)
    anatomy_aggregates: pl.DataFrame
    # analytics.request_costs.request_llm_state per minute the requests started (``start``)
    request_llm_aggregates: pl.DataFrame

    @classmethod
    def empty(cls, lo: datetime, hi: datetime) -> RangeRows:
        return cls(
            lo,
            hi,
            empty(STORED_REQUESTS_SCHEMA),
            empty(STORED_REQUESTS_SCHEMA),
            empty(REQUEST_MINUTES_SCHEMA),
            empty(STORED_CALLS_SCHEMA),
            empty(CALL_MINUTES_SCHEMA),
            empty(WALKS_SCHEMA),
            empty(CRITICAL_PATH_SCHEMA),
            empty(JOB_SPANS_SCHEMA),
            empty(STORED_WORKFLOW_SPANS_SCHEMA),
            empty(STORED_EVALUATIONS_SCHEMA),
            empty(AGG_REQUESTS_SCHEMA),
            empty({**RETRY_HOP_STATE_SCHEMA, "start": pl.Datetime("ns", "UTC")}),
            empty({**RETRY_RUN_STATE_SCHEMA, "start": pl.Datetime("ns", "UTC")}),
            empty(ANATOMY_MINUTES_SCHEMA),
            empty(REQUEST_LLM_MINUTES_SCHEMA),
        )


_VERSION_KEYS = ["service", "operation", "version"]


def _thresholds(requests: pl.DataFrame, share: float) -> pl.DataFrame:
    """``requests`` with ``_minute`` and ``_threshold``: the ``1 − share`` quantile of the request's
    (minute, service, operation, version) or of its hour's, the lower — the minute's for a burst,
    the hour's for a version with a few requests a minute."""
    q = pl.col("duration_ms").quantile(1.0 - share, interpolation="linear")
    minute = pl.col("start").dt.truncate("1m")
    by_minute = q.over(minute, *_VERSION_KEYS)
    by_hour = q.over(pl.col("start").dt.truncate("1h"), *_VERSION_KEYS)
    return requests.with_columns(
        minute.alias("_minute"), pl.min_horizontal(by_minute, by_hour).alias("_threshold")
    )


def top_requests(marked: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The slowest requests of ``marked`` (requests with their :func:`_thresholds`: those at or
    above it; their critical path is walked when summarised, and a window's p99 and tail are read
    from them) and, per (minute, service, operation, version), the counts beside them
    (:data:`REQUEST_MINUTES_SCHEMA`). Every request of a minute at or above its ``threshold_ms``
    is a top request. Pure."""
    if marked.is_empty():
        return marked.drop("_minute", "_threshold"), empty(REQUEST_MINUTES_SCHEMA)
    top = marked.filter(pl.col("duration_ms") >= pl.col("_threshold")).drop("_minute", "_threshold")
    minutes = (
        marked.group_by("_minute", *_VERSION_KEYS)
        .agg(
            pl.len().cast(pl.Int64).alias("requests"),
            pl.col("weight").fill_null(1.0).max().alias("weight_max"),
            pl.col("weight").fill_null(1.0).min().alias("weight_min"),
            pl.col("sync_llm_calls").sum().cast(pl.Int64),
            pl.col("start").min().alias("first_start"),
            pl.col("_threshold").first().alias("threshold_ms"),
        )
        .rename({"_minute": "start"})
        .with_columns(pl.col(*_VERSION_KEYS).cast(pl.String))
        .select(list(REQUEST_MINUTES_SCHEMA))
        .cast(pl.Schema(REQUEST_MINUTES_SCHEMA))
    )
    return top, minutes


ANATOMY_MINUTES_SCHEMA: dict[str, Any] = {"start": pl.Datetime("ns", "UTC"), **ANATOMY_BUCKETS_SCHEMA}
REQUEST_LLM_MINUTES_SCHEMA: dict[str, Any] = {"start": pl.Datetime("ns", "UTC"), **REQUEST_LLM_STATE_SCHEMA}
_REQUEST_LLM_SUMS = ("requests", "calls", "input_tokens", "output_tokens", "cached_tokens")
_MINUTE_OF_START = pl.col("start").cast(pl.Datetime("ns", "UTC")).dt.truncate("1m").alias("start")


def anatomy_minutes(calls: pl.DataFrame) -> pl.DataFrame:
    """The calls' anatomy histograms per (minute, provider, model) (:data:`ANATOMY_MINUTES_SCHEMA`).
    Pure."""
    minute = pl.col("start_ns").cast(pl.Datetime("ns", "UTC")).dt.truncate("1m").alias("start")
    return anatomy_buckets(calls.with_columns(minute), ["start", "provider", "model"]).select(
        list(ANATOMY_MINUTES_SCHEMA)
    )


def call_minutes(calls: pl.DataFrame) -> pl.DataFrame:
    """The logical LLM calls per (minute, provider, model, path): their count and sums
    (:data:`CALL_MINUTES_SCHEMA`). Pure."""
    if calls.is_empty():
        return empty(CALL_MINUTES_SCHEMA)
    minute = pl.col("start_ns").cast(pl.Datetime("ns", "UTC")).dt.truncate("1m")
    return (
        calls.group_by(minute.alias("start"), "provider", "model", "sync")
        .agg(pl.len().cast(pl.Int64).alias("calls"), *(pl.col(c).sum().cast(pl.Int64) for c in _SUMS))
        .select(list(CALL_MINUTES_SCHEMA))
        .cast(pl.Schema(CALL_MINUTES_SCHEMA))
    )


def _minute_pieces(
    ranges: list[tuple[datetime, datetime]], cuts: list[datetime]
) -> tuple[list[tuple[datetime, datetime]], list[tuple[datetime, datetime]]]:
    """``ranges`` cut at ``cuts`` into the whole minutes of each piece and what is left over: the
    per-minute totals serve the first, the rows the second."""
    whole: list[tuple[datetime, datetime]] = []
    partial: list[tuple[datetime, datetime]] = []
    for lo, hi in ranges:
        bounds = [lo, *sorted({c for c in cuts if lo < c < hi}), hi]
        for a, b in itertools.pairwise(bounds):
            first, last = ceil_minute(a), floor_minute(b)
            if first >= last:
                partial.append((a, b))
                continue
            whole.append((first, last))
            partial += [(x, y) for x, y in ((a, first), (last, b)) if x < y]
    return whole, partial


def extract_range(
    store: Store,
    lo: datetime,
    hi: datetime,
    conventions: Conventions,
    *,
    walk: pl.Series | None = None,
    with_candidates: bool = True,
    requests_only: bool = False,
) -> RangeRows:
    """The spans of [lo, hi) reduced as :func:`analytics.analyze` reduces a window's: the reads see
    the trace margin on both sides (a request's calls after ``hi``, the roots before ``lo`` that make
    a call synchronous), the rows kept are those that start in [lo, hi). ``walk``: trace keys to
    walk besides the top requests (:func:`top_requests`; none with ``with_candidates`` False).
    ``requests_only``: only the request rows (with their synchronous LLM calls), the rest empty."""
    conv = conventions
    margin = conv.trace_margin
    reads = Windows(lo, hi, lo - margin, lo)
    only = Windows(lo, hi, lo, hi)
    roots = first_of_each(fetch_roots(store, reads, conv), "trace_key")
    rows = request_rows(roots, reads).filter(pl.col("window") == "current")
    llm_spans = first_of_each(fetch_llm_spans(store, reads, conv), "span_key")
    attempts = span_attempts(llm_spans)
    workflows = workflows_from_spans(llm_spans, only)
    if requests_only:
        workflows, with_candidates = workflows.clear(), False
    # Each request's threshold, once: the top requests are walked now and kept at the end.
    marked = _thresholds(rows, conv.summary_walk_share)
    thresholds = marked.select("trace_key", "_minute", "_threshold")
    chosen = (
        marked.filter(pl.col("duration_ms") >= pl.col("_threshold"))["trace_key"]
        if with_candidates
        else empty({"trace_key": pl.UInt64})["trace_key"]
    )
    if walk is not None:
        chosen = pl.concat([chosen, walk.cast(pl.UInt64)]).unique()
    candidates = rows.filter(pl.col("trace_key").is_in(chosen.implode())).select(
        "service", "operation", "window", "trace_key", "duration_ms", "start"
    )
    trace_rows = fetch_trace_spans(
        store,
        candidates,
        workflows,
        reads,
        conv,
        boundaries=boundary_traces(llm_spans, roots["trace_key"]),
    )
    llm_spans = without_queued_calls(llm_spans, trace_rows, roots["trace_key"])
    every_call = logical_calls(llm_spans, attempts, roots["trace_key"])
    requests = with_sync_llm_calls(rows, every_call)
    union = sync_llm_union_ns(requests, every_call)
    stored_requests = (
        requests.with_columns(pl.Series("sync_llm_ms", union / 1e6, dtype=pl.Float64))
        .select(list(STORED_REQUESTS_SCHEMA))
        .cast(pl.Schema(STORED_REQUESTS_SCHEMA))
    )
    if requests_only:
        return replace(RangeRows.empty(lo, hi), requests=stored_requests)
    start = pl.col("start_ns")
    lo_ns, hi_ns = pl.lit(lo).dt.epoch("ns"), pl.lit(hi).dt.epoch("ns")
    calls = (
        every_call.filter((start >= lo_ns) & (start < hi_ns))
        .select(list(STORED_CALLS_SCHEMA))
        .cast(pl.Schema(STORED_CALLS_SCHEMA))
    )
    trace_spans = with_span_attributes(trace_rows, llm_spans, attempts)
    walked_spans = tail_spans(trace_spans).join(candidates.select("trace_key"), on="trace_key", how="semi")
    paths = critical_path(walked_spans)
    ids = walked_spans.filter(pl.col("trace_id") != "").select("trace_key", "trace_id").unique("trace_key")
    walks = (
        candidates.select("trace_key", "start")
        .join(ids, on="trace_key", how="inner")
        .join(
            paths.group_by("trace_key").agg(
                pl.col("critical_ns").filter(pl.col("class") == "llm").sum().cast(pl.Int64).alias("llm_ns")
            ),
            on="trace_key",
            how="left",
        )
        .with_columns(pl.col("llm_ns").fill_null(0))
        .select(list(WALKS_SCHEMA))
        .cast(pl.Schema(WALKS_SCHEMA))
    )
    wf_starts = llm_spans.select(
        pl.col("span_key").alias("wf_span_key"), pl.col("start_ns").alias("wf_start_ns")
    )
    wf_spans = (
        workflow_spans(trace_spans, workflows, only, conv)
        .join(first_of_each(wf_starts, "wf_span_key"), on="wf_span_key", how="left")
        .select(list(STORED_WORKFLOW_SPANS_SCHEMA))
        .cast(pl.Schema(STORED_WORKFLOW_SPANS_SCHEMA))
    )
    top, minutes = top_requests(stored_requests.join(thresholds, on="trace_key", how="left"))
    run_minute = pl.col("wf_start_ns").cast(pl.Datetime("ns", "UTC")).dt.truncate("1m").alias("start")
    hop_state, run_state = retry_state(wf_spans, [run_minute])
    return RangeRows(
        lo=lo,
        hi=hi,
        requests=stored_requests,
        top_requests=top,
        request_minutes=minutes,
        calls=calls,
        call_minutes=call_minutes(calls),
        walks=walks,
        paths=paths.join(walks.select("trace_key"), on="trace_key", how="semi"),
        job_spans=fetch_job_spans(store, only, conv),
        workflow_spans=wf_spans,
        evaluations=fetch_flag_evaluations(store, only, conv, margin=False),
        request_aggregates=aggregate_requests(stored_requests, conv, walks),
        workflow_hop_aggregates=hop_state,
        workflow_run_aggregates=run_state,
        anatomy_aggregates=anatomy_minutes(calls),
        request_llm_aggregates=request_llm_state(stored_requests, every_call, [_MINUTE_OF_START]),
    )


# --- writing and reading the tables ------------------------------------------------------------


def _ns_time(column: str) -> pl.Expr:
    return pl.col(column).cast(pl.Datetime("ns", "UTC"))


def _write(store: Store, rows: RangeRows) -> dict[str, int]:
    walks = rows.walks.join(
        rows.paths.group_by("trace_key").agg(
            pl.col("span_key"),
            pl.col("critical_ns"),
            pl.col("self_ns"),
            pl.col("class"),
            pl.col("span_name"),
            pl.col("provider"),
            pl.col("model"),
        ),
        on="trace_key",
        how="left",
    ).with_columns(
        pl.col("span_key").fill_null(pl.lit([], pl.List(pl.UInt64))),
        pl.col("critical_ns", "self_ns").fill_null(pl.lit([], pl.List(pl.Int64))),
        pl.col("class", "span_name", "provider", "model").fill_null(pl.lit([], pl.List(pl.String))),
    )
    tables = {
        REQUESTS_TABLE: rows.requests.with_columns(pl.col("service", "operation", "version").cast(pl.String)),
        TOP_REQUESTS_TABLE: rows.top_requests.with_columns(
            pl.col("service", "operation", "version").cast(pl.String)
        ),
        REQUEST_MINUTES_TABLE: rows.request_minutes,
        CALL_MINUTES_TABLE: rows.call_minutes,
        CALLS_TABLE: rows.calls.with_columns(_ns_time("start_ns").alias("start")),
        TAIL_WALKS_TABLE: walks,
        JOB_SPANS_TABLE: rows.job_spans.with_columns(_ns_time("start_ns").alias("start")),
        WORKFLOW_SPANS_TABLE: rows.workflow_spans.with_columns(_ns_time("wf_start_ns").alias("start")).drop(
            "wf_start_ns"
        ),
        EVALUATIONS_TABLE: rows.evaluations.with_columns(_ns_time("span_ns").alias("start")).drop("span_ns"),
        AGG_REQUESTS_TABLE: rows.request_aggregates,
        AGG_WORKFLOW_HOPS_TABLE: rows.workflow_hop_aggregates,
        AGG_WORKFLOW_RUNS_TABLE: rows.workflow_run_aggregates,
        AGG_LLM_ANATOMY_TABLE: rows.anatomy_aggregates,
        AGG_REQUEST_LLM_TABLE: rows.request_llm_aggregates,
    }
    written = {}
    for name, frame in tables.items():
        if not frame.is_empty():
            store.insert_arrow(
                store.table(name),
                frame.with_columns(pl.col("start").dt.cast_time_unit("ns")).to_arrow(),
                settings=_ACROSS_DAYS,
            )
        written[name] = frame.height
    return written


def data_tables(store: Store) -> dict[str, str]:
    """Per summary table, where its rows are changed: the table itself, or — on a cluster, where
    the table is ``Distributed`` — the table it reads, ``ON CLUSTER`` (deletes and partition drops
    go to every shard)."""
    rows = store.query_rows(
        "SELECT name, engine, engine_full FROM system.tables "
        "WHERE database = {db:String} AND has({names:Array(String)}, name)",
        {"db": store.database, "names": [*SUMMARY_TABLES, *HOUR_TABLES, MINUTES_TABLE]},
    )
    out = {name: store.table(name) for name in (*SUMMARY_TABLES, *HOUR_TABLES, MINUTES_TABLE)}
    for name, engine, engine_full in rows:
        parts = distributed_parts(engine_full, store.database) if engine == "Distributed" else None
        if parts is not None:
            cluster, database, table = parts
            where = f"{quote_identifier(database)}.{quote_identifier(table)}"
            out[name] = f"{where} ON CLUSTER {quote_identifier(cluster)}"
    return out


def _delete(store: Store, lo: datetime, hi: datetime, tables: dict[str, str]) -> None:
    """Remove the rows of [lo, hi) before they are written again (lightweight deletes), and the
    pre-merged hours they are part of — the hour's record first, so that no reader takes the hour's
    rows for whole once one of its minutes is gone."""
    for name in HOUR_TABLES:  # the record first
        store.command(
            f"DELETE FROM {tables[name]} "
            "WHERE start >= toStartOfHour({lo:DateTime64(9)}) AND start < {hi:DateTime64(9)}",
            {"lo": lo, "hi": hi},
        )
    for name in SUMMARY_TABLES:
        store.command(
            f"DELETE FROM {tables[name]} "
            "WHERE start >= {lo:DateTime64(9)} AND start < {hi:DateTime64(9)}",
            {"lo": lo, "hi": hi},
        )


def _span_counts(store: Store, lo: datetime, hi: datetime) -> dict[datetime, int]:
    rows = store.query_rows(
        f"SELECT toStartOfMinute(Timestamp) AS minute, count() FROM {store.table(TRACES_TABLE)} "
        "WHERE Timestamp >= {lo:DateTime64(9)} AND Timestamp < {hi:DateTime64(9)} GROUP BY minute",
        {"lo": lo, "hi": hi},
    )
    return {as_utc(m): int(n) for m, n in rows}


def _recorded_counts(store: Store, lo: datetime, hi: datetime) -> dict[datetime, int]:
    rows = store.query_rows(
        f"SELECT minute, argMax(spans, built_at) FROM {store.table(MINUTES_TABLE)} "
        "WHERE minute >= {lo:DateTime} AND minute < {hi:DateTime} GROUP BY minute",
        {"lo": lo, "hi": hi},
    )
    return {as_utc(m): int(n) for m, n in rows}


def _record_minutes(
    store: Store,
    lo: datetime,
    hi: datetime,
    built_at: datetime,
    counts: dict[datetime, int],
    key: str,
    layer: int = LAYER,
) -> int:
    """Record [lo, hi) as summarised, each minute with the span rows it held (``counts``) — or, with
    ``layer=IN_PROGRESS``, as being summarised (see :func:`build_summaries`)."""
    minutes = []
    m = lo
    while m < hi:
        minutes.append(m)
        m += _MINUTE
    store.insert_arrow(
        store.table(MINUTES_TABLE),
        pl.DataFrame(
            {
                "minute": minutes,
                "spans": [counts.get(m, 0) for m in minutes],
                "built_at": [built_at] * len(minutes),
                "layer": [layer] * len(minutes),
                "conventions": [key] * len(minutes),
            },
            schema={
                "minute": pl.Datetime("us", "UTC"),
                "spans": pl.UInt64,
                "built_at": pl.Datetime("ms", "UTC"),
                "layer": pl.UInt8,
                "conventions": pl.String,
            },
        ).to_arrow(),
        settings=_ACROSS_DAYS,
    )
    return len(minutes)


def summary_coverage(
    store: Store,
    lo: datetime | None = None,
    hi: datetime | None = None,
    *,
    layer: int = 0,
    conventions: Conventions | None = None,
) -> list[tuple[datetime, datetime]]:
    """The summarised time, as sorted disjoint [from, until) ranges of whole minutes (within
    [lo, hi) when given); with ``layer``, only the minutes last summarised with that layout or a
    later one (``layer=LAYER``: those holding the per-minute aggregates); with ``conventions``, only
    the minutes summarised with the same span conventions (:meth:`Conventions.summary_key`): what
    an analysis with them may read."""
    if not store.table_exists(MINUTES_TABLE):
        return []
    where, params = "", dict[str, Any]()
    if lo is not None and hi is not None:
        where = "WHERE minute >= {lo:DateTime} AND minute < {hi:DateTime}"
        params = {"lo": floor_minute(as_utc(lo)), "hi": ceil_minute(as_utc(hi))}
    # The latest record of each minute says which layout its rows have; a minute being summarised
    # (or whose build was killed) is not covered.
    rows = store.query_rows(
        f"""
SELECT min(minute), max(minute) + 60
FROM (
    SELECT minute, toUnixTimestamp(minute) DIV 60 - row_number() OVER (ORDER BY minute) AS run
    FROM (
        SELECT minute FROM {store.table(MINUTES_TABLE)} {where} GROUP BY minute
        HAVING argMax(layer, built_at) != {{busy:UInt8}} AND argMax(layer, built_at) >= {{layer:UInt8}}
            AND (empty({{key:String}}) OR argMax(conventions, built_at) = {{key:String}})
    )
)
GROUP BY run ORDER BY 1""",
        {
            **params,
            "busy": IN_PROGRESS,
            "layer": layer,
            "key": conventions.summary_key() if conventions else "",
        },
    )
    return [(as_utc(a), as_utc(b)) for a, b in rows]


def summary_extent(store: Store, conventions: Conventions) -> tuple[datetime, datetime] | None:
    """From the first minute summarised with ``conventions`` to the end of the last: where the
    release times the builds recorded hold (:func:`analytics.releases.fetch_release_times`), or
    ``None``."""
    covered = summary_coverage(store, conventions=conventions)
    return (covered[0][0], covered[-1][1]) if covered else None


@dataclass(frozen=True)
class SummaryBuild:
    """What one :func:`build_summaries` run did."""

    built_from: datetime | None
    built_until: datetime | None
    minutes: int  # new minutes summarised
    resummarised: int  # minutes summarised again (late or repeated spans)
    rows: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    busy: str | None = None  # another instance held the build lease: nothing was done
    others: bool = False  # the summaries were built with other span conventions: left as they are

    def describe(self) -> str:
        if self.busy is not None:
            return f"another build is running ({self.busy}): left to it"
        if self.others:
            return "the summaries were built with other span conventions: left as they are"
        if self.built_from is None and not self.resummarised:
            return "summaries up to date"
        total = sum(self.rows.values())
        span = (
            f"{self.minutes} new minutes "
            f"({self.built_from:%Y-%m-%d %H:%M} – {self.built_until:%Y-%m-%d %H:%M} UTC)"
            if self.built_from is not None and self.built_until is not None
            else "no new minutes"
        )
        return f"{span}, {self.resummarised} minutes again, {total} rows in {self.seconds:.1f} s"


def _chunks(
    lo: datetime, hi: datetime, counts: dict[datetime, int], spans: int
) -> Iterable[tuple[datetime, datetime]]:
    """[lo, hi) in whole minutes, cut where about ``spans`` span rows (``counts`` per minute) have
    gone by: reads of a steady size, few for a quiet store, bounded in memory for a busy one."""
    start, held, minute = lo, 0, lo
    while minute < hi:
        held += counts.get(minute, 0)
        minute += _MINUTE
        if held >= spans and minute < hi:
            yield start, minute
            start, held = minute, 0
    if start < hi:
        yield start, hi


def _merge_ranges(ranges: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    out: list[tuple[datetime, datetime]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def build_summaries(
    store: Store,
    until: datetime | None = None,
    conventions: Conventions | None = None,
    *,
    progress: Callable[[str], None] | None = None,
    keep_others: bool = False,
) -> SummaryBuild:
    """Summarise every whole minute from the last watermark (or the first span) to ``until``
    (default: now − :func:`summary_settle`), and again every minute within ``summary_late_horizon``
    whose span rows changed; drop summaries older than ``summary_retention``.

    Minutes summarised with other span conventions (:meth:`Conventions.summary_key`) are summarised
    again with these — unless ``keep_others``: then a store whose summaries were built with other
    conventions (by the service, say) is left as it is, and the build does nothing."""
    conv = conventions or Conventions()
    started = time.perf_counter()
    ensure_schema(store, MIGRATIONS)
    if keep_others and _built_with_others(store, conv.summary_key()):
        return SummaryBuild(None, None, 0, 0, {}, time.perf_counter() - started, others=True)
    lease = Lease(store, "summaries", _LEASE_TTL_S)
    with lease.held() as mine:
        if not mine:
            # Another instance is building: its minutes are this build's minutes.
            return SummaryBuild(None, None, 0, 0, {}, time.perf_counter() - started, lease.current_holder)
        return _build(store, until, conv, progress, lease, started)


def _build(
    store: Store,
    until: datetime | None,
    conv: Conventions,
    progress: Callable[[str], None] | None,
    lease: Lease,
    started: float,
) -> SummaryBuild:
    limit = floor_minute(as_utc(until) if until is not None else datetime.now(UTC) - summary_settle(conv))
    covered = summary_coverage(store)
    tables = data_tables(store)
    key = conv.summary_key()
    writer = f"{socket.gethostname()}:{os.getpid()}"
    rows: dict[str, int] = {}

    def run(lo: datetime, hi: datetime, again: bool) -> None:
        counts = _span_counts(store, lo, hi)
        for a, b in _chunks(lo, hi, counts, conv.summary_chunk_spans):
            if not lease.acquire():
                raise StoreError(
                    f"the summary build lease passed to {lease.current_holder}; stopped at {a:%H:%M}"
                )
            if progress is not None:
                progress(
                    f"summarising {a:%Y-%m-%d %H:%M} – {b:%Y-%m-%d %H:%M} UTC" + (" again" if again else "")
                )
            built_at = datetime.now(UTC)
            # Marked as being summarised first: a build killed before the end leaves them so.
            _record_minutes(store, a, b, built_at, counts, key, IN_PROGRESS)
            if again:
                _delete(store, a, b, tables)
            for name, n in _write(store, extract_range(store, a, b, conv)).items():
                rows[name] = rows.get(name, 0) + n
            record_release_times(store, a, b, writer, built_at, conv)
            _record_minutes(store, a, b, built_at + timedelta(milliseconds=1), counts, key)

    # Minutes summarised before whose span rows changed since (late or repeated spans), minutes of
    # an older layout, and minutes a killed build left half written.
    again = _outdated(store, key)
    if covered:
        watermark = covered[-1][1]
        horizon = max(covered[0][0], watermark - conv.summary_late_horizon)
        now_counts = _span_counts(store, horizon, watermark)
        recorded = _recorded_counts(store, horizon, watermark)
        changed = [m for m in set(now_counts) | set(recorded) if now_counts.get(m, 0) != recorded.get(m, 0)]
        again = _merge_ranges(
            [(max(covered[0][0], m - _floor_minute_delta(conv.trace_margin)), m + _MINUTE) for m in changed]
            + again
        )
    else:
        first = store.query_value(
            f"SELECT min(Timestamp) FROM {store.table(TRACES_TABLE)} WHERE Timestamp < {{hi:DateTime64(9)}}",
            {"hi": limit},
        )
        if first is None or first.year < 1971:
            _drop_expired(store, limit, conv, tables)
            return SummaryBuild(None, None, 0, 0, {}, time.perf_counter() - started)
        watermark = floor_minute(as_utc(first))
    # Minutes at or past the watermark are the new run's; it deletes first where a killed build
    # left rows there.
    for a, b in again:
        if a < watermark:
            run(a, min(b, watermark), True)
    built_from = watermark if watermark < limit else None
    if built_from is not None:
        run(watermark, limit, any(b > watermark for _, b in again))
    again = [(a, min(b, watermark)) for a, b in again if a < watermark]
    _merge_hours(store, key, tables)
    # Retention drops whole days: looked at on a first build and whenever a build reaches a new
    # hour, not every minute.
    if not covered or limit.replace(minute=0) > covered[-1][1].replace(minute=0):
        _drop_expired(store, limit, conv, tables)
    return SummaryBuild(
        built_from,
        limit if built_from is not None else None,
        int((limit - watermark) / _MINUTE) if built_from is not None else 0,
        sum(int((b - a) / _MINUTE) for a, b in again),
        rows,
        time.perf_counter() - started,
    )


# Hours merged per statement (each a range of the WHERE clause).
_HOURS_PER_MERGE = 48


def _merge_hours(store: Store, key: str, tables: dict[str, str]) -> int:
    """Pre-merge every hour whose 60 minutes are summarised with :data:`LAYER` and the conventions
    ``key`` and that is not recorded yet: the rows a killed merge left are removed, the minutes'
    anatomy rows summed per hour in ClickHouse, then the hour recorded. Returns the hours merged."""
    rows = store.query_rows(
        f"""
SELECT toStartOfHour(minute) AS hour
FROM (
    SELECT minute FROM {store.table(MINUTES_TABLE)} GROUP BY minute
    HAVING argMax(layer, built_at) = {{layer:UInt8}} AND argMax(conventions, built_at) = {{key:String}}
)
GROUP BY hour
HAVING count() = 60 AND hour NOT IN (SELECT toDateTime(start, 'UTC') FROM {store.table(HOURS_TABLE)})
ORDER BY hour""",
        {"layer": LAYER, "key": key},
    )
    hours = [as_utc(h) for (h,) in rows]
    for i in range(0, len(hours), _HOURS_PER_MERGE):
        chunk = hours[i : i + _HOURS_PER_MERGE]
        where, params = _in_ranges(_merge_ranges([(h, h + _HOUR) for h in chunk]))
        store.command(f"DELETE FROM {tables[AGG_LLM_ANATOMY_HOURS_TABLE]} WHERE {where}", params)
        store.command(
            f"INSERT INTO {store.table(AGG_LLM_ANATOMY_HOURS_TABLE)} "
            "(start, provider, model, measure, key, n) "
            "SELECT toDateTime64(toStartOfHour(start), 9, 'UTC') AS hour, provider, model, measure, key, "
            f"sum(n) FROM {store.table(AGG_LLM_ANATOMY_TABLE)} WHERE {where} "
            "GROUP BY hour, provider, model, measure, key",
            params,
            settings=_ACROSS_DAYS,
        )
        store.insert_arrow(
            store.table(HOURS_TABLE),
            pl.DataFrame(
                {"start": chunk, "built_at": [datetime.now(UTC)] * len(chunk)},
                schema={"start": pl.Datetime("ns", "UTC"), "built_at": pl.Datetime("ms", "UTC")},
            ).to_arrow(),
            settings=_ACROSS_DAYS,
        )
    return len(hours)


def _built_with_others(store: Store, key: str) -> bool:
    """Whether any minute was last summarised with span conventions other than ``key``."""
    return bool(
        store.query_value(
            f"SELECT count() > 0 FROM (SELECT minute FROM {store.table(MINUTES_TABLE)} GROUP BY minute "
            "HAVING argMax(conventions, built_at) != {key:String} "
            "AND argMax(layer, built_at) = {layer:UInt8})",
            {"key": key, "layer": LAYER},
        )
    )


def _outdated(store: Store, key: str) -> list[tuple[datetime, datetime]]:
    """The runs of minutes not last summarised with :data:`LAYER`: an older layout (once, after an
    upgrade: every minute summarised before the aggregates existed), :data:`IN_PROGRESS` (a build
    killed while writing them), or other span conventions than ``key``."""
    rows = store.query_rows(
        f"""
SELECT min(minute), max(minute) + 60
FROM (
    SELECT minute, toUnixTimestamp(minute) DIV 60 - row_number() OVER (ORDER BY minute) AS run
    FROM (
        SELECT minute FROM {store.table(MINUTES_TABLE)} GROUP BY minute
        HAVING argMax(layer, built_at) != {{layer:UInt8}} OR argMax(conventions, built_at) != {{key:String}}
    )
)
GROUP BY run ORDER BY 1""",
        {"layer": LAYER, "key": key},
    )
    return [(as_utc(a), as_utc(b)) for a, b in rows]


def _floor_minute_delta(value: timedelta) -> timedelta:
    return timedelta(minutes=-(-value.total_seconds() // 60))


def _drop_expired(store: Store, now: datetime, conv: Conventions, tables: dict[str, str]) -> None:
    """Drop the days of summaries older than the retention (whole partitions: no rewrite). The
    days are read from the tables themselves (through a ``Distributed`` one, every shard's)."""
    cutoff = floor_minute(now - conv.summary_retention).replace(hour=0, minute=0)
    for name in (*SUMMARY_TABLES, *HOUR_TABLES, MINUTES_TABLE):
        column = "minute" if name == MINUTES_TABLE else "start"
        days = store.query_rows(
            f"SELECT DISTINCT toYYYYMMDD({column}) FROM {store.table(name)} "
            f"WHERE {column} < {{cutoff:DateTime64(9)}}",
            {"cutoff": cutoff},
        )
        for (day,) in days:
            # Every summary table is partitioned by day (YYYYMMDD).
            store.command(f"ALTER TABLE {tables[name]} DROP PARTITION {{p:String}}", {"p": str(day)})


# --- a window from the summaries ---------------------------------------------------------------


def _in_ranges(ranges: list[tuple[datetime, datetime]], prefix: str = "") -> tuple[str, dict[str, Any]]:
    """``start`` within one of ``ranges``, and its parameters (named with ``prefix``)."""
    lo, hi = f"{prefix}lo", f"{prefix}hi"
    where = " OR ".join(
        f"(start >= {{{lo}{i}:DateTime64(9)}} AND start < {{{hi}{i}:DateTime64(9)}})"
        for i in range(len(ranges))
    )
    params: dict[str, Any] = {}
    for i, (a, b) in enumerate(ranges):
        params |= {f"{lo}{i}": a, f"{hi}{i}": b}
    return f"({where})", params


def _pre_merged(
    store: Store, whole: list[tuple[datetime, datetime]]
) -> tuple[list[tuple[datetime, datetime]], list[tuple[datetime, datetime]]]:
    """``whole`` (ranges of whole summarised minutes) cut into the recorded pre-merged hours it holds
    whole and the rest."""
    candidates = []
    for a, b in whole:
        hour = a.replace(minute=0, second=0, microsecond=0)
        hour += _HOUR if hour < a else timedelta(0)
        while hour + _HOUR <= b:
            candidates.append(hour)
            hour += _HOUR
    if not candidates:
        return [], whole
    recorded = store.query_rows(
        f"SELECT DISTINCT toDateTime(start, 'UTC') FROM {store.table(HOURS_TABLE)} "
        "WHERE start >= {lo:DateTime64(9)} AND start < {hi:DateTime64(9)}",
        {"lo": candidates[0], "hi": candidates[-1] + _HOUR},
    )
    held = {as_utc(h) for (h,) in recorded}
    hours = _merge_ranges([(h, h + _HOUR) for h in candidates if h in held])
    rest = _split(whole, hours)[1]
    return hours, rest


def _read(store: Store, table: str, columns: str, ranges: list[tuple[datetime, datetime]]) -> pl.DataFrame:
    if not ranges:
        return pl.DataFrame()
    where, params = _in_ranges(ranges)
    return normalize(
        store.query_polars(
            f"SELECT {columns} FROM {store.table(table)} WHERE {where} {_DICTIONARIES}", params
        )
    )


CALL_TOTALS_SCHEMA: dict[str, Any] = {"window": pl.String, **_CALL_SUMS}


def _call_totals(
    store: Store, inside: list[tuple[datetime, datetime]], extracted: list[RangeRows], windows: Windows
) -> pl.DataFrame:
    """The logical LLM calls of each window, summed per (window, provider, model, path): all the
    LLM-call metrics read (:func:`analytics.llm_calls.llm_calls_summary`, ``signal_counts``). A call
    starting in both windows (they overlap) counts in the current one, as ``calls_in_windows``."""
    bounds = {"s": windows.start, "e": windows.end, "bs": windows.baseline_start, "be": windows.baseline_end}
    frames = []
    # Whole minutes from their totals (a minute lies in one window once cut at the windows' ends),
    # the rest call by call.
    whole, partial = _minute_pieces(inside, list(bounds.values()))
    current = "start >= {s:DateTime64(9)} AND start < {e:DateTime64(9)}"
    baseline = "start >= {bs:DateTime64(9)} AND start < {be:DateTime64(9)}"
    for pieces, table, count in (
        (whole, CALL_MINUTES_TABLE, "sum(calls)"),
        (partial, CALLS_TABLE, "count()"),
    ):
        if not pieces:
            continue
        where, params = _in_ranges(pieces)
        sums = ", ".join(f"toInt64(sum({c})) AS {c}" for c in _SUMS)
        frames.append(
            store.query_polars(
                f"SELECT if({current}, 'current', 'baseline') AS window, provider, model, sync, "
                f"toInt64({count}) AS calls, {sums} FROM {store.table(table)} "
                f"WHERE {where} AND (({current}) OR ({baseline})) GROUP BY window, provider, model, sync",
                {**params, **bounds},
            )
        )
    start = pl.col("start_ns")

    def between(a: datetime, b: datetime) -> pl.Expr:
        return (start >= pl.lit(a).dt.epoch("ns")) & (start < pl.lit(b).dt.epoch("ns"))

    in_current = between(windows.start, windows.end)
    in_baseline = between(windows.baseline_start, windows.baseline_end)
    for part in extracted:
        frames.append(
            part.calls.filter(in_current | in_baseline)
            .with_columns(
                pl.when(in_current).then(pl.lit("current")).otherwise(pl.lit("baseline")).alias("window")
            )
            .group_by("window", "provider", "model", "sync")
            .agg(pl.len().alias("calls"), *(pl.col(c).sum() for c in _SUMS))
        )
    if not frames:
        return empty(CALL_TOTALS_SCHEMA)
    merged = pl.concat(
        [normalize(f).select(list(CALL_TOTALS_SCHEMA)).cast(pl.Schema(CALL_TOTALS_SCHEMA)) for f in frames]
    )
    return (
        merged.group_by("window", "provider", "model", "sync")
        .agg(pl.col("calls").sum(), *(pl.col(c).sum() for c in _SUMS))
        .sort("window", "provider", "model", "sync")
        .select(list(CALL_TOTALS_SCHEMA))
    )


_WINDOW_ANATOMY_SCHEMA: dict[str, Any] = {"window": pl.String, **ANATOMY_BUCKETS_SCHEMA}
_ANATOMY_CALL_COLUMNS = (
    "provider",
    "model",
    "start_ns",
    "end_ns",
    "ttft_ns",
    "input_tokens",
    "output_tokens",
)


def _anatomy_buckets(
    store: Store,
    inside: list[tuple[datetime, datetime]],
    extracted: list[RangeRows],
    windows: Windows,
    every: timedelta | None = None,
) -> pl.DataFrame:
    """The anatomy histograms of each window's calls (``window``), or with ``every`` (whole
    minutes) of the current window's per time bucket (``bucket_ns``, its start): whole minutes merged
    in ClickHouse from their per-minute histograms (a row per bucket comes back, whatever the
    traffic), the calls of partly covered minutes and of unsummarised ranges bucketed here the same
    way — as :func:`_call_totals` reads the sums beside them."""
    bounds = {"s": windows.start, "e": windows.end, "bs": windows.baseline_start, "be": windows.baseline_end}
    current = "start >= {s:DateTime64(9)} AND start < {e:DateTime64(9)}"
    baseline = "start >= {bs:DateTime64(9)} AND start < {be:DateTime64(9)}"
    start = pl.col("start_ns")
    in_current = (start >= pl.lit(windows.start).dt.epoch("ns")) & (
        start < pl.lit(windows.end).dt.epoch("ns")
    )
    in_baseline = (start >= pl.lit(windows.baseline_start).dt.epoch("ns")) & (
        start < pl.lit(windows.baseline_end).dt.epoch("ns")
    )
    if every is None:
        key, key_type = "window", cast(pl.DataType, pl.String())
        key_sql, inside_sql = f"if({current}, 'current', 'baseline')", f"(({current}) OR ({baseline}))"
        keep, key_expr = (
            in_current | in_baseline,
            pl.when(in_current).then(pl.lit("current")).otherwise(pl.lit("baseline")),
        )
        extra: dict[str, Any] = {}
    else:
        # Buckets from the epoch, a whole number of minutes long: a minute lies in one of them.
        every_ns = int(every.total_seconds()) * 1_000_000_000
        key, key_type = "bucket_ns", pl.Int64()
        key_sql, inside_sql = (
            "intDiv(toUnixTimestamp64Nano(start), {every_ns:Int64}) * {every_ns:Int64}",
            current,
        )
        keep, key_expr = in_current, (start // every_ns) * every_ns
        extra = {"every_ns": every_ns}
    schema: dict[str, Any] = {key: key_type, **ANATOMY_BUCKETS_SCHEMA}
    whole, partial = _minute_pieces(inside, list(bounds.values()))
    frames: list[pl.DataFrame] = [empty(schema)]
    # Whole hours from their pre-merged rows where the buckets hold whole hours (each piece of
    # ``whole`` lies in one window).
    on_hours = every is None or extra["every_ns"] % int(_HOUR.total_seconds() * 1e9) == 0
    hours, minutes = _pre_merged(store, whole) if on_hours and whole else ([], whole)
    sources, params = [], {**bounds, **extra}
    for table, ranges, prefix in (
        (AGG_LLM_ANATOMY_TABLE, minutes, "m"),
        (AGG_LLM_ANATOMY_HOURS_TABLE, hours, "h"),
    ):
        if ranges:
            where, ranges_params = _in_ranges(ranges, prefix)
            sources.append(
                f"SELECT start, provider, model, measure, key, n FROM {store.table(table)} WHERE {where}"
            )
            params |= ranges_params
    if sources:
        frames.append(
            normalize(
                store.query_polars(
                    f"SELECT {key_sql} AS {key}, provider, model, measure, key, toInt64(sum(n)) AS n "
                    f"FROM ({' UNION ALL '.join(sources)}) "
                    f"WHERE {inside_sql} GROUP BY {key}, provider, model, measure, key",
                    params,
                )
            )
        )
    calls = [empty({c: STORED_CALLS_SCHEMA[c] for c in _ANATOMY_CALL_COLUMNS})]
    if partial:
        where, params = _in_ranges(partial)
        calls.append(
            normalize(
                store.query_polars(
                    f"SELECT {', '.join(_ANATOMY_CALL_COLUMNS)} "
                    f"FROM {store.table(CALLS_TABLE)} WHERE {where}",
                    params,
                )
            )
        )
    calls += [part.calls.select(_ANATOMY_CALL_COLUMNS) for part in extracted]
    rows = pl.concat([_cast(c, {k: STORED_CALLS_SCHEMA[k] for k in _ANATOMY_CALL_COLUMNS}) for c in calls])
    frames.append(
        anatomy_buckets(rows.filter(keep).with_columns(key_expr.alias(key)), [key, "provider", "model"])
    )
    merged = pl.concat([f.select(list(schema)).cast(pl.Schema(schema)) for f in frames])
    return merged.group_by(key, "provider", "model", "measure", "key").agg(pl.col("n").sum())


def _split(
    needed: list[tuple[datetime, datetime]], covered: list[tuple[datetime, datetime]]
) -> tuple[list[tuple[datetime, datetime]], list[tuple[datetime, datetime]]]:
    """``needed`` cut into the parts ``covered`` holds and the rest."""
    inside: list[tuple[datetime, datetime]] = []
    outside: list[tuple[datetime, datetime]] = []
    for a, b in needed:
        cursor = a
        for c, d in covered:
            if d <= cursor or c >= b:
                continue
            if c > cursor:
                outside.append((cursor, c))
            inside.append((max(cursor, c), min(b, d)))
            cursor = min(b, d)
        if cursor < b:
            outside.append((cursor, b))
    return inside, outside


def _series_grouping(every: timedelta | None) -> tuple[list[pl.Expr], str, dict[str, Any], str]:
    """How request state groups per series bucket of ``every`` (none: per operation): the Polars
    expressions for rows, the SQL column for the aggregates, its parameters and the SQL keys."""
    if every is None:
        return [], "", {}, "service, operation"
    sql_group = (
        ", toDateTime64(toStartOfInterval(start, toIntervalSecond({every_s:UInt32})), 6, 'UTC') "
        "AS bucket_start"
    )
    return (
        [series_bucket(every)],
        sql_group,
        {"every_s": int(every.total_seconds())},
        ("service, operation, bucket_start"),
    )


class SummaryInputs:
    """A window's and its baseline's rows, from the summaries plus raw spans where they do not
    reach: the frames :func:`analytics.analyze` computes its metrics from, each read when first
    asked for."""

    def __init__(
        self,
        store: Store,
        windows: Windows,
        conventions: Conventions,
        inside: list[tuple[datetime, datetime]],
        extracted: list[RangeRows],
        covered: list[tuple[datetime, datetime]],
        shared: dict[Any, Any] | None = None,
    ) -> None:
        self.store, self.windows, self.conv = store, windows, conventions
        self.shared = shared  # what the caller's other analyses of this moment reuse
        self._states: dict[timedelta | None, tuple[pl.DataFrame, pl.DataFrame]] = {}
        self.inside = inside  # the summarised parts of what the window reads
        self.extracted = extracted  # the rest, reduced from raw spans now
        self.ranges = covered  # the summarised ranges the window overlaps
        # The summarised span the window overlaps.
        self.covered = (covered[0][0], covered[-1][1]) if covered else None

    def _both(
        self, table: str, columns: str, schema: dict[str, Any], part: Callable[[RangeRows], pl.DataFrame]
    ) -> pl.DataFrame:
        stored = _read(self.store, table, columns, self.inside)
        return pl.concat([_cast(stored, schema), *(_cast(part(r), schema) for r in self.extracted)])

    def _between(self, column: pl.Expr, a: datetime, b: datetime) -> pl.Expr:
        return (column >= pl.lit(a).dt.epoch("ns")) & (column < pl.lit(b).dt.epoch("ns"))

    @cached_property
    def _requests(self) -> pl.DataFrame:
        requests = self._both(
            REQUESTS_TABLE, ", ".join(STORED_REQUESTS_SCHEMA), STORED_REQUESTS_SCHEMA, lambda r: r.requests
        )
        # The request rows of each window (both when they overlap), as request_rows labels them.
        w = self.windows
        labelled = [
            requests.filter(self._between(pl.col("start").dt.epoch("ns"), a, b)).with_columns(
                pl.lit(name).cast(WINDOW).alias("window")
            )
            for name, a, b in (("baseline", w.baseline_start, w.baseline_end), ("current", w.start, w.end))
        ]
        return pl.concat(labelled)

    @property
    def requests(self) -> pl.DataFrame:
        """:data:`~analytics.hot_path.REQUESTS_SCHEMA`, both windows."""
        return self._requests.select(list(REQUESTS_SCHEMA)).with_columns(
            pl.col("service", "operation", "version").cast(pl.Categorical)
        )

    @property
    def sync_llm_ms(self) -> pl.Series:
        """Per row of :attr:`requests`: the time its synchronous LLM calls hold it."""
        return self._requests["sync_llm_ms"]

    @cached_property
    def calls(self) -> pl.DataFrame:
        """:data:`CALL_TOTALS_SCHEMA`: per window, provider, model and path."""
        return _call_totals(self.store, self.inside, self.extracted, self.windows)

    @cached_property
    def anatomy_buckets(self) -> pl.DataFrame:
        """The calls' anatomy histograms per window, provider and model
        (:data:`~analytics.llm_anatomy.ANATOMY_BUCKETS_SCHEMA` with a ``window``)."""
        return _anatomy_buckets(self.store, self.inside, self.extracted, self.windows)

    def anatomy_series_buckets(self, every: timedelta) -> pl.DataFrame:
        """The current window's anatomy histograms per time bucket of ``every`` (whole minutes),
        provider and model (with ``bucket_ns``, the bucket's start)."""
        return _anatomy_buckets(self.store, self.inside, self.extracted, self.windows, every)

    @cached_property
    def _workflow_rows(self) -> pl.DataFrame:
        columns = ", ".join(
            c if c != "wf_start_ns" else "toUnixTimestamp64Nano(start) AS wf_start_ns"
            for c in STORED_WORKFLOW_SPANS_SCHEMA
        )
        return self._both(
            WORKFLOW_SPANS_TABLE, columns, STORED_WORKFLOW_SPANS_SCHEMA, lambda r: r.workflow_spans
        )

    def _workflows(self, a: datetime, b: datetime) -> pl.DataFrame:
        wf = self._workflow_rows
        started = self._between(pl.col("wf_start_ns"), a, b)
        return wf.filter(
            started & (pl.col("start_ns") < pl.lit(b + self.conv.trace_margin).dt.epoch("ns"))
        ).select(list(WORKFLOW_SPANS_SCHEMA))

    @property
    def workflow_spans(self) -> pl.DataFrame:
        """:data:`~analytics.retries.WORKFLOW_SPANS_SCHEMA` of the current window's workflows."""
        return self._workflows(self.windows.start, self.windows.end)

    @property
    def baseline_workflow_spans(self) -> pl.DataFrame:
        return self._workflows(self.windows.baseline_start, self.windows.baseline_end)

    @cached_property
    def _job_spans(self) -> pl.DataFrame:
        return self._both(
            JOB_SPANS_TABLE, ", ".join(JOB_SPANS_SCHEMA), JOB_SPANS_SCHEMA, lambda r: r.job_spans
        )

    def jobs(self, a: datetime, b: datetime, trace_keys: pl.Series | None = None) -> pl.DataFrame:
        """One row per job enqueued in [a, b) (:data:`~analytics.cold_path.JOBS_SCHEMA`), reduced in
        SQL from the stored job spans and the raw spans of the rest: only the jobs are read — only
        those whose producer's trace is one of ``trace_keys`` when given."""
        if trace_keys is not None and trace_keys.is_empty():
            return empty(JOBS_SCHEMA)
        sql, params = self._jobs_sql(a, b)
        if sql is None:
            return empty(JOBS_SCHEMA)
        if trace_keys is None:
            return jobs_from_raw(normalize(self.store.query_polars(sql, params)))
        keyed = f"SELECT * FROM ({sql}) WHERE "
        if self.store.embedded:
            with self.store.key_set(trace_keys) as key_set:
                frame = self.store.query_polars(keyed + f"trace_key IN {key_set}", params)
        else:
            frame = self.store.query_polars(
                keyed + "has({keys:Array(UInt64)}, trace_key)",
                {**params, "keys": trace_keys.cast(pl.UInt64).to_list()},
            )
        return jobs_from_raw(normalize(frame))

    def job_stats(self, a: datetime, b: datetime, every: timedelta) -> pl.DataFrame:
        """:data:`~analytics.cold_path.JOB_STATS_SCHEMA` of the jobs enqueued in [a, b), in buckets
        of ``every``: per-bucket rows, not per-job ones, cross from the engine."""
        sql, params = self._jobs_sql(a, b)
        if sql is None:
            return empty(JOB_STATS_SCHEMA)
        every_ns = int(every.total_seconds() * 1e9)
        frame = self.store.query_polars(job_stats_sql(sql), {**params, "every_ns": every_ns})
        return _cast(normalize(frame), JOB_STATS_SCHEMA)

    def _jobs_sql(self, a: datetime, b: datetime) -> tuple[str | None, dict[str, Any]]:
        """The SQL reducing the job spans started in [a, b) to jobs, and its parameters."""
        stored, raw = _split([(a, b)], self.ranges)
        columns = ", ".join(JOB_SPANS_SCHEMA)
        parts, params = [], dict(self.conv.sql_parameters())
        if stored:
            where, ranges = _in_ranges(stored)
            parts.append(f"SELECT {columns} FROM {self.store.table(JOB_SPANS_TABLE)} WHERE {where}")
            params |= ranges
        if raw:
            raw_sql = inspect_traces(self.store).adapt(jobs_sql(self.store.table(TRACES_TABLE)))
            for i, (x, y) in enumerate(raw):
                sql = raw_sql.replace("{s:DateTime64(9)}", f"{{rs{i}:DateTime64(9)}}").replace(
                    "{e:DateTime64(9)}", f"{{re{i}:DateTime64(9)}}"
                )
                parts.append(f"SELECT {columns} FROM ({sql})")
                params |= {f"rs{i}": x, f"re{i}": y}
        if not parts:
            return None, params
        return jobs_reduction_sql(" UNION ALL ".join(parts)), params

    @property
    def job_spans(self) -> pl.DataFrame:
        """The job spans started in the current window (:data:`~analytics.cold_path.JOB_SPANS_SCHEMA`)."""
        return self._job_spans.filter(self._between(pl.col("start_ns"), self.windows.start, self.windows.end))

    @property
    def baseline_job_spans(self) -> pl.DataFrame:
        w = self.windows
        return self._job_spans.filter(self._between(pl.col("start_ns"), w.baseline_start, w.baseline_end))

    @cached_property
    def evaluations(self) -> pl.DataFrame:
        """Flag evaluations of the current window and its margin (``FLAG_EVALUATIONS_SCHEMA``)."""
        columns = ", ".join(
            c if c != "span_ns" else "toUnixTimestamp64Nano(start) AS span_ns"
            for c in STORED_EVALUATIONS_SCHEMA
        )
        rows = self._both(EVALUATIONS_TABLE, columns, STORED_EVALUATIONS_SCHEMA, lambda r: r.evaluations)
        w = self.windows
        return rows.filter(self._between(pl.col("span_ns"), w.start, w.end + self.conv.trace_margin)).select(
            list(FLAG_EVALUATIONS_SCHEMA)
        )

    def extracted_requests(self) -> tuple[list[tuple[datetime, datetime]], pl.DataFrame] | None:
        """The request rows reduced from raw spans for this window, and the ranges they cover."""
        if not self.extracted:
            return None
        return (
            [(r.lo, r.hi) for r in self.extracted],
            pl.concat([_cast(r.requests, STORED_REQUESTS_SCHEMA) for r in self.extracted]),
        )

    # --- the current window's requests as merged per-minute state (analytics.aggregates) -------

    @cached_property
    def _agg_pieces(self) -> tuple[list[tuple[datetime, datetime]], list[tuple[datetime, datetime]]]:
        """The current window cut into the whole minutes whose aggregates are stored, and the rest."""
        return self._pieces(self.windows.start, self.windows.end)

    def _pieces(
        self, a: datetime, b: datetime
    ) -> tuple[list[tuple[datetime, datetime]], list[tuple[datetime, datetime]]]:
        """[a, b) cut into the whole minutes whose aggregates are stored, and the rest."""
        held = summary_coverage(self.store, a, b, layer=LAYER, conventions=self.conv)
        inside, outside = _split([(a, b)], held)
        whole, partial = _minute_pieces(inside, [])
        return whole, sorted(partial + outside)

    def retry_state(self, a: datetime, b: datetime) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The merged :func:`analytics.retries.retry_state` of the workflow runs started in [a, b):
        the aggregates of its whole minutes, the workflow spans of the rest."""
        whole, rest = self._pieces(a, b)
        hops, runs = [], []
        if whole:
            where, params = _in_ranges(whole)
            sums = ", ".join(
                f"toInt64(sum({c})) AS {c}" for c in ("calls", "attempts", "tokens", "final_tokens")
            )
            hops.append(
                self.store.query_polars(
                    f"SELECT workflow, hop, {sums}, sum(offset_sum) AS offset_sum "
                    f"FROM {self.store.table(AGG_WORKFLOW_HOPS_TABLE)} WHERE {where} GROUP BY workflow, hop",
                    params,
                )
            )
            runs.append(
                self.store.query_polars(
                    "SELECT workflow, runs, best_retries, best_start_ns, best_trace_id "
                    f"FROM {self.store.table(AGG_WORKFLOW_RUNS_TABLE)} WHERE {where}",
                    params,
                )
            )
        stored, raw = _split(rest, self.ranges)
        columns = ", ".join(
            c if c != "wf_start_ns" else "toUnixTimestamp64Nano(start) AS wf_start_ns"
            for c in STORED_WORKFLOW_SPANS_SCHEMA
        )
        rows = [_cast(_read(self.store, WORKFLOW_SPANS_TABLE, columns, stored), STORED_WORKFLOW_SPANS_SCHEMA)]
        for part in self.extracted:
            for x, y in raw:
                if y > part.lo and x < part.hi:
                    started = self._between(pl.col("wf_start_ns"), max(x, part.lo), min(y, part.hi))
                    rows.append(_cast(part.workflow_spans, STORED_WORKFLOW_SPANS_SCHEMA).filter(started))
        hop_rest, run_rest = retry_state(pl.concat(rows))
        return (
            pl.concat([_cast(normalize(f), RETRY_HOP_STATE_SCHEMA) for f in [*hops, hop_rest]]),
            pl.concat([_cast(normalize(f), RETRY_RUN_STATE_SCHEMA) for f in [*runs, run_rest]]),
        )

    @cached_property
    def _rest_rows(self) -> pl.DataFrame:
        """The request rows (:data:`STORED_REQUESTS_SCHEMA`) of the current window outside its whole
        aggregated minutes: stored rows where summarised, reduced raw rows elsewhere."""
        return self._rows_of(self._agg_pieces[1])

    def _rows_of(self, rest: list[tuple[datetime, datetime]]) -> pl.DataFrame:
        """The request rows of ``rest`` (ranges outside the whole aggregated minutes)."""
        stored, raw = _split(rest, self.ranges)
        columns = ", ".join(STORED_REQUESTS_SCHEMA)
        stored_rows = _cast(_read(self.store, REQUESTS_TABLE, columns, stored), STORED_REQUESTS_SCHEMA)
        return pl.concat([stored_rows, *self._extracted_requests(raw)])

    def requests_between(self, a: datetime, b: datetime) -> pl.DataFrame:
        """The request rows (:data:`STORED_REQUESTS_SCHEMA`) starting in [a, b): stored rows where
        summarised, reduced raw rows elsewhere."""
        return self._rows_of([(a, b)])

    def sync_calls(self, a: datetime, b: datetime, *, with_tokens: bool = False) -> pl.DataFrame:
        """The synchronous logical LLM calls starting in [a, b) (``trace_key``, ``provider``,
        ``model``, ``start_ns``, ``end_ns``, ``tokens``; ``with_tokens``: also ``sync`` and the
        input, output and cached input tokens): stored rows where summarised, reduced raw rows
        elsewhere."""
        names = ["trace_key", "provider", "model", "start_ns", "end_ns", "tokens"]
        if with_tokens:
            names += ["sync", "input_tokens", "output_tokens", "cached_tokens"]
        schema = {k: STORED_CALLS_SCHEMA[k] for k in names}
        stored, raw = _split([(a, b)], self.ranges)
        frames = [empty(schema)]
        if stored:
            where, params = _in_ranges(stored)
            frames.append(
                _cast(
                    normalize(
                        self.store.query_polars(
                            f"SELECT {', '.join(schema)} FROM {self.store.table(CALLS_TABLE)} "
                            f"WHERE {where} AND sync {_DICTIONARIES}",
                            params,
                        )
                    ),
                    schema,
                )
            )
        for part in self.extracted:
            for lo, hi in raw:
                if hi > part.lo and lo < part.hi:
                    inside = self._between(pl.col("start_ns"), max(lo, part.lo), min(hi, part.hi))
                    frames.append(_cast(part.calls.filter(pl.col("sync") & inside), schema))
        return pl.concat(frames)

    def _extracted_requests(
        self, ranges: list[tuple[datetime, datetime]], keep: pl.Expr | None = None
    ) -> list[pl.DataFrame]:
        """The request rows reduced from raw spans that start in ``ranges`` (and pass ``keep``)."""
        frames = []
        for part in self.extracted:
            for a, b in ranges:
                if b > part.lo and a < part.hi:
                    inside = self._between(pl.col("start").dt.epoch("ns"), max(a, part.lo), min(b, part.hi))
                    rows = _cast(part.requests, STORED_REQUESTS_SCHEMA)
                    frames.append(rows.filter(inside if keep is None else inside & keep))
        return frames

    def _merged(
        self,
        select: str,
        group: str,
        array_join: str = "",
        extra: dict[str, Any] | None = None,
        whole: list[tuple[datetime, datetime]] | None = None,
    ) -> pl.DataFrame:
        """One GROUP BY over the whole aggregated minutes of the current window (or ``whole``)."""
        if whole is None:
            whole = self._agg_pieces[0]
        if not whole:
            return pl.DataFrame()
        where, params = _in_ranges(whole)
        return normalize(
            self.store.query_polars(
                f"SELECT {select} FROM {self.store.table(AGG_REQUESTS_TABLE)} {array_join} "
                f"WHERE {where} GROUP BY {group}",
                {**params, **(extra or {})},
            )
        )

    def request_state(self, every: timedelta | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The current window's requests as merged state: (totals, latency histogram) per (service,
        operation) — and per series bucket of ``every`` (``bucket_start``), a whole number of
        minutes — from the stored aggregates of its whole minutes plus its other request rows."""
        if every not in self._states:
            self._states[every] = self._request_state(every)
        return self._states[every]

    def _request_state(self, every: timedelta | None) -> tuple[pl.DataFrame, pl.DataFrame]:
        return self._merged_state(every, self._agg_pieces[0], self._rest_rows)

    def _merged_state(
        self, every: timedelta | None, whole: list[tuple[datetime, datetime]], rows: pl.DataFrame
    ) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(totals, latency histogram) per (service, operation[, bucket_start]) of the aggregates of
        the ``whole`` minutes and the request ``rows`` of the rest."""
        group, sql_group, extra, keys = _series_grouping(every)
        totals = self._merged(
            f"service, operation{sql_group}, toInt64(sum(requests)) AS requests, sum(weight) AS weight, "
            "sum(weight_sq) AS weight_sq, min(weight_min) AS weight_min, max(weight_max) AS weight_max, "
            "sum(sync_llm_calls) AS sync_llm_calls, sum(abandoned) AS abandoned, "
            "sum(first_byte) AS first_byte, sum(streamed) AS streamed",
            keys,
            extra=extra,
            whole=whole,
        )
        latency = self._merged(
            f"service, operation{sql_group}, b AS bucket, sum(w) AS weight, toInt64(sum(n)) AS n",
            keys + ", bucket",
            "ARRAY JOIN lat_bucket AS b, lat_weight AS w, lat_n AS n",
            extra=extra,
            whole=whole,
        )
        extra_schema = {"bucket_start": pl.Datetime("us", "UTC")} if every is not None else {}
        totals_schema = {**TOTALS_STATE_SCHEMA, **extra_schema}
        latency_schema = {**LATENCY_STATE_SCHEMA, **extra_schema}
        return (
            pl.concat([_cast(totals, totals_schema), _cast(totals_state(rows, group), totals_schema)]),
            pl.concat([_cast(latency, latency_schema), _cast(latency_state(rows, group), latency_schema)]),
        )

    @cached_property
    def first_byte_state(self) -> pl.DataFrame:
        """The current window's time to first byte as a merged histogram per (service, operation)
        (:data:`LATENCY_STATE_SCHEMA`), from the stored aggregates of its whole minutes plus its
        other request rows."""
        return self.first_byte_series_state(None)

    def first_byte_series_state(self, every: timedelta | None) -> pl.DataFrame:
        """:attr:`first_byte_state`, per series bucket of ``every`` (``bucket_start``, a whole
        number of minutes) when given."""
        group, sql_group, extra, keys = _series_grouping(every)
        merged = self._merged(
            f"service, operation{sql_group}, b AS bucket, sum(w) AS weight, toInt64(sum(n)) AS n",
            keys + ", bucket",
            "ARRAY JOIN fb_bucket AS b, fb_weight AS w, fb_n AS n",
            extra=extra,
            whole=self._agg_pieces[0],
        )
        schema = {**LATENCY_STATE_SCHEMA, **({"bucket_start": pl.Datetime("us", "UTC")} if every else {})}
        rest = latency_state(self._rest_rows, group, column="first_byte_ms")
        return pl.concat([_cast(merged, schema), _cast(rest, schema)])

    @cached_property
    def request_llm(self) -> pl.DataFrame:
        """What both windows' hot requests cost in model calls, as merged state per window
        (:data:`~analytics.request_costs.REQUEST_LLM_STATE_SCHEMA` with ``window``): the stored
        per-minute sums of each window's whole summarised minutes, and the request rows of the
        rest with their synchronous calls."""
        w = self.windows
        frames = [empty({"window": pl.String, **REQUEST_LLM_STATE_SCHEMA})]
        for label, a, b in (("current", w.start, w.end), ("baseline", w.baseline_start, w.baseline_end)):
            # The current window's pieces and rest rows are the hot path's (computed once).
            whole, rest = self._agg_pieces if label == "current" else self._pieces(a, b)
            if whole:
                where, params = _in_ranges(whole)
                sums = ", ".join(f"sum({c}) AS {c}" for c in _REQUEST_LLM_SUMS)
                merged = self.store.query_polars(
                    f"SELECT {{label:String}} AS window, service, operation, version, provider, model, "
                    f"{sums} FROM {self.store.table(AGG_REQUEST_LLM_TABLE)} WHERE {where} "
                    "GROUP BY service, operation, version, provider, model",
                    {**params, "label": label},
                )
                frames.append(normalize(merged))
            rows = self._rest_rows if label == "current" else self._rows_of(rest)
            if not rows.is_empty():
                # Each piece's calls (they start within the trace margin after its requests): the
                # pieces are a window's edges, and what lies between them is read from the sums.
                margin = self.conv.trace_margin
                reads = _merge_ranges([(x, y + margin) for x, y in rest])  # disjoint: no call twice
                calls = pl.concat([self.sync_calls(x, y, with_tokens=True) for x, y in reads]).join(
                    rows.select("trace_key"), on="trace_key", how="semi"
                )
                frames.append(request_llm_state(rows, calls).with_columns(pl.lit(label).alias("window")))
        schema = {"window": pl.String, **REQUEST_LLM_STATE_SCHEMA}
        return pl.concat([_cast(f, schema) for f in frames])

    def tail_stats(self, q: float) -> pl.DataFrame:
        """Per (service, operation, window): the requests ``n`` and their ``q`` quantile ``p99`` (as
        :func:`analytics.attribution.window_stats`), merged from the latency sketches of both
        windows' whole minutes and the request rows of the rest: within the sketch's relative
        error, whatever the window's length."""
        w = self.windows
        whole, rest = self._pieces(w.baseline_start, w.baseline_end)
        # The current window's state is the hot path's (computed once); the baseline's, merged now.
        states = (
            ("current", self.request_state()),
            ("baseline", self._merged_state(None, whole, self._rows_of(rest))),
        )
        frames = [
            tail_stats_from_state(totals, latency, q, self.conv.min_sampled_tail).with_columns(
                pl.lit(label).alias("window")
            )
            for label, (totals, latency) in states
        ]
        return pl.concat(frames).select("service", "operation", "window", "n", "p99")

    @property
    def has_tops(self) -> bool:
        """Whether the top requests answer the tails (not for sampled data or overlapping windows)."""
        return self._tops is not None

    def walked_tails(self, stats: pl.DataFrame, most: int) -> pl.DataFrame | None:
        """The tail traces of both windows for ``stats`` (:meth:`tail_stats`): the requests at or
        above their window's p99, the slowest ``most``, among each minute's top requests (walked
        when the minute was summarised) and every request of the window's other minutes; ``None``
        for sampled data or overlapping windows (then the request rows are read).

        A window beyond the exact horizon reads no request row: where a minute holds more of the
        window's tail than its top requests, the tail is the slowest of each minute's."""
        tops = self._tops
        if tops is None:
            return None
        columns = ["service", "operation", "window", "trace_key", "duration_ms", "start"]
        return (
            tops[1]
            .join(
                stats.select("service", "operation", "window", "p99"), on=["service", "operation", "window"]
            )
            # At or above the p99's bucket: every value the merged p99 may stand for.
            .filter(bucket_expr("duration_ms") >= bucket_expr("p99"))
            .sort(["duration_ms", "trace_key"], descending=[True, False])
            .group_by("service", "operation", "window", maintain_order=True)
            .head(most)
            .select(columns)
            .cast(pl.Schema(_TAIL_SCHEMA))
        )

    def flagged_requests(self) -> pl.DataFrame:
        """The current window's requests (:data:`~analytics.hot_path.REQUESTS_SCHEMA` columns) of the
        traces with a flag evaluation: all the slices read — not every request of a long window."""
        keys = self.evaluations["trace_key"].unique()
        w = self.windows
        stored, raw = _split([(w.start, w.end)], self.ranges)
        columns = ", ".join(STORED_REQUESTS_SCHEMA)
        stored_rows = _cast(
            _read_keyed(self.store, REQUESTS_TABLE, columns, stored, keys), STORED_REQUESTS_SCHEMA
        )
        raw_rows = self._extracted_requests(raw, pl.col("trace_key").is_in(keys.implode()))
        return pl.concat([stored_rows, *raw_rows]).with_columns(
            pl.lit("current").cast(WINDOW).alias("window")
        )

    def boundary_state(self) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """The current window's requests as the boundary's merged state: (totals, latency per
        version, latency without the synchronous LLM calls per number of calls)."""
        versions = self._merged(
            "service, operation, version, b AS bucket, sum(w) AS weight, toInt64(sum(n)) AS n",
            "service, operation, version, bucket",
            "ARRAY JOIN lat_bucket AS b, lat_weight AS w, lat_n AS n",
        )
        without = self._merged(
            "service, operation, toInt64(c) AS calls, b AS bucket, sum(w) AS weight, toInt64(sum(n)) AS n",
            "service, operation, calls, bucket",
            "ARRAY JOIN cf_calls AS c, cf_bucket AS b, cf_weight AS w, cf_n AS n",
        )
        rows = self._rest_rows
        return (
            self.request_state()[0],
            pl.concat(
                [
                    _cast(versions, VERSION_LATENCY_STATE_SCHEMA),
                    _cast(version_latency_state(rows), VERSION_LATENCY_STATE_SCHEMA),
                ]
            ),
            pl.concat(
                [
                    _cast(without, COUNTERFACTUAL_STATE_SCHEMA),
                    _cast(counterfactual_state(rows), COUNTERFACTUAL_STATE_SCHEMA),
                ]
            ),
        )

    def abandonment_state(self) -> pl.DataFrame | None:
        """The current window's abandonment curve as merged state (:data:`ABANDONMENT_STATE_SCHEMA`),
        or ``None`` when some of its minutes were aggregated with another ``bucket_ms``."""
        width = self.conv.bucket_ms
        other = self._merged(
            "count() AS n", "bucket_ms HAVING bucket_ms != {width:UInt32}", extra={"width": width}
        )
        if not other.is_empty():
            return None
        state = self._merged(
            "service, operation, b AS bucket, sum(w) AS weight, sum(w2) AS weight_sq, sum(a) AS abandoned, "
            "toInt64(sum(n)) AS n",
            "service, operation, bucket",
            "ARRAY JOIN ab_bucket AS b, ab_weight AS w, ab_weight_sq AS w2, ab_abandoned AS a, ab_n AS n",
        )
        return pl.concat(
            [
                _cast(state, ABANDONMENT_STATE_SCHEMA),
                _cast(abandonment_state(self._rest_rows, self.conv), ABANDONMENT_STATE_SCHEMA),
            ]
        )

    def served_versions(self) -> pl.DataFrame:
        """Per (service, operation, version, window): its first request (``start``) — from the
        per-minute counts where :attr:`_tops` has them, else from the request rows; the keys
        :func:`analytics.releases.served_versions` reads."""
        if self._tops is not None:
            return self._tops[0].select(
                "service", "operation", "version", pl.col("first_start").alias("start"), "window"
            )
        return self.requests.select("service", "operation", "version", "start", "window")

    @cached_property
    def _tops(self) -> tuple[pl.DataFrame, pl.DataFrame] | None:
        """Per (service, operation, version, window): the requests (``n``), their synchronous LLM
        calls and first start, and ``floor``, a duration from which up every request is among the
        ``rows`` (service, operation, version, window, trace_key, start, duration_ms) — from the
        per-minute counts and top requests of the whole summarised minutes, the request rows of
        the partly covered ones and the raw rows; ``None`` for sampled data or overlapping windows.
        """
        w = self.windows
        if w.baseline_end > w.start and w.baseline_start < w.end:
            return None
        raw = self._raw_requests()
        if raw is None:
            return None
        # Each window's summarised part: whole minutes from their counts, the rest row by row.
        covered = [
            _split([(a, b)], self.ranges)[0]
            for a, b in ((w.baseline_start, w.baseline_end), (w.start, w.end))
        ]
        whole, partial = _minute_pieces([piece for part in covered for piece in part], [])
        self._whole = whole
        label = (
            "if(start >= {s:DateTime64(9)} AND start < {e:DateTime64(9)}, 'current', 'baseline') AS window"
        )
        bounds = {"s": w.start, "e": w.end}
        keys = "service, operation, version, window"
        frames = []
        counts = empty(_TOP_COUNTS_SCHEMA)
        if whole:
            where, params = _in_ranges(whole)
            counts = normalize(
                self.store.query_polars(
                    f"SELECT service, operation, version, {label}, toInt64(sum(requests)) AS n, "
                    "max(threshold_ms) AS floor, max(weight_max) AS wmax, min(weight_min) AS wmin, "
                    "toInt64(sum(sync_llm_calls)) AS sync, min(first_start) AS first_start "
                    f"FROM {self.store.table(REQUEST_MINUTES_TABLE)} WHERE {where} GROUP BY {keys}",
                    {**params, **bounds},
                )
            )
            if not counts.is_empty() and ((counts["wmax"] != 1.0).any() or (counts["wmin"] != 1.0).any()):
                return None
            frames.append(
                self.store.query_polars(
                    f"SELECT service, operation, version, {label}, trace_key, start, duration_ms "
                    f"FROM {self.store.table(TOP_REQUESTS_TABLE)} WHERE {where}",
                    {**params, **bounds},
                )
            )
        # Partly covered minutes and raw rows: every request, counted here.
        loose = [raw.select(*_TOP_ROW_COLUMNS, "weight", "sync_llm_calls")]
        if partial:
            where, params = _in_ranges(partial)
            loose.append(
                self.store.query_polars(
                    f"SELECT service, operation, version, {label}, trace_key, start, duration_ms, weight, "
                    f"toInt64(sync_llm_calls) AS sync_llm_calls FROM {self.store.table(REQUESTS_TABLE)} "
                    f"WHERE {where}",
                    {**params, **bounds},
                )
            )
        loose_rows = pl.concat(
            [normalize(f).select(list(_LOOSE_SCHEMA)).cast(pl.Schema(_LOOSE_SCHEMA)) for f in loose]
        )
        if (loose_rows["weight"] != 1.0).any():
            return None
        group = ["service", "operation", "version", "window"]
        loose_counts = loose_rows.group_by(group).agg(
            pl.len().cast(pl.Int64).alias("n"),
            pl.col("sync_llm_calls").sum().cast(pl.Int64).alias("sync"),
            pl.col("start").min().alias("first_start"),
        )
        stats = (
            pl.concat(
                [
                    counts.select(*group, "n", "floor", "sync", "first_start").cast(
                        pl.Schema(_TOP_COUNTS_SCHEMA)
                    ),
                    loose_counts.with_columns(pl.lit(float("-inf")).alias("floor"))
                    .select(list(_TOP_COUNTS_SCHEMA))
                    .cast(pl.Schema(_TOP_COUNTS_SCHEMA)),
                ]
            )
            .group_by(group)
            .agg(pl.col("n").sum(), pl.col("floor").max(), pl.col("sync").sum(), pl.col("first_start").min())
        )
        # ``loose``: a raw or partly covered minute's row (every request there), not a top request.
        rows = pl.concat(
            [
                *(
                    normalize(f)
                    .select(_TOP_ROW_COLUMNS)
                    .cast(pl.Schema(_TOP_ROW_SCHEMA))
                    .with_columns(pl.lit(False).alias("loose"))
                    for f in frames
                ),
                loose_rows.select(_TOP_ROW_COLUMNS).with_columns(pl.lit(True).alias("loose")),
            ]
        )
        return stats, rows

    def _top_windows(self, group: list[str]) -> dict[tuple[Any, ...], tuple[SortedWindow, pl.DataFrame]]:
        """Per ``group`` of :attr:`_tops`: the durations from the group's floor up as a
        :class:`SortedWindow` of all its requests, and those rows. A group with too few top
        requests to hold the ranks a p99 and its bootstrap read (:func:`_holds_tail`) gets every
        request row instead (:meth:`_every_row`)."""
        tops = self._tops
        assert tops is not None
        stats, rows = tops
        per = stats.group_by(group).agg(pl.col("n").sum(), pl.col("floor").max())
        out: dict[tuple[Any, ...], tuple[SortedWindow, pl.DataFrame]] = {}
        joined = rows.join(per.select(*group, "floor"), on=group, how="inner").filter(
            pl.col("duration_ms") >= pl.col("floor")
        )
        parts = {tuple(k): g for k, g in joined.group_by(group)}
        for row in per.iter_rows(named=True):
            key = tuple(row[k] for k in group)
            part = parts.get(key, joined.clear())
            values = np.sort(part["duration_ms"].to_numpy())
            out[key] = (SortedWindow(values, row["n"] - values.size, row["n"]), part)
        short = [key for key, (sample, _) in out.items() if not _holds_tail(sample)]
        if short:
            every = self._every_row(group, short)
            found = {tuple(k): g for k, g in every.group_by(group)}
            for key in short:
                part = found.get(key, every.clear())
                out[key] = (SortedWindow.of(part["duration_ms"].to_numpy()), part)
        return out

    def _every_row(self, group: list[str], keys: list[tuple[Any, ...]]) -> pl.DataFrame:
        """Every request row (:data:`_TOP_ROW_SCHEMA`) of these ``group`` keys: the whole
        summarised minutes' rows from the request table, the raw and partly covered minutes'
        from :attr:`_tops`."""
        assert self._tops is not None
        wanted = pl.DataFrame(keys, schema=dict.fromkeys(group, pl.String), orient="row")
        parts = [self._tops[1].filter(pl.col("loose")).select(_TOP_ROW_COLUMNS)]
        if self._whole:
            where, params = _in_ranges(self._whole)
            w = self.windows
            label = "if(start >= {s:DateTime64(9)} AND start < {e:DateTime64(9)}, 'current', 'baseline')"
            # The operations as one string each (names never hold the unit separator); the other
            # key columns are matched below.
            pairs = sorted({f"{k[group.index('service')]}\x1f{k[group.index('operation')]}" for k in keys})
            frame = self.store.query_polars(
                f"SELECT service, operation, version, {label} AS window, trace_key, start, duration_ms "
                f"FROM {self.store.table(REQUESTS_TABLE)} "
                f"WHERE {where} AND has({{pairs:Array(String)}}, concat(service, char(31), operation))",
                {**params, "s": w.start, "e": w.end, "pairs": pairs},
            )
            parts.append(normalize(frame).select(_TOP_ROW_COLUMNS).cast(pl.Schema(_TOP_ROW_SCHEMA)))
        return pl.concat(parts).join(wanted, on=group, how="semi")

    def window_tails(self, q: float, most: int) -> tuple[pl.DataFrame, pl.DataFrame] | None:
        """Per (service, operation, window): the requests and their ``q`` quantile (as
        :func:`analytics.attribution.window_stats`), and the tail traces at or above it, the
        slowest ``most`` (as :func:`analytics.attribution.tail_traces`) — from the per-minute
        counts and top requests (:meth:`_top_windows`); ``None`` where the request rows are needed
        (sampled data, overlapping windows, a quantile rank outside those read)."""
        if self._tops is None:
            return None
        try:
            return self._tails_from_tops(q, most)
        except OutsideWindow:
            return None

    def _tails_from_tops(self, q: float, most: int) -> tuple[pl.DataFrame, pl.DataFrame]:
        group = ["service", "operation", "window"]
        windows = self._top_windows(group)
        rows = [(*key, sample.size, polars_quantile(sample, q)) for key, (sample, _) in windows.items()]
        stats = pl.DataFrame(
            rows, schema={**_KEY_SCHEMA, "window": pl.String, "n": pl.Int64, "p99": pl.Float64}, orient="row"
        )
        columns = ["service", "operation", "window", "trace_key", "duration_ms", "start"]
        found = [
            part.filter(pl.col("duration_ms") >= p99).select(columns)
            for (_, (_, part)), (*_, p99) in zip(windows.items(), rows, strict=True)
            if p99 is not None
        ]
        tails = (
            pl.concat([empty(_TAIL_SCHEMA), *(f.cast(pl.Schema(_TAIL_SCHEMA)) for f in found)])
            .sort(["duration_ms", "trace_key"], descending=[True, False])
            .group_by("service", "operation", "window", maintain_order=True)
            .head(most)
            .select(columns)
        )
        return stats, tails

    def _raw_requests(self) -> pl.DataFrame | None:
        """The extracted (raw) requests of either window, labelled, or ``None`` when sampled."""
        w = self.windows
        raw = (
            pl.concat([_cast(r.requests, STORED_REQUESTS_SCHEMA) for r in self.extracted])
            if self.extracted
            else empty(STORED_REQUESTS_SCHEMA)
        )
        ns = pl.col("start").dt.epoch("ns")
        current = self._between(ns, w.start, w.end)
        raw = raw.filter(current | self._between(ns, w.baseline_start, w.baseline_end)).with_columns(
            current.alias("cur"),
            pl.when(current).then(pl.lit("current")).otherwise(pl.lit("baseline")).alias("window"),
        )
        if (raw["weight"].fill_null(1.0) != 1.0).any():
            return None
        return raw

    def walk(self, tails: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """The walks and critical paths of ``tails`` (see :func:`_walks`)."""
        return _walks(self.store, tails, self.extracted, self.covered, self.conv)


def _cast(frame: pl.DataFrame, schema: dict[str, Any]) -> pl.DataFrame:
    if frame.is_empty() and not frame.columns:
        return empty(schema)
    return frame.select(list(schema)).cast(pl.Schema(schema))


def _holds_tail(sample: SortedWindow) -> bool:
    """Whether ``sample`` holds the ranks a p99 and its bootstrap read: 12 standard deviations of
    the rank below it, and more (a draw beyond is a 1e-30 event, and then the rows are read)."""
    n = sample.size
    if n == 0 or sample.complete:
        return True
    reach = math.ceil(12 * math.sqrt(n * _Q * (1 - _Q))) + 64
    return sample.first <= max(0, math.floor(_Q * n) - reach)


def _has_spans(store: Store, lo: datetime, hi: datetime) -> bool:
    return bool(
        store.query_value(
            f"SELECT count() > 0 FROM {store.table(TRACES_TABLE)} "
            "WHERE Timestamp >= {lo:DateTime64(9)} AND Timestamp < {hi:DateTime64(9)}",
            {"lo": lo, "hi": hi},
        )
    )


def summarised_inputs(
    store: Store, windows: Windows, conventions: Conventions, shared: dict[Any, Any] | None = None
) -> SummaryInputs | None:
    """The inputs of the window from the summaries and raw spans where they do not reach, or
    ``None`` when no summary covers any of it (the caller reads raw spans as before). ``shared``:
    kept by a caller analysing several windows at one moment (a rule evaluation): a range of raw
    spans reduced for one window is reused for the next."""
    conv = conventions
    needed = _merge_ranges(
        [(windows.baseline_start, windows.baseline_end), (windows.start, windows.end + conv.trace_margin)]
    )
    covered = summary_coverage(store, needed[0][0], needed[-1][1], conventions=conv)
    inside, outside = _split(needed, covered)
    if not inside:
        return None
    # A range without a single span (before the first one, say) reduces to nothing: one count
    # through the primary key instead of the reads of an extraction.
    cache: dict[Any, Any] = {} if shared is None else shared

    def reduced(a: datetime, b: datetime) -> RangeRows | None:
        if ("raw", a, b) not in cache:
            cache[("raw", a, b)] = extract_range(store, a, b, conv) if _has_spans(store, a, b) else None
        return cast(RangeRows | None, cache[("raw", a, b)])

    extracted = [r for r in (reduced(a, b) for a, b in outside) if r is not None]
    return SummaryInputs(store, windows, conv, inside, extracted, covered, cache)


# A request row as a release step reads it, and a key to drop the copies of a request read twice.
_STEP_ROW_SCHEMA: dict[str, Any] = {**STEP_REQUESTS_SCHEMA, "trace_key": pl.UInt64}
_STEP_COLUMNS = (
    "service, operation, version, start, duration_ms, toInt64(sync_llm_calls) AS sync_llm_calls, trace_key"
)


def step_requests(
    store: Store,
    reads: pl.DataFrame,
    conventions: Conventions,
    *,
    use_summaries: bool = True,
    known: tuple[list[tuple[datetime, datetime]], pl.DataFrame] | None = None,
    shared: dict[Any, Any] | None = None,
) -> pl.DataFrame:
    """The request rows the release steps read (:func:`analytics.releases.step_reads`: per release,
    its service, version, time and ``lo``/``hi``): the version's requests after its release and the
    others' before it (:data:`analytics.releases.STEP_REQUESTS_SCHEMA`).

    Where the summaries reach, SQL keeps the first ``release_step_requests`` a side and operation
    (the last, before the release); elsewhere ``known``, request rows the caller has already
    reduced and the ranges they hold every request of (a window's), else the raw spans reduced
    now (once per range, kept in ``shared``). :func:`analytics.releases.release_steps` picks the
    same rows from the union, so the step does not depend on which part came from where."""
    conv = conventions
    if reads.is_empty():
        return empty(STEP_REQUESTS_SCHEMA)
    releases = reads.rows(named=True)
    lo, hi = min(r["lo"] for r in releases), max(r["hi"] for r in releases)
    covered = summary_coverage(store, lo, hi, conventions=conv) if use_summaries else []
    # Each release's two sides: (service, version, side, from, until).
    sides = [
        (r["service"], r["version"], side, a, b)
        for r in releases
        for side, a, b in (("before", r["lo"], r["released_at"]), ("after", r["released_at"], r["hi"]))
        if a < b
    ]
    frames: list[pl.DataFrame] = []
    selects: list[str] = []
    params: dict[str, Any] = {"n": conv.release_step_requests}
    loose: list[tuple[int, tuple[datetime, datetime]]] = []
    for i, (service, version, side, a, b) in enumerate(sides):
        inside, outside = _split([(a, b)], covered)
        loose += [(i, piece) for piece in outside]
        if not inside:
            continue
        ranges = " OR ".join(
            f"(start >= {{a{i}_{j}:DateTime64(9)}} AND start < {{b{i}_{j}:DateTime64(9)}})"
            for j in range(len(inside))
        )
        for j, (x, y) in enumerate(inside):
            params |= {f"a{i}_{j}": x, f"b{i}_{j}": y}
        params |= {f"s{i}": service, f"v{i}": version}
        which = "=" if side == "after" else "!="
        order = "start" if side == "after" else "start DESC"
        selects.append(
            f"SELECT * FROM (SELECT {_STEP_COLUMNS} FROM {store.table(REQUESTS_TABLE)} "
            f"WHERE service = {{s{i}:String}} AND version {which} {{v{i}:String}} AND ({ranges}) "
            f"ORDER BY operation, {order} LIMIT {{n:UInt64}} BY operation)"
        )
    if selects:
        frames.append(store.query_polars("\nUNION ALL\n".join(selects), params))
    if loose:
        # What the summaries do not hold: rows the caller has, else raw spans reduced once a range.
        have: list[tuple[datetime, datetime, pl.DataFrame]] = []
        if known is not None:
            rows = first_of_each(_cast(known[1], _STEP_ROW_SCHEMA), "trace_key")
            have = [(a, b, rows) for a, b in _merge_ranges(known[0])]
        rest = [(i, part) for i, piece in loose for part in _split([piece], [(a, b) for a, b, _ in have])[1]]
        cache: dict[Any, Any] = {} if shared is None else shared
        extracted = []
        for a, b in _merge_ranges([piece for _, piece in rest]):
            if ("steps", a, b) not in cache:
                cache[("steps", a, b)] = (
                    extract_range(store, a, b, conv, requests_only=True).requests
                    if _has_spans(store, a, b)
                    else empty(STORED_REQUESTS_SCHEMA)
                )
            extracted.append((a, b, _cast(cache[("steps", a, b)], _STEP_ROW_SCHEMA)))
        for i, (a, b) in loose:
            service, version, side, _, _ = sides[i]
            same = pl.col("version") == version
            for x, y, rows in [*have, *extracted]:
                if y <= a or x >= b:
                    continue
                frames.append(
                    rows.filter(
                        (pl.col("service") == service)
                        & (same if side == "after" else ~same)
                        & (pl.col("start") >= max(a, x))
                        & (pl.col("start") < min(b, y))
                    )
                )
    if not frames:
        return empty(STEP_REQUESTS_SCHEMA)
    rows = pl.concat([_cast(normalize(f), _STEP_ROW_SCHEMA) for f in frames])
    return first_of_each(rows, "trace_key").select(list(STEP_REQUESTS_SCHEMA))


_WALK_COLUMNS = (
    "trace_key, trace_id, start, llm_ns, span_key, critical_ns, self_ns, class, span_name, provider, model"
)


def _read_keyed(
    store: Store, table: str, columns: str, ranges: list[tuple[datetime, datetime]], keys: pl.Series
) -> pl.DataFrame:
    """The rows of ``table`` in ``ranges`` whose ``trace_key`` is one of ``keys``: through a key set
    on the embedded store, an array parameter on a server."""
    if keys.is_empty() or not ranges:
        return pl.DataFrame()
    where, params = _in_ranges(ranges)
    sql = f"SELECT {columns} FROM {store.table(table)} WHERE {where} AND "
    if store.embedded:
        with store.key_set(keys) as key_set:
            return store.query_polars(sql + f"trace_key IN {key_set}", params)
    return store.query_polars(
        sql + "has({keys:Array(UInt64)}, trace_key)", {**params, "keys": keys.cast(pl.UInt64).to_list()}
    )


def _stored_walks(
    store: Store, keys: pl.Series, lo: datetime, hi: datetime
) -> tuple[pl.DataFrame, pl.DataFrame]:
    frame = _read_keyed(store, TAIL_WALKS_TABLE, _WALK_COLUMNS, [(lo, hi)], keys)
    if frame.is_empty():
        return empty(WALKS_SCHEMA), empty(CRITICAL_PATH_SCHEMA)
    frame = first_of_each(normalize(frame), "trace_key")
    walks = frame.select(list(WALKS_SCHEMA)).cast(pl.Schema(WALKS_SCHEMA))
    paths = (
        frame.select(
            "trace_key", "span_key", "critical_ns", "self_ns", "class", "span_name", "provider", "model"
        )
        .explode("span_key", "critical_ns", "self_ns", "class", "span_name", "provider", "model")
        .drop_nulls("span_key")
        .select(list(CRITICAL_PATH_SCHEMA))
        .cast(pl.Schema(CRITICAL_PATH_SCHEMA))
    )
    return walks, paths


def _walks(
    store: Store,
    tails: pl.DataFrame,
    extracted: list[RangeRows],
    covered: tuple[datetime, datetime] | None,
    conv: Conventions,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The walks (:data:`WALKS_SCHEMA`) and critical paths of the tail traces (``trace_key``,
    ``start``): stored ones, those the raw extraction walked, and — for the rest — a walk now from
    their minutes' spans, stored where those minutes are summarised."""
    keys = tails["trace_key"].unique()
    if keys.is_empty():
        return empty(WALKS_SCHEMA), empty(CRITICAL_PATH_SCHEMA)
    lo = tails["start"].min()
    hi = tails["start"].max()
    assert isinstance(lo, datetime) and isinstance(hi, datetime)
    walks, paths = _stored_walks(store, keys, lo, hi + timedelta(microseconds=1))
    found = [walks, *(r.walks for r in extracted)]
    found_paths = [paths, *(r.paths for r in extracted)]
    have = pl.concat([f.select("trace_key") for f in found])["trace_key"]
    missing = tails.filter(~pl.col("trace_key").is_in(have.implode())).unique("trace_key")
    if not missing.is_empty():
        minutes = missing.select(pl.col("start").dt.truncate("1m").alias("m"))["m"].unique().sort().to_list()
        # Minutes close together are read as one range: fewer, larger reads.
        ranges = _merge_ranges([(as_utc(m), as_utc(m) + _WALK_GAP) for m in minutes])
        for a, b in ranges:
            extra = extract_range(store, a, b, conv, walk=missing["trace_key"], with_candidates=False)
            found.append(extra.walks)
            found_paths.append(extra.paths)
            if covered is not None and covered[0] <= a and b <= covered[1]:
                # Kept, so the next window with this tail reads it (only the walks: the minute's
                # other rows are stored already).
                fresh = extra.walks.join(walks.select("trace_key"), on="trace_key", how="anti")
                paths = extra.paths.join(fresh.select("trace_key"), on="trace_key", how="semi")
                _write(store, replace(RangeRows.empty(a, b), walks=fresh, paths=paths))
    # Each trace's walk from the first source that has it (a trace is walked the same way anywhere).
    wanted = tails.select("trace_key").unique()
    out_walks: list[pl.DataFrame] = []
    out_paths: list[pl.DataFrame] = []
    taken = empty({"trace_key": pl.UInt64})
    for source_walks, source_paths in zip(found, found_paths, strict=True):
        fresh = source_walks.join(wanted, on="trace_key", how="semi").join(taken, on="trace_key", how="anti")
        fresh = first_of_each(fresh, "trace_key")
        out_walks.append(fresh)
        out_paths.append(source_paths.join(fresh.select("trace_key"), on="trace_key", how="semi"))
        taken = pl.concat([taken, fresh.select("trace_key")])
    return pl.concat(out_walks), pl.concat(out_paths)


def latency_good_total(
    store: Store,
    start: datetime,
    end: datetime,
    threshold_ms: float,
    conventions: Conventions | None = None,
) -> pl.DataFrame:
    """Per (service, operation) of hot-path requests started in [start, end): ``good`` (faster than
    ``threshold_ms``) and ``total`` — the good/total pair of a latency SLO, weighted by the sample
    rate in sampled data (rounded). From the summaries where they reach, raw spans elsewhere
    (:func:`analytics.hot_path.latency_good_total`)."""
    conv = conventions or Conventions()
    windows = Windows.of(start, end)
    covered = summary_coverage(store, windows.start, windows.end, conventions=conv)
    inside, outside = _split([(windows.start, windows.end)], covered)
    if not inside:
        return raw_good_total(store, windows.start, windows.end, threshold_ms, conv)
    where, params = _in_ranges(inside)
    frames = [
        store.query_polars(
            "SELECT service, operation, "
            "sumIf(weight, round(duration_ms * 1e6) < {threshold_ns:Float64}) AS good, sum(weight) AS total "
            f"FROM {store.table(REQUESTS_TABLE)} WHERE {where} GROUP BY service, operation",
            {**params, "threshold_ns": float(threshold_ms) * 1e6},
        )
    ]
    frames += [raw_good_total(store, a, b, threshold_ms, conv, rounded=False) for a, b in outside]
    schema = {"service": pl.String, "operation": pl.String, "good": pl.Float64, "total": pl.Float64}
    merged = pl.concat(
        [normalize(f).select(list(schema)).cast(pl.Schema(schema)) for f in frames if not f.is_empty()]
        or [empty(schema)]
    )
    return (
        merged.group_by("service", "operation")
        .agg(pl.col("good").sum().round().cast(pl.Int64), pl.col("total").sum().round().cast(pl.Int64))
        .sort("service", "operation")
    )
