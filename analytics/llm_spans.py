"""Hot-path roots and LLM spans: the two reads behind requests, the LLM-side signals and the
attributes of the spans the trace walks read.

The requests need every hot-path root and, per trace, its synchronous LLM calls; the LLM signals need
every LLM span with its error, 429 and retry marks and whether its trace is a hot-path request; the
critical path and the retry metrics need the LLM class, provider, model, tokens and resend count of
the spans they walk. The LLM-span read therefore also returns the other spans that carry tokens or a
resend count (``is_llm`` false), the workflow spans the retry metrics start from, the HTTP client
spans that are an LLM call's attempts when their parent is one, and the cold-path boundaries
(consumers, messaging process/receive spans) the ancestry walk starts from — all read by the same
scan (a separate query cost a fifth of this one). Both reads happen once each,
as narrow rows with 64-bit keys, and the metric code groups them in Polars
(:func:`analytics.hot_path.with_sync_llm_calls`, :func:`analytics.attribution.llm_signal_counts`,
:func:`analytics.trace_spans.with_span_attributes`, :func:`analytics.retries.workflows_from_spans`):
a GROUP BY
per trace in ClickHouse plus a second pass over the LLM spans for the signals cost about twice as
much as these two reads.

Roots are read where ``ParentSpanId`` is empty (its size subcolumn, not the ids), the LLM-span read's
rows where an operation, framework-kind, provider, token, resend, messaging-operation or HTTP-method
key is present (the key subcolumn) or the kind is Consumer, so neither read decompresses
the attribute maps of spans it cannot return. Both cover each window plus the trace margin.
Duplicates of a span (same TraceId, SpanId) are left to the caller (the first row of each
``trace_key`` for roots, of each ``span_key`` for LLM spans), so that the store can start its next
query while Python drops them.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from analytics._common import Windows, empty, normalize
from analytics.conventions import (
    ABANDONED,
    CACHED_INPUT_TEXT,
    ERRORED,
    INPUT_TOKENS,
    IS_BOUNDARY,
    IS_COLD_MARKED,
    IS_FIRST_BYTE,
    IS_HOT_ROOT,
    IS_HTTP_CLIENT,
    IS_LLM,
    IS_WORKFLOW,
    KIND,
    MAYBE_BOUNDARY,
    MAYBE_COUNTED,
    MAYBE_FIRST_BYTE,
    MAYBE_HTTP_CLIENT,
    MAYBE_LLM,
    MAYBE_MARKED_HOT,
    MAYBE_WORKFLOW,
    MODEL,
    OUTPUT_TOKENS,
    PATH,
    PROVIDER,
    RESEND,
    STREAMED,
    THROTTLED,
    TTFT_EVENT_NS,
    TTFT_TEXT,
    VERSION,
    WEIGHT,
    WORKFLOW_NAME,
    Conventions,
)
from collectors import TRACES_TABLE, inspect_traces
from storage import Store

__all__ = [
    "LLM_SPANS_SCHEMA",
    "ROOTS_SCHEMA",
    "fetch_llm_spans",
    "fetch_roots",
    "first_bytes_sql",
    "llm_spans_sql",
    "roots_sql",
]

ROOTS_SCHEMA: dict[str, Any] = {
    "trace_key": pl.UInt64,  # cityHash64(TraceId)
    # Categorical: every metric groups requests by these, and integer codes group far faster.
    "service": pl.Categorical(),
    "operation": pl.Categorical(),
    "version": pl.Categorical(),
    "start": pl.Datetime("ns", "UTC"),
    "duration_ms": pl.Float64,
    "abandoned": pl.Boolean,
    # How many requests the root stands for: 1.0 unless the data is sampled (conventions.WEIGHT).
    "weight": pl.Float64,
    # Time to the response's first byte (first_bytes_sql; null where the server marks none) and
    # whether the body went out in two or more sends.
    "first_byte_ms": pl.Float64,
    "streamed": pl.Boolean,
}

FIRST_BYTES_SCHEMA: dict[str, Any] = {
    "service_key": pl.UInt64,  # cityHash64(TraceId, ServiceName)
    "first_byte_ns": pl.Int64,
    "streamed": pl.Boolean,
}

LLM_SPANS_SCHEMA: dict[str, Any] = {
    "trace_key": pl.UInt64,  # cityHash64(TraceId)
    "span_key": pl.UInt64,  # cityHash64(TraceId, SpanId): duplicates share it
    "parent_key": pl.UInt64,  # cityHash64(TraceId, ParentSpanId): the parent's span_key
    "call_key": pl.UInt64,  # cityHash64(TraceId, ParentSpanId, SpanName): same-name siblings share it
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "provider": pl.Categorical(),
    "model": pl.Categorical(),
    "is_llm": pl.Boolean,  # false for the other spans this read returns
    "errored": pl.Boolean,  # error status, error.type, or an HTTP status >= 400
    "throttled": pl.Boolean,
    "tokens": pl.Int64,
    "resend": pl.Int64,  # the resend count or the SDK's retry header, 0 when absent
    "cold_marked": pl.Boolean,
    # An LLM call that may be on the request path of its trace: not a hot root itself, not marked
    # cold, not a consumer. Whether a consumer lies between it and the root takes the trace's
    # structure (analytics.ancestry); analyze() clears it for the calls below one.
    "sync": pl.Boolean,
    # A workflow span (see analytics.retries: its span_key names it), with its workflow name ('' otherwise).
    "is_workflow": pl.Boolean,
    "workflow": pl.Categorical(),
    # Where cold-path work starts: a consumer, or a messaging process/receive span.
    "is_boundary": pl.Boolean,
    # An HTTP client span: one physical attempt of its parent's call when that is an LLM span.
    "is_attempt": pl.Boolean,
    # The call's anatomy, on LLM spans (0 / null on the others): input tokens (cached ones
    # included), output tokens, input tokens read from the prompt cache, time to first token (null
    # when the span records none) and whether the call was streamed.
    "input_tokens": pl.Int64,
    "output_tokens": pl.Int64,
    "cached_tokens": pl.Int64,
    "ttft_ns": pl.Int64,
    "streamed": pl.Boolean,
    "reports_cache": pl.Boolean,  # the span carries a cached-input-token attribute (0 included)
}

# Repeated strings travel as Arrow dictionaries and arrive as Polars categoricals. In the query's own
# SETTINGS clause: per-call settings cost the embedded store extra round trips (Store.query_arrow).
_DICTIONARIES = "SETTINGS output_format_arrow_low_cardinality_as_dictionary = 1"

_IN_WINDOWS = (
    "((Timestamp >= {bs:DateTime64(9)} AND Timestamp < {be_m:DateTime64(9)}) "
    "OR (Timestamp >= {s:DateTime64(9)} AND Timestamp < {e_m:DateTime64(9)}))"
)


def roots_sql(table: str) -> str:
    """Hot-path roots started in either window or its margin, one row per root span."""
    # IS_HOT_ROOT with the mark read only where it can match: PREWHERE keeps roots of a hot kind and
    # roots whose maps carry the mark's key, and the WHERE's OR looks the mark up only for the
    # latter (one scan of the parent ids; two SELECTs, one per kind of root, read them twice).
    return f"""
SELECT cityHash64(TraceId) AS trace_key, cityHash64(TraceId, ServiceName) AS service_key,
       toLowCardinality(ServiceName) AS service, toLowCardinality(SpanName) AS operation,
       toLowCardinality({VERSION}) AS version,
       Timestamp AS start, Duration / 1e6 AS duration_ms, {ABANDONED} AS abandoned,
       {WEIGHT} AS weight
FROM {table}
PREWHERE ParentSpanId = '' AND ({KIND} IN {{cv_hot_kinds:Array(String)}} OR {MAYBE_MARKED_HOT})
WHERE {_IN_WINDOWS} AND ({KIND} IN {{cv_hot_kinds:Array(String)}} OR {PATH} = {{cv_hot:String}})
{_DICTIONARIES}
"""


def first_bytes_sql(table: str) -> str:
    """Per trace and service (``service_key``): the first send of a response byte (start, ns) and
    whether there were several (``streamed``), of the spans started in either window or its margin."""
    # Grouped here: a streamed response has one send span per chunk. The service, not the parent,
    # ties them to the root: the ASGI instrumentation parents a send to the span current at the
    # send() call, which is an application span when a generator yields inside one. Two sends at
    # different times make a stream (a span's duplicates share its time): no distinct count of ids.
    return f"""
SELECT cityHash64(TraceId, ServiceName) AS service_key,
       min(toUnixTimestamp64Nano(Timestamp)) AS first_byte_ns, max(Timestamp) > min(Timestamp) AS streamed
FROM {table}
PREWHERE {MAYBE_FIRST_BYTE}
WHERE {_IN_WINDOWS} AND {IS_FIRST_BYTE} AND ParentSpanId != ''
GROUP BY service_key
"""


def llm_spans_sql(table: str) -> str:
    """LLM spans, the HTTP attempts below them, other spans carrying tokens or a resend count,
    workflow spans and cold-path boundary spans, started in either window or its margin, one row
    per span."""
    # An HTTP client span is an attempt when its parent is an LLM span. Every HTTP client span comes
    # back (narrow rows) and analytics.llm_calls.span_attempts keeps the children of LLM spans: an IN
    # set of LLM span keys built in SQL cost a second pass over them, a quarter of this query.
    # The anatomy's attribute values are looked up once each (WITH: not returned), and the tokens of
    # every span are their sum.
    return f"""
WITH {INPUT_TOKENS} AS in_toks, {OUTPUT_TOKENS} AS out_toks, {CACHED_INPUT_TEXT} AS cached_text,
     {TTFT_TEXT} AS ttft_text
SELECT cityHash64(TraceId) AS trace_key, cityHash64(TraceId, SpanId) AS span_key,
       cityHash64(TraceId, ParentSpanId) AS parent_key,
       cityHash64(TraceId, ParentSpanId, SpanName) AS call_key,
       toUnixTimestamp64Nano(Timestamp) AS start_ns,
       toUnixTimestamp64Nano(Timestamp) + toInt64(Duration) AS end_ns,
       toLowCardinality({PROVIDER}) AS provider, toLowCardinality({MODEL}) AS model,
       {IS_LLM} AS is_llm, {ERRORED} AS errored, {THROTTLED} AS throttled,
       toInt64(in_toks + out_toks) AS tokens, toInt64({RESEND}) AS resend, {IS_COLD_MARKED} AS cold_marked,
       {IS_BOUNDARY} AS is_boundary,
       is_llm AND NOT {IS_HOT_ROOT} AND NOT cold_marked AND NOT is_boundary AS sync,
       {IS_WORKFLOW} AS is_workflow,
       toLowCardinality(if(is_workflow, {WORKFLOW_NAME}, '')) AS workflow,
       NOT is_llm AND ParentSpanId != '' AND {IS_HTTP_CLIENT} AS is_attempt,
       toInt64(if(is_llm, in_toks, 0)) AS input_tokens,
       toInt64(if(is_llm, out_toks, 0)) AS output_tokens,
       toInt64(if(is_llm, toUInt64OrZero(cached_text), 0)) AS cached_tokens,
       if(is_llm, if(ttft_text != '', toInt64(toFloat64OrZero(ttft_text) * 1e9), {TTFT_EVENT_NS}),
          NULL) AS ttft_ns,
       is_llm AND (ttft_ns IS NOT NULL OR {STREAMED}) AS streamed,
       is_llm AND cached_text != '' AS reports_cache
FROM {table}
PREWHERE {MAYBE_LLM} OR {MAYBE_COUNTED} OR {MAYBE_WORKFLOW} OR {MAYBE_BOUNDARY} OR {MAYBE_HTTP_CLIENT}
WHERE {_IN_WINDOWS} AND (is_llm OR tokens > 0 OR resend > 0 OR is_workflow OR is_boundary OR is_attempt)
{_DICTIONARIES}
"""


def _fetch(
    store: Store, sql: str, windows: Windows, conventions: Conventions, schema: dict[str, Any]
) -> pl.DataFrame:
    params = {**conventions.sql_parameters(), **windows.params(conventions)}
    frame = store.query_polars(inspect_traces(store).adapt(sql), params)
    if frame.is_empty():
        return empty(schema)
    # normalize() would turn the dictionaries into strings: only the timestamps need it.
    times = [name for name, dtype in frame.schema.items() if isinstance(dtype, pl.Datetime)]
    frame = frame.with_columns(normalize(frame.select(times))) if times else frame
    return frame.cast(pl.Schema(schema)).select(list(schema))


def fetch_roots(store: Store, windows: Windows, conventions: Conventions) -> pl.DataFrame:
    """Hot-path roots (:data:`ROOTS_SCHEMA`) with their first byte, duplicates included (one row
    per ``trace_key`` wanted)."""
    table = store.table(TRACES_TABLE)
    columns = {k: v for k, v in ROOTS_SCHEMA.items() if k not in ("first_byte_ms", "streamed")}
    roots = _fetch(store, roots_sql(table), windows, conventions, {**columns, "service_key": pl.UInt64})
    if not conventions.first_byte_attribute or roots.is_empty():
        return roots.select(
            *columns, pl.lit(None, pl.Float64).alias("first_byte_ms"), pl.lit(False).alias("streamed")
        )
    sends = _fetch(store, first_bytes_sql(table), windows, conventions, FIRST_BYTES_SCHEMA)
    return (
        roots.join(sends, on="service_key", how="left", maintain_order="left")
        .with_columns(
            ((pl.col("first_byte_ns") - pl.col("start").dt.epoch("ns")) / 1e6).alias("first_byte_ms"),
            pl.col("streamed").fill_null(False),
        )
        .select(list(ROOTS_SCHEMA))
    )


def fetch_llm_spans(store: Store, windows: Windows, conventions: Conventions) -> pl.DataFrame:
    """LLM spans, the other spans carrying tokens or a resend count, workflow spans, HTTP client spans
    and boundary spans (:data:`LLM_SPANS_SCHEMA`), duplicates included (one row per ``span_key``
    wanted)."""
    return _fetch(store, llm_spans_sql(store.table(TRACES_TABLE)), windows, conventions, LLM_SPANS_SCHEMA)
