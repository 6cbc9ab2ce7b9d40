"""Every span of chosen traces, read in one pass for every metric that walks whole traces.

Attribution walks the critical path of the tail traces; retry amplification walks the attempts of
workflow traces. Both need the spans of a set of traces, and a set of traces is scattered over the
whole table (``otel_traces`` is ordered by service, span name and time, not by trace): selecting
them touches nearly every granule, so reading the union once costs about what reading either
costs. One query serves both; each metric keeps the rows and columns it needs.

Duplicates of a span (same TraceId, SpanId) collapse in the ``GROUP BY``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import polars as pl

from analytics._common import empty, normalize
from analytics.conventions import IS_LLM, IS_STRUCTURE, KIND, MODEL, PROVIDER, RESEND, TOKENS, Conventions
from collectors.schema import TRACES_TABLE
from collectors.store import Store

__all__ = ["TRACE_SPANS_SCHEMA", "fetch_trace_spans", "trace_spans_sql"]

TRACE_SPANS_SCHEMA: dict[str, Any] = {
    "trace_key": pl.UInt64,  # cityHash64(TraceId), the key the requests and workflows carry
    "trace_id": pl.String,
    "span_id": pl.String,
    "parent_id": pl.String,
    "name": pl.String,
    "kind": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "is_llm": pl.Boolean,
    "is_structure": pl.Boolean,
    "provider": pl.String,
    "model": pl.String,
    "tokens": pl.Int64,
    "resend": pl.Int64,
}


def trace_spans_sql(table: str) -> str:
    return f"""
SELECT cityHash64(any(TraceId)) AS trace_key, any(TraceId) AS trace_id, any(SpanId) AS span_id,
       any(ParentSpanId) AS parent_id, any(SpanName) AS name,
       any({KIND}) AS kind, min(toUnixTimestamp64Nano(Timestamp)) AS start_ns,
       max(toUnixTimestamp64Nano(Timestamp) + toInt64(Duration)) AS end_ns,
       max({IS_LLM}) AS is_llm, max({IS_STRUCTURE}) AS is_structure,
       any({PROVIDER}) AS provider, any({MODEL}) AS model,
       toInt64(any({TOKENS})) AS tokens, toInt64(any({RESEND})) AS resend
FROM {table}
-- A subquery builds a hash set; an array literal on the right of IN would be scanned per row. As
-- PREWHERE, only the id column is read for spans of other traces.
PREWHERE cityHash64(TraceId) IN (SELECT arrayJoin({{keys:Array(UInt64)}}))
WHERE Timestamp >= {{lo:DateTime64(9)}} AND Timestamp < {{hi:DateTime64(9)}}
GROUP BY cityHash64(TraceId, SpanId)
"""


def fetch_trace_spans(
    store: Store, trace_keys: list[int], lo: datetime, hi: datetime, conventions: Conventions
) -> pl.DataFrame:
    """Spans starting in [lo, hi) of the traces whose ``cityHash64(TraceId)`` is in ``trace_keys``."""
    if not trace_keys:
        return empty(TRACE_SPANS_SCHEMA)
    params = {**conventions.sql_parameters(), "lo": lo, "hi": hi, "keys": trace_keys}
    frame = normalize(store.query_polars(trace_spans_sql(store.table(TRACES_TABLE)), params))
    if frame.is_empty():
        return empty(TRACE_SPANS_SCHEMA)
    return frame.cast(pl.Schema(TRACE_SPANS_SCHEMA)).select(list(TRACE_SPANS_SCHEMA))
