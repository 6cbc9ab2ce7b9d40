"""Every span of chosen traces, read in one pass for every metric that walks whole traces.

Attribution walks the critical path of the tail traces; retry amplification walks the attempts of
workflow traces. Both need the spans of a set of traces, and a set of traces is scattered over the
whole table (``otel_traces`` is ordered by service, span name and time, not by trace): selecting
them touches nearly every granule, so reading the union once costs about what reading either
costs. One query serves both; each metric keeps the rows and columns it needs.

Duplicates of a span (same TraceId, SpanId) are dropped in Polars, the first row of each, so the
store moves on to its next query meanwhile. The pass reads no attribute map: decompressing
``SpanAttributes`` for every granule cost a quarter of it. The few attributes the metrics need (LLM
class, provider, model, tokens, resend count) come from the LLM-span read
(:func:`analytics.llm_spans.fetch_llm_spans`, which covers every span carrying one of them) through
:func:`with_span_attributes`.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from analytics._common import Windows, empty, first_of_each, normalize
from analytics.conventions import (
    IS_BOUNDARY,
    IS_HOT_ROOT,
    IS_WORKFLOW,
    KIND,
    MAYBE_BOUNDARY,
    MAYBE_WORKFLOW,
    STATUS,
    Conventions,
)
from collectors import TRACES_TABLE, inspect_traces
from storage import Store

__all__ = [
    "TRACE_SPANS_SCHEMA",
    "TRACE_SPAN_ROWS_SCHEMA",
    "fetch_structure",
    "fetch_trace_spans",
    "trace_spans_sql",
    "with_span_attributes",
]

# What the pass reads: the structure of each span.
TRACE_SPAN_ROWS_SCHEMA: dict[str, Any] = {
    "trace_key": pl.UInt64,  # cityHash64(TraceId), the key the requests and workflows carry
    "span_key": pl.UInt64,  # cityHash64(TraceId, SpanId), the key of the LLM-span read
    "parent_key": pl.UInt64,  # cityHash64(TraceId, ParentSpanId): the parent's span_key
    # The trace's id on its root spans, '' on the others: the walks need only the keys, and the id
    # on every span cost about 6% of the pass (only the tail traces' ids are shown, as exemplars).
    "trace_id": pl.String,
    "name": pl.String,
    "kind": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "failed": pl.Boolean,  # status Error (the LLM-span read adds error types and HTTP statuses)
}

# What the metrics read: the structure plus the attributes of :func:`with_span_attributes`.
TRACE_SPANS_SCHEMA: dict[str, Any] = {
    **TRACE_SPAN_ROWS_SCHEMA,
    "is_llm": pl.Boolean,
    "provider": pl.String,
    "model": pl.String,
    "tokens": pl.Int64,
    "resend": pl.Int64,
    "is_boundary": pl.Boolean,  # a consumer or messaging process/receive span
    "extra_attempts": pl.Int64,  # an LLM span's HTTP attempts beyond the first
}


def _by_floors(table: str) -> str:
    return f"""
    SELECT key FROM (
        SELECT cityHash64(TraceId) AS key, Timestamp AS ts, Duration AS ns,
               indexOf(arrayZip({{cur_services:Array(String)}}, {{cur_ops:Array(String)}}),
                       (toString(ServiceName), toString(SpanName))) AS cur_i,
               indexOf(arrayZip({{base_services:Array(String)}}, {{base_ops:Array(String)}}),
                       (toString(ServiceName), toString(SpanName))) AS base_i
        FROM {table}
        PREWHERE ParentSpanId = ''
        WHERE {IS_HOT_ROOT}
          AND ((Timestamp >= {{s:DateTime64(9)}} AND Timestamp < {{e:DateTime64(9)}})
            OR (Timestamp >= {{bs:DateTime64(9)}} AND Timestamp < {{be:DateTime64(9)}}))
    )
    WHERE (cur_i > 0 AND ts >= {{s:DateTime64(9)}} AND ts < {{e:DateTime64(9)}}
           AND ns >= {{cur_floor:Array(UInt64)}}[cur_i])
       OR (base_i > 0 AND ts >= {{bs:DateTime64(9)}} AND ts < {{be:DateTime64(9)}}
           AND ns >= {{base_floor:Array(UInt64)}}[base_i])
    UNION ALL
    SELECT cityHash64(TraceId) FROM {table}
    PREWHERE {{workflows:Bool}} AND {MAYBE_WORKFLOW}
    WHERE ((Timestamp >= {{s:DateTime64(9)}} AND Timestamp < {{e:DateTime64(9)}})
        OR (Timestamp >= {{bs:DateTime64(9)}} AND Timestamp < {{be:DateTime64(9)}})) AND {IS_WORKFLOW}
    UNION ALL
    SELECT cityHash64(TraceId) FROM {table}
    PREWHERE {{boundaries:Bool}} AND ParentSpanId != '' AND {MAYBE_BOUNDARY}
    WHERE Timestamp >= {{lo:DateTime64(9)}} AND Timestamp < {{hi:DateTime64(9)}} AND {IS_BOUNDARY}
"""


# The pass keeps a few rows of each granule it reads. At the default block size (about 1 MB of
# columns) they leave as a thousand small blocks at 10M spans, and each becomes an Arrow record batch
# with its own cost on both sides; blocks of up to 256k rows make them thirty times fewer, which
# took a quarter off the pass. (The other reads keep most rows of the granules they read, and
# larger blocks did not help them.) In the query's own SETTINGS clause, as for the LLM-span read.
_LARGE_BLOCKS = "SETTINGS max_block_size = 262144, preferred_block_size_bytes = 200000000"


def trace_spans_sql(table: str, key_set: str | None) -> str:
    """Spans of the chosen traces. With ``key_set`` (a table made by
    :meth:`storage.Store.key_set`): the traces whose ``cityHash64(TraceId)`` is in it.
    Otherwise the query chooses them itself: the hot-path requests at or above their
    (service, operation, window)'s duration floor and, with ``{workflows}``, the traces with a
    workflow span in the current or the baseline window and, with ``{boundaries}``, the traces
    with a cold-path boundary below their root — a list of every workflow trace of a day would exceed what a
    ClickHouse server accepts as a query parameter, and re-reading the roots costs more than
    handing the keys to the embedded engine.
    """
    selection = key_set if key_set is not None else f"({_by_floors(table)})"
    return f"""
SELECT cityHash64(TraceId) AS trace_key, cityHash64(TraceId, SpanId) AS span_key,
       cityHash64(TraceId, ParentSpanId) AS parent_key, if(ParentSpanId = '', TraceId, '') AS trace_id,
       SpanName AS name,
       {KIND} AS kind, toUnixTimestamp64Nano(Timestamp) AS start_ns,
       toUnixTimestamp64Nano(Timestamp) + toInt64(Duration) AS end_ns,
       {STATUS} = 'Error' AS failed
FROM {table}
-- The IN set is built once; as PREWHERE, only the id column is read for spans of other traces.
PREWHERE cityHash64(TraceId) IN {selection}
WHERE Timestamp >= {{lo:DateTime64(9)}} AND Timestamp < {{hi:DateTime64(9)}}
{_LARGE_BLOCKS}
"""


def _floors(tails: pl.DataFrame, window: str) -> tuple[list[str], list[str], list[int]]:
    # The shortest chosen request per (service, operation) in ns, a nanosecond low so that float
    # rounding of duration_ms never drops one; ties at the floor only add traces the caller ignores.
    part = (
        tails.filter(pl.col("window") == window)
        .group_by("service", "operation")
        .agg(pl.col("duration_ms").min())
        .sort("service", "operation")
    )
    floors = [max(0, math.floor(ms * 1e6) - 1) for ms in part["duration_ms"].to_list()]
    return part["service"].to_list(), part["operation"].to_list(), floors


def fetch_trace_spans(
    store: Store,
    tails: pl.DataFrame,
    workflows: pl.DataFrame | None,
    windows: Windows,
    conventions: Conventions,
    *,
    boundaries: pl.Series | None = None,
    by_keys: bool | None = None,
) -> pl.DataFrame:
    """Spans of the tail traces (``tails``, see :func:`analytics.attribution.tail_traces`), of the
    workflow traces (``workflows``: ``trace_key``, see :func:`analytics.retries.fetch_workflows`) and
    of the traces whose structure decides which LLM calls are queued work (``boundaries``, see
    :func:`analytics.ancestry.boundary_traces`), in :data:`TRACE_SPAN_ROWS_SCHEMA` (attributes follow
    with :func:`with_span_attributes`).

    The embedded engine gets the trace keys as a temporary set table
    (:meth:`storage.Store.key_set`); a server store (``by_keys`` False) has the query choose
    them again from the tails' duration floors, where ties at a floor may add traces — callers keep
    theirs by ``trace_key``.
    """
    by_keys = store.embedded if by_keys is None else by_keys
    keys = tails["trace_key"].unique()
    if workflows is not None:
        keys = pl.concat([keys, workflows["trace_key"].cast(pl.UInt64)])
    if boundaries is not None:
        keys = pl.concat([keys, boundaries.cast(pl.UInt64)])
    if keys.is_empty():
        return empty(TRACE_SPAN_ROWS_SCHEMA)
    params: dict[str, Any] = {
        **conventions.sql_parameters(),
        "lo": min(windows.start, windows.baseline_start),
        "hi": max(windows.end, windows.baseline_end) + conventions.trace_margin,
    }
    table = store.table(TRACES_TABLE)
    if by_keys:
        with store.key_set(keys) as key_set:
            frame = store.query_polars(inspect_traces(store).adapt(trace_spans_sql(table, key_set)), params)
    else:
        cur_services, cur_ops, cur_floor = _floors(tails, "current")
        base_services, base_ops, base_floor = _floors(tails, "baseline")
        params |= {
            **windows.params(conventions),
            "cur_services": cur_services,
            "cur_ops": cur_ops,
            "cur_floor": cur_floor,
            "base_services": base_services,
            "base_ops": base_ops,
            "base_floor": base_floor,
            "workflows": workflows is not None and workflows.height > 0,
            "boundaries": boundaries is not None and boundaries.len() > 0,
        }
        frame = store.query_polars(inspect_traces(store).adapt(trace_spans_sql(table, None)), params)
    if frame.is_empty():
        return empty(TRACE_SPAN_ROWS_SCHEMA)
    # Duplicates of a span (client retries resend identical spans) count once: the first row of each
    # span_key, dropped here rather than by a GROUP BY on the store's side.
    return (
        first_of_each(normalize(frame), "span_key")
        .cast(pl.Schema(TRACE_SPAN_ROWS_SCHEMA))
        .select(list(TRACE_SPAN_ROWS_SCHEMA))
    )


def fetch_structure(
    store: Store, traces: pl.Series, windows: Windows, conventions: Conventions
) -> pl.DataFrame:
    """Every span of ``traces`` (:data:`TRACE_SPAN_ROWS_SCHEMA`): the structure
    :func:`analytics.ancestry.without_queued_calls` walks, read on its own."""
    no_tails = pl.DataFrame(
        schema={"trace_key": pl.UInt64, "service": pl.String, "operation": pl.String, "window": pl.String}
    ).with_columns(pl.lit(0.0).alias("duration_ms"))
    return fetch_trace_spans(store, no_tails, None, windows, conventions, boundaries=traces)


def with_span_attributes(
    rows: pl.DataFrame, llm_spans: pl.DataFrame, attempts: pl.DataFrame | None = None
) -> pl.DataFrame:
    """:data:`TRACE_SPANS_SCHEMA`: the trace spans of :func:`fetch_trace_spans` with their LLM class,
    provider, model, tokens, resend count, boundary flag and failure marks from
    :func:`analytics.llm_spans.fetch_llm_spans` (one row per span, read over the same windows and
    margin), and the extra HTTP attempts of each LLM span (:func:`analytics.llm_calls.span_attempts`).
    A span that read did not return carries none of those attributes: not an LLM span, no tokens, no
    resend count, failed only by its status. Pure."""
    # Narrowed to these spans first: a hash join against every LLM span costs three times more.
    attributes = llm_spans.filter(pl.col("span_key").is_in(rows["span_key"].implode())).select(
        "span_key",
        "is_llm",
        pl.col("provider").cast(pl.String),
        pl.col("model").cast(pl.String),
        "tokens",
        "resend",
        "is_boundary",
        pl.col("errored").alias("_errored"),
    )
    joined = rows.join(attributes, on="span_key", how="left")
    if attempts is not None and not attempts.is_empty():
        joined = joined.join(
            attempts.select("span_key", (pl.col("attempts") - 1).alias("extra_attempts")),
            on="span_key",
            how="left",
        )
    else:
        joined = joined.with_columns(pl.lit(0, pl.Int64).alias("extra_attempts"))
    return joined.with_columns(
        pl.col("is_llm", "is_boundary").fill_null(False),
        pl.col("provider", "model").fill_null(""),
        pl.col("tokens", "resend", "extra_attempts").fill_null(0),
        (pl.col("failed") | pl.col("_errored").fill_null(False)).alias("failed"),
    ).select(list(TRACE_SPANS_SCHEMA))
