"""The tables of the summaries (:mod:`analytics.summaries`): what each minute of spans reduces to.

One row per item the metrics count — a hot-path request, a logical LLM call, a walked tail trace, a
job span, a workflow trace's span, a flag evaluation — with everything that took the whole trace to
decide already decided (a request's synchronous LLM calls and the time they hold it, a call's
attempts, a trace's critical path). A window's analysis reads these narrow rows instead of the span
table's maps, and the same metric code runs on them.

Every table is partitioned by day of ``start`` (a workflow's span by its workflow's start), so a
retention shorter than the span table's drops whole days, and ordered so that a window's rows are
one contiguous range. ``tailwatch_summary_minutes`` records each summarised minute: how many span
rows it held when it was summarised (a later count that differs means late or repeated spans, and
the minute is summarised again) and when.

Where a window is long, whole hours are read pre-merged: ``tailwatch_agg_llm_anatomy_hours`` holds
each hour's anatomy histograms (the sum of its 60 minutes' rows, by far the most numerous of the
aggregates), and ``tailwatch_summary_hours`` records each hour merged once all of its minutes were
summarised with the same layout and conventions. A rebuilt minute removes its hour's record and rows
first; rows without a record (a build killed while merging) are never read.
"""

from __future__ import annotations

from storage import DDLContext

__all__ = [
    "AGG_LLM_ANATOMY_HOURS_TABLE",
    "AGG_LLM_ANATOMY_TABLE",
    "AGG_REQUESTS_TABLE",
    "AGG_REQUEST_LLM_TABLE",
    "AGG_WORKFLOW_HOPS_TABLE",
    "AGG_WORKFLOW_RUNS_TABLE",
    "CALLS_TABLE",
    "CALL_MINUTES_TABLE",
    "EVALUATIONS_TABLE",
    "HOURS_TABLE",
    "HOUR_TABLES",
    "JOB_SPANS_TABLE",
    "MINUTES_TABLE",
    "REQUESTS_TABLE",
    "REQUEST_MINUTES_TABLE",
    "SUMMARY_TABLES",
    "TAIL_WALKS_TABLE",
    "TOP_REQUESTS_TABLE",
    "WORKFLOW_SPANS_TABLE",
    "aggregate_tables",
    "aggregate_workflow_tables",
    "anatomy_columns",
    "anatomy_tables",
    "failed_calls_column",
    "first_byte_columns",
    "hour_tables",
    "minutes_layer",
    "request_llm_tables",
    "summary_tables",
    "summary_top_tables",
]

REQUESTS_TABLE = "tailwatch_summary_requests"
CALLS_TABLE = "tailwatch_summary_llm_calls"
TAIL_WALKS_TABLE = "tailwatch_summary_tail_walks"
JOB_SPANS_TABLE = "tailwatch_summary_job_spans"
WORKFLOW_SPANS_TABLE = "tailwatch_summary_workflow_spans"
EVALUATIONS_TABLE = "tailwatch_summary_flag_evaluations"
MINUTES_TABLE = "tailwatch_summary_minutes"
REQUEST_MINUTES_TABLE = "tailwatch_summary_request_minutes"
TOP_REQUESTS_TABLE = "tailwatch_summary_top_requests"
CALL_MINUTES_TABLE = "tailwatch_summary_llm_call_minutes"
AGG_REQUESTS_TABLE = "tailwatch_agg_requests"
AGG_WORKFLOW_HOPS_TABLE = "tailwatch_agg_workflow_hops"
AGG_WORKFLOW_RUNS_TABLE = "tailwatch_agg_workflow_runs"
AGG_LLM_ANATOMY_TABLE = "tailwatch_agg_llm_anatomy"
AGG_REQUEST_LLM_TABLE = "tailwatch_agg_request_llm"
AGG_LLM_ANATOMY_HOURS_TABLE = "tailwatch_agg_llm_anatomy_hours"
HOURS_TABLE = "tailwatch_summary_hours"

# (table, columns, ORDER BY, shard key): every table but the minutes has a ``start`` to partition on.
_TABLES: tuple[tuple[str, str, str, str], ...] = (
    (
        REQUESTS_TABLE,
        """    start DateTime64(9, 'UTC'),
    trace_key UInt64,
    service LowCardinality(String),
    operation LowCardinality(String),
    version LowCardinality(String),
    duration_ms Float64,
    abandoned Bool,
    weight Float64,
    sync_llm_calls UInt32,
    sync_llm_ms Float64,
    first_byte_ms Nullable(Float64),
    streamed Bool""",
        "(service, operation, start)",
        "cityHash64(service, operation)",
    ),
    (
        CALLS_TABLE,
        """    start DateTime64(9, 'UTC'),
    trace_key UInt64,
    provider LowCardinality(String),
    model LowCardinality(String),
    attempts Int64,
    failed_attempts Int64,
    throttled_attempts Int64,
    backoff_ns Int64,
    tokens Int64,
    sync Bool,
    start_ns Int64,
    end_ns Int64,
    failed_calls Int64,
    input_tokens Int64,
    output_tokens Int64,
    cached_tokens Int64,
    streamed_calls Int64,
    ttft_ns Nullable(Int64),
    cached_calls Int64""",
        "(provider, model, start)",
        "cityHash64(provider, model)",
    ),
    (
        TAIL_WALKS_TABLE,
        """    start DateTime64(9, 'UTC'),
    trace_key UInt64,
    trace_id String,
    llm_ns Int64,
    span_key Array(UInt64),
    critical_ns Array(Int64),
    self_ns Array(Int64),
    class Array(LowCardinality(String)),
    span_name Array(String),
    provider Array(String),
    model Array(String)""",
        "(start, trace_key)",
        "trace_key",
    ),
    (
        JOB_SPANS_TABLE,
        """    start DateTime64(9, 'UTC'),
    role UInt8,
    job_key UInt64,
    queue LowCardinality(String),
    start_ns Int64,
    end_ns Int64,
    message_key UInt64,
    failed Bool,
    trace_key UInt64""",
        "(start, job_key)",
        "job_key",
    ),
    (
        WORKFLOW_SPANS_TABLE,
        """    start DateTime64(9, 'UTC'),
    trace_key UInt64,
    span_key UInt64,
    parent_key UInt64,
    name String,
    start_ns Int64,
    end_ns Int64,
    failed Bool,
    tokens Int64,
    resend Int64,
    extra_attempts Int64,
    wf_span_key UInt64,
    workflow LowCardinality(String),
    trace_id String""",
        "(workflow, start, trace_key)",
        "trace_key",
    ),
    (
        EVALUATIONS_TABLE,
        """    start DateTime64(9, 'UTC'),
    trace_key UInt64,
    flag LowCardinality(String),
    variant LowCardinality(String),
    at_ns Int64""",
        "(start, trace_key)",
        "trace_key",
    ),
)

_REQUEST_COLUMNS = _TABLES[0][1]

# Per (minute, service, operation, version): its requests, their weights, synchronous LLM calls and
# first start, and the duration from which up every one of them is in the top-requests table (rows
# exactly as the requests table's): a window's p99 and tail read those few rows and these counts.
_TOP_TABLES: tuple[tuple[str, str, str, str], ...] = (
    (
        REQUEST_MINUTES_TABLE,
        """    start DateTime64(9, 'UTC'),
    service LowCardinality(String),
    operation LowCardinality(String),
    version LowCardinality(String),
    requests UInt64,
    weight_max Float64,
    weight_min Float64,
    sync_llm_calls UInt64,
    first_start DateTime64(9, 'UTC'),
    threshold_ms Float64""",
        "(service, operation, start)",
        "cityHash64(service, operation)",
    ),
    (TOP_REQUESTS_TABLE, _REQUEST_COLUMNS, "(service, operation, start)", "cityHash64(service, operation)"),
    # Per (minute, provider, model, path): the logical LLM calls and their sums.
    (
        CALL_MINUTES_TABLE,
        """    start DateTime64(9, 'UTC'),
    provider LowCardinality(String),
    model LowCardinality(String),
    sync Bool,
    calls Int64,
    attempts Int64,
    failed_attempts Int64,
    throttled_attempts Int64,
    backoff_ns Int64,
    tokens Int64,
    failed_calls Int64,
    input_tokens Int64,
    output_tokens Int64,
    cached_tokens Int64,
    streamed_calls Int64,
    cached_calls Int64""",
        "(provider, model, start)",
        "cityHash64(provider, model)",
    ),
)

# The per-minute aggregates (analytics.aggregates): per (minute, service, operation, version), the
# requests' counts and weights and two histograms — latency in log buckets (analytics.sketch) and
# the abandonment buckets of ``bucket_ms``, and the latency without the synchronous LLM calls per
# number of those calls — each as parallel arrays that ARRAY JOIN and GROUP BY merge.
_AGG_TABLES: tuple[tuple[str, str, str, str], ...] = (
    (
        AGG_REQUESTS_TABLE,
        """    start DateTime64(9, 'UTC'),
    service LowCardinality(String),
    operation LowCardinality(String),
    version LowCardinality(String),
    bucket_ms UInt32,
    requests UInt64,
    weight Float64,
    weight_sq Float64,
    weight_min Float64,
    weight_max Float64,
    sync_llm_calls Float64,
    abandoned Float64,
    lat_bucket Array(Int16),
    lat_weight Array(Float64),
    lat_n Array(UInt64),
    ab_bucket Array(Int64),
    ab_weight Array(Float64),
    ab_weight_sq Array(Float64),
    ab_abandoned Array(Float64),
    ab_n Array(UInt64),
    cf_calls Array(UInt16),
    cf_bucket Array(Int16),
    cf_weight Array(Float64),
    cf_n Array(UInt64),
    first_byte Float64,
    streamed Float64,
    fb_bucket Array(Int16),
    fb_weight Array(Float64),
    fb_n Array(UInt64)""",
        "(service, operation, start)",
        "cityHash64(service, operation)",
    ),
)
# Per (minute a workflow run started, workflow, hop): retry amplification's sums
# (analytics.retries.retry_state); per (minute, workflow): its runs and the most retried one.
_AGG_WORKFLOW_TABLES: tuple[tuple[str, str, str, str], ...] = (
    (
        AGG_WORKFLOW_HOPS_TABLE,
        """    start DateTime64(9, 'UTC'),
    workflow LowCardinality(String),
    hop String,
    calls Int64,
    attempts Int64,
    tokens Int64,
    final_tokens Int64,
    offset_sum Float64""",
        "(workflow, start)",
        "cityHash64(workflow)",
    ),
    (
        AGG_WORKFLOW_RUNS_TABLE,
        """    start DateTime64(9, 'UTC'),
    workflow LowCardinality(String),
    runs Int64,
    best_retries Int64,
    best_start_ns Int64,
    best_trace_id String""",
        "(workflow, start)",
        "cityHash64(workflow)",
    ),
)

# The model calls' anatomy (analytics.llm_anatomy): per (minute, provider, model), one histogram per
# measure (time to first token, time per output token, input and output tokens, the duration-on-
# output-tokens fit), a row per bucket; a window's histograms are their sums.
_AGG_ANATOMY_TABLES: tuple[tuple[str, str, str, str], ...] = (
    (
        AGG_LLM_ANATOMY_TABLE,
        """    start DateTime64(9, 'UTC'),
    provider LowCardinality(String),
    model LowCardinality(String),
    measure LowCardinality(String),
    key Int32,
    n Int64""",
        "(provider, model, start, measure)",
        "cityHash64(provider, model)",
    ),
)

# What hot requests cost in model calls (analytics.request_costs): per (minute a request started,
# service, operation, version), Σw of the requests (provider and model ""), and per provider and
# model Σw of their synchronous calls and tokens.
_AGG_REQUEST_LLM_TABLES: tuple[tuple[str, str, str, str], ...] = (
    (
        AGG_REQUEST_LLM_TABLE,
        """    start DateTime64(9, 'UTC'),
    service LowCardinality(String),
    operation LowCardinality(String),
    version LowCardinality(String),
    provider LowCardinality(String),
    model LowCardinality(String),
    requests Float64,
    calls Float64,
    input_tokens Float64,
    output_tokens Float64,
    cached_tokens Float64""",
        "(service, operation, start)",
        "cityHash64(service, operation)",
    ),
)

# Whole hours pre-merged from their minutes (``start`` is the hour's): the record of each hour
# merged (written after its rows, removed before them: listed first, the order deletes go in), and
# the anatomy histograms.
_HOUR_TABLES: tuple[tuple[str, str, str, str], ...] = (
    (
        HOURS_TABLE,
        """    start DateTime64(9, 'UTC'),
    built_at DateTime64(3, 'UTC')""",
        "start",
        "toYYYYMMDD(start)",
    ),
    (AGG_LLM_ANATOMY_HOURS_TABLE, _AGG_ANATOMY_TABLES[0][1], *_AGG_ANATOMY_TABLES[0][2:]),
)
HOUR_TABLES: tuple[str, ...] = tuple(t[0] for t in _HOUR_TABLES)

SUMMARY_TABLES: tuple[str, ...] = tuple(
    t[0]
    for t in (
        *_TABLES,
        *_TOP_TABLES,
        *_AGG_TABLES,
        *_AGG_WORKFLOW_TABLES,
        *_AGG_ANATOMY_TABLES,
        *_AGG_REQUEST_LLM_TABLES,
    )
)


def _create(ctx: DDLContext, tables: tuple[tuple[str, str, str, str], ...]) -> list[str]:
    statements: list[str] = []
    for name, body, order, shard in tables:
        tail = f"PARTITION BY toYYYYMMDD(start)\nORDER BY {order}"
        statements += ctx.create_table(name, body, tail=tail, shard_key=shard)
    return statements


def summary_top_tables(ctx: DDLContext) -> list[str]:
    """The per-minute request counts, the top requests and the per-minute LLM-call totals (the
    analytics migration adding them)."""
    return _create(ctx, _TOP_TABLES)


def aggregate_tables(ctx: DDLContext) -> list[str]:
    """The per-minute aggregates (the analytics migration adding them)."""
    return _create(ctx, _AGG_TABLES)


def aggregate_workflow_tables(ctx: DDLContext) -> list[str]:
    """The workflow runs' per-minute aggregates (the analytics migration adding them)."""
    return _create(ctx, _AGG_WORKFLOW_TABLES)


def minutes_layer(ctx: DDLContext) -> list[str]:
    """Which layout each summarised minute was written with, and the digest of the span conventions
    it was reduced with: a minute summarised before the aggregates existed (layer 0), or with other
    conventions, is summarised again by the next build."""
    return [
        f"ALTER TABLE {ctx.name(MINUTES_TABLE)}{ctx.on_cluster} "
        "ADD COLUMN IF NOT EXISTS layer UInt8 DEFAULT 0, "
        "ADD COLUMN IF NOT EXISTS conventions String DEFAULT ''"
    ]


def failed_calls_column(ctx: DDLContext) -> list[str]:
    """The LLM calls that failed after their retries, per call and per minute (tables made before
    a 429 that was retried stopped counting as an error; fresh stores have the column from their
    creation). Minutes summarised before read 0 until a build summarises them again (layer 3)."""
    statements = []
    for table in (CALLS_TABLE, CALL_MINUTES_TABLE):
        # On a distributed cluster both the data table and the Distributed one in front of it.
        for target in dict.fromkeys((ctx.local(table), table)):
            statements.append(
                f"ALTER TABLE {ctx.name(target)}{ctx.on_cluster} "
                "ADD COLUMN IF NOT EXISTS failed_calls Int64 DEFAULT 0"
            )
    return statements


def _add_columns(ctx: DDLContext, columns: dict[str, tuple[str, ...]]) -> list[str]:
    """``ADD COLUMN IF NOT EXISTS`` for each table's columns; on a distributed cluster to both the
    data table and the Distributed one in front of it."""
    statements = []
    for table, added in columns.items():
        for target in dict.fromkeys((ctx.local(table), table)):
            statements.append(
                f"ALTER TABLE {ctx.name(target)}{ctx.on_cluster} "
                + ", ".join(f"ADD COLUMN IF NOT EXISTS {c}" for c in added)
            )
    return statements


def anatomy_columns(ctx: DDLContext) -> list[str]:
    """The calls' tokens, prompt cache, streaming and first token, per call and per minute (tables
    made before the anatomy; fresh stores have the columns from their creation). Minutes summarised
    before read 0 until a build summarises them again (layer 4)."""
    sums = (
        "input_tokens Int64",
        "output_tokens Int64",
        "cached_tokens Int64",
        "streamed_calls Int64",
        "cached_calls Int64",
    )
    columns = {CALLS_TABLE: (*sums, "ttft_ns Nullable(Int64)"), CALL_MINUTES_TABLE: sums}
    return _add_columns(ctx, columns)


def first_byte_columns(ctx: DDLContext) -> list[str]:
    """The requests' time to first byte and streaming, per request and in the per-minute aggregates
    (tables made before; fresh stores have the columns from their creation). Minutes summarised
    before read none until a build summarises them again (layer 5)."""
    columns = {
        REQUESTS_TABLE: ("first_byte_ms Nullable(Float64)", "streamed Bool DEFAULT false"),
        TOP_REQUESTS_TABLE: ("first_byte_ms Nullable(Float64)", "streamed Bool DEFAULT false"),
        AGG_REQUESTS_TABLE: (
            "first_byte Float64 DEFAULT 0",
            "streamed Float64 DEFAULT 0",
            "fb_bucket Array(Int16)",
            "fb_weight Array(Float64)",
            "fb_n Array(UInt64)",
        ),
    }
    return _add_columns(ctx, columns)


def anatomy_tables(ctx: DDLContext) -> list[str]:
    """The per-minute anatomy histograms (the analytics migration adding them)."""
    return _create(ctx, _AGG_ANATOMY_TABLES)


def request_llm_tables(ctx: DDLContext) -> list[str]:
    """The hot requests' per-minute model-call sums (the analytics migration adding them)."""
    return _create(ctx, _AGG_REQUEST_LLM_TABLES)


def hour_tables(ctx: DDLContext) -> list[str]:
    """The pre-merged hours and their record (the analytics migration adding them)."""
    return _create(ctx, _HOUR_TABLES)


def summary_tables(ctx: DDLContext) -> list[str]:
    """The summary tables (the analytics migration that adds them)."""
    statements = _create(ctx, _TABLES)
    minutes = """    minute DateTime('UTC'),
    spans UInt64,
    built_at DateTime64(3, 'UTC')"""
    # The latest build of a minute wins (readers also take argMax(spans, built_at)).
    statements += ctx.create_table(
        MINUTES_TABLE,
        minutes,
        tail="PARTITION BY toYYYYMMDD(minute)\nORDER BY minute",
        kind="ReplacingMergeTree",
        engine_args="built_at",
    )
    return statements
