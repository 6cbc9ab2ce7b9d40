"""LLM calls as they went over the wire: attempts, failures, 429s and backoff per call, and the
per-provider/model summary (Polars, pure).

The provider SDKs (OpenAI, Anthropic) retry 408/409/429/5xx inside one call: the instrumentation's
GenAI span (``chat gpt-4o``) is the logical call and every HTTP attempt is an HTTP client child of
it (``POST``), the throttled one carrying its 429 in ``http.status_code`` or
``http.response.status_code`` and status Error. No Python instrumentation writes
``http.request.resend_count``; the SDKs' ``x-stainless-retry-count`` header is used when request
headers are captured. So a call's attempts are its HTTP children (at least one, the span itself when
it has none, more when a retry number says attempts are missing), and its *backoff* is the time
between one attempt's end and the next one's start — waiting, not model latency.

A call *failed* when the user met the failure: its last span ended in error after every retry. A
call that got a 429 (or a 5xx) on an attempt and succeeded on a later one did not fail: its failed
and throttled attempts are counted apart (``failed_attempt_rate``: failed attempts other than 429s —
5xx, timeouts — per attempt; ``throttle_rate``: 429 attempts per attempt), never as errors.

An application may also call again after a call failed: same-name siblings of one parent are
attempts of one logical call only when the earlier one failed (or the later one carries a resend
count) and the later one starts after it ended. Successful sequential calls — an agent calling the
same model three times — are separate calls.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from analytics._common import Windows, empty
from analytics.llm_spans import LLM_SPANS_SCHEMA

__all__ = [
    "CALLS_SCHEMA",
    "LLM_CALLS_SCHEMA",
    "SIGNAL_COUNTS_SCHEMA",
    "SPAN_ATTEMPTS_SCHEMA",
    "calls_in_windows",
    "llm_call_rows",
    "llm_calls_summary",
    "logical_calls",
    "signal_counts",
    "span_attempts",
]

SPAN_ATTEMPTS_SCHEMA: dict[str, Any] = {
    "span_key": pl.UInt64,  # the LLM span
    "attempts": pl.Int64,
    "failed_attempts": pl.Int64,
    "throttled_attempts": pl.Int64,
    "backoff_ns": pl.Int64,
}

# One row per logical LLM call.
CALLS_SCHEMA: dict[str, Any] = {
    "trace_key": pl.UInt64,
    "window": pl.String,  # of the call's first span: "baseline", "current"
    "provider": pl.String,
    "model": pl.String,
    "attempts": pl.Int64,
    "failed_attempts": pl.Int64,
    "throttled_attempts": pl.Int64,
    "backoff_ns": pl.Int64,
    "tokens": pl.Int64,
    "sync": pl.Boolean,  # on a hot request's path
    "failed_calls": pl.Int64,  # 1 when the call failed after its retries (its last span in error)
    # The call's anatomy (analytics.llm_anatomy): input tokens (cached ones included), output
    # tokens, input tokens read from the prompt cache, 1 when it was streamed, and its time to first
    # token (null when no span of it records one).
    "input_tokens": pl.Int64,
    "output_tokens": pl.Int64,
    "cached_tokens": pl.Int64,
    "streamed_calls": pl.Int64,
    "ttft_ns": pl.Int64,
    "cached_calls": pl.Int64,  # 1 when a span of the call reports its cached input tokens (0 included)
}

LLM_CALLS_SCHEMA: dict[str, Any] = {
    "provider": pl.String,
    "model": pl.String,
    "calls": pl.Int64,
    "sync_calls": pl.Int64,
    "cold_calls": pl.Int64,
    "attempts": pl.Int64,
    "failed_attempts": pl.Int64,
    "throttled_attempts": pl.Int64,
    "failed_calls": pl.Int64,
    "error_rate": pl.Float64,  # calls failed after their retries / calls (what the user met)
    "failed_attempt_rate": pl.Float64,  # failed attempts but 429s (5xx, timeouts) / attempts
    "throttle_rate": pl.Float64,  # 429 attempts / attempts
    "retry_rate": pl.Float64,  # (attempts − calls) / calls
    "cold_share": pl.Float64,  # cold calls / calls
    "tokens": pl.Int64,
    "backoff_ms": pl.Float64,  # total time waited between attempts
}

SIGNAL_COUNTS_SCHEMA: dict[str, Any] = {
    "window": pl.String,
    "provider": pl.String,
    "model": pl.String,
    "calls": pl.Int64,
    "attempts": pl.Int64,
    "errors": pl.Int64,  # calls failed after their retries
    "failed_attempts": pl.Int64,  # failed attempts but 429s (5xx, timeouts)
    "throttled": pl.Int64,  # 429 attempts
    "retries": pl.Int64,  # attempts beyond the first of each call
    "cold": pl.Int64,  # calls off the request path
}


def span_attempts(llm_spans: pl.DataFrame) -> pl.DataFrame:
    """Per LLM span of :func:`analytics.llm_spans.fetch_llm_spans` (one row per span): its
    attempts, failed and 429 attempts, and the backoff between them (:data:`SPAN_ATTEMPTS_SCHEMA`).
    Pure."""
    llm = llm_spans.filter(pl.col("is_llm")).select("span_key", "errored", "throttled")
    if llm.is_empty():
        return empty(SPAN_ATTEMPTS_SCHEMA)
    wire = (
        llm_spans.filter(pl.col("is_attempt"))
        .sort("parent_key", "start_ns")
        .with_columns(
            pl.when(pl.col("parent_key") == pl.col("parent_key").shift(1))
            .then(pl.col("end_ns").shift(1))
            .alias("previous_end")
        )
        .group_by("parent_key")
        .agg(
            pl.len().cast(pl.Int64).alias("children"),
            pl.col("errored").sum().cast(pl.Int64).alias("failed_children"),
            pl.col("throttled").sum().cast(pl.Int64).alias("throttled_children"),
            pl.col("resend").max().cast(pl.Int64).alias("highest_retry"),
            (pl.col("start_ns") - pl.col("previous_end"))
            .clip(lower_bound=0)
            .sum()
            .cast(pl.Int64)
            .alias("gaps"),
        )
    )
    joined = llm.join(wire, left_on="span_key", right_on="parent_key", how="left")
    children = pl.col("children").fill_null(0)
    attempts = pl.max_horizontal(pl.lit(1, pl.Int64), children, pl.col("highest_retry").fill_null(-1) + 1)
    return joined.select(
        "span_key",
        attempts.alias("attempts"),
        # Attempts a retry number says happened but no span shows failed too: a retry follows a failure.
        pl.when(children > 0)
        .then(pl.col("failed_children") + attempts - children)
        .otherwise(pl.col("errored").cast(pl.Int64) + attempts - 1)
        .alias("failed_attempts"),
        pl.when(children > 0)
        .then(pl.col("throttled_children"))
        .otherwise(pl.col("throttled").cast(pl.Int64))
        .alias("throttled_attempts"),
        pl.col("gaps").fill_null(0).alias("backoff_ns"),
    ).cast(pl.Schema(SPAN_ATTEMPTS_SCHEMA))


def _one_span_per_instrumented_call(spans: pl.DataFrame) -> pl.DataFrame:
    """Two instrumentations on one call (Traceloop's ``anthropic.chat`` beside the Anthropic SDK's
    own ``anthropic.messages.create``) leave two LLM spans of one provider and model, under one
    parent, over the same time, with different names. Such a group is one call: the span with the
    most attempts (the one the HTTP attempts sit under) stands for it, with the group's largest
    token count. Same-name spans running in parallel are separate calls (an application fanning
    out), and so are overlapping calls to different models."""
    # Only spans sharing a parent can be mirrors: the rest (most of them) skip the sort. Sorted by
    # parent and start, "the previous span" is the previous row when the parent matches: shifts over
    # the whole frame instead of window functions over hundreds of thousands of tiny groups (those
    # cost seconds at a million spans).
    shared = pl.col("parent_key").is_duplicated()
    siblings = spans.filter(shared).sort("parent_key", "start_ns", "end_ns")
    if siblings.is_empty():
        return spans
    previous_model = pl.col("model").shift(1)
    overlaps = (
        (pl.col("parent_key") == pl.col("parent_key").shift(1))
        & (pl.col("provider") == pl.col("provider").shift(1))
        & (pl.col("start_ns") < pl.col("end_ns").shift(1))
        & (pl.col("call_key") != pl.col("call_key").shift(1))
        # Parallel calls to two models are two calls; a mirror names the same model (or none).
        & ((pl.col("model") == previous_model) | (pl.col("model") == "") | (previous_model == ""))
    )
    siblings = siblings.with_columns((~overlaps.fill_null(False)).cast(pl.Int64).cum_sum().alias("_mirror"))
    # Only the groups of two or more spans are mirrors (a few, if any): the rest stay as they are.
    mirrored = pl.col("_mirror").is_duplicated()
    groups = siblings.filter(mirrored)
    if groups.is_empty():
        return spans
    kept = (
        groups.with_columns(
            pl.col(
                "tokens",
                "input_tokens",
                "output_tokens",
                "cached_tokens",
                "ttft_ns",
                "streamed",
                "reports_cache",
            )
            .max()
            .over("_mirror")
        )
        .sort("attempts", "start_ns", descending=[True, False], nulls_last=True)
        .unique(subset="_mirror", keep="first", maintain_order=False)
        .drop("_mirror")
    )
    return pl.concat([spans.filter(~shared), siblings.filter(~mirrored).drop("_mirror"), kept])


def logical_calls(llm_spans: pl.DataFrame, attempts: pl.DataFrame, hot_traces: pl.Series) -> pl.DataFrame:
    """One row per logical LLM call, wherever it starts: ``trace_key``, ``start_ns`` (its first
    span's), ``end_ns`` (its last span's end) and the :data:`CALLS_SCHEMA` counts but ``window``,
    from the LLM spans (one row per span, ``sync`` final), their :func:`span_attempts`, and the
    trace keys of hot-path requests.
    A call's provider and model are the first non-empty ones of its spans (OpenInference leaves
    the model off a call that failed). Pure."""
    # Span frames built before the anatomy columns existed (a caller's own) read as calls without it.
    anatomy = {
        "input_tokens": 0,
        "output_tokens": 0,
        "cached_tokens": 0,
        "ttft_ns": None,
        "streamed": False,
        "reports_cache": False,
    }
    spans = llm_spans.filter(pl.col("is_llm")).with_columns(
        pl.lit(v, LLM_SPANS_SCHEMA[k]).alias(k) for k, v in anatomy.items() if k not in llm_spans.columns
    )
    columns = {k: v for k, v in CALLS_SCHEMA.items() if k != "window"} | {
        "start_ns": pl.Int64,
        "end_ns": pl.Int64,
    }
    if spans.is_empty():
        return empty(columns)
    spans = _one_span_per_instrumented_call(
        spans.select(
            "trace_key",
            "span_key",
            "parent_key",
            "call_key",
            "start_ns",
            "end_ns",
            pl.col("provider").cast(pl.String),
            pl.col("model").cast(pl.String),
            "errored",
            "resend",
            "tokens",
            "input_tokens",
            "output_tokens",
            "cached_tokens",
            "ttft_ns",
            "streamed",
            "reports_cache",
            (pl.col("sync") & pl.col("trace_key").is_in(hot_traces.implode())).alias("sync"),
        ).join(attempts, on="span_key", how="left")
    )
    # A call of one span needs no grouping (most calls): only repeated call keys are sorted and cut
    # into calls. Sorted by call key and start, a row continues the call of the row before it.
    repeated = pl.col("call_key").is_duplicated()
    single = spans.filter(~repeated).select(
        "trace_key",
        "start_ns",
        "end_ns",
        "provider",
        "model",
        pl.col("attempts").alias("seen_attempts"),
        "failed_attempts",
        "throttled_attempts",
        "backoff_ns",
        "tokens",
        "sync",
        "resend",
        pl.col("errored").cast(pl.Int64).alias("failed_calls"),
        "input_tokens",
        "output_tokens",
        "cached_tokens",
        pl.col("streamed").cast(pl.Int64).alias("streamed_calls"),
        "ttft_ns",
        pl.col("reports_cache").cast(pl.Int64).alias("cached_calls"),
    )
    multi = spans.filter(repeated).sort("call_key", "start_ns")
    retries_previous = (
        (pl.col("call_key") == pl.col("call_key").shift(1))
        & (pl.col("errored").shift(1) | (pl.col("resend") > 0))
        & (pl.col("start_ns") >= pl.col("end_ns").shift(1))
    )
    grouped = (
        multi.with_columns((~retries_previous.fill_null(False)).cast(pl.Int64).cum_sum().alias("call_no"))
        .group_by("call_no")
        .agg(
            pl.col("trace_key").first(),
            pl.col("start_ns").first(),
            pl.col("end_ns").max(),
            pl.col("provider").filter(pl.col("provider") != "").first().fill_null(""),
            pl.col("model").filter(pl.col("model") != "").first().fill_null(""),
            pl.col("attempts").sum().alias("seen_attempts"),
            pl.col("failed_attempts").sum(),
            pl.col("throttled_attempts").sum(),
            pl.col("backoff_ns").sum(),
            pl.col("tokens").sum(),
            pl.col("sync").first(),
            pl.col("resend").max(),
            # Sorted by start: the last span is the attempt whose outcome the user met.
            pl.col("errored").last().cast(pl.Int64).alias("failed_calls"),
            pl.col("input_tokens").sum(),
            pl.col("output_tokens").sum(),
            pl.col("cached_tokens").sum(),
            pl.col("streamed").any().cast(pl.Int64).alias("streamed_calls"),
            # The attempt that answered: the last span's first token (retries before it are backoff).
            pl.col("ttft_ns").last(),
            pl.col("reports_cache").any().cast(pl.Int64).alias("cached_calls"),
        )
        .select(single.columns)
    )
    return (
        pl.concat([single, grouped.cast(pl.Schema(single.schema))])
        # A span's resend count says how many attempts came before it, exported or not; the ones not
        # exported failed (a resend follows a failure).
        .with_columns(pl.max_horizontal("seen_attempts", pl.col("resend") + 1).alias("attempts"))
        .with_columns(pl.col("failed_attempts") + pl.col("attempts") - pl.col("seen_attempts"))
        .select(list(columns))
        .cast(pl.Schema(columns))
    )


def llm_call_rows(
    llm_spans: pl.DataFrame, attempts: pl.DataFrame, hot_traces: pl.Series, windows: Windows
) -> pl.DataFrame:
    """One row per logical LLM call started in the baseline or current window
    (:data:`CALLS_SCHEMA`): :func:`logical_calls` by the window their first span starts in. Pure."""
    return calls_in_windows(logical_calls(llm_spans, attempts, hot_traces), windows)


def calls_in_windows(calls: pl.DataFrame, windows: Windows, keep: tuple[str, ...] = ()) -> pl.DataFrame:
    """The :func:`logical_calls` that start in the baseline or current window, labelled
    (:data:`CALLS_SCHEMA`, and the columns ``keep`` of ``calls``). Pure."""
    start = pl.col("start_ns")
    current = (start >= pl.lit(windows.start).dt.epoch("ns")) & (start < pl.lit(windows.end).dt.epoch("ns"))
    baseline = (start >= pl.lit(windows.baseline_start).dt.epoch("ns")) & (
        start < pl.lit(windows.baseline_end).dt.epoch("ns")
    )
    return (
        calls.filter(current | baseline)
        .with_columns(pl.when(current).then(pl.lit("current")).otherwise(pl.lit("baseline")).alias("window"))
        .select(*CALLS_SCHEMA, *keep)
        .cast(pl.Schema(CALLS_SCHEMA))
    )


def _counted(calls: pl.DataFrame) -> pl.DataFrame:
    """``calls``: the calls each row stands for — one per row of :func:`llm_call_rows`, more per
    row of an aggregate (the summaries' totals per window, provider, model and path)."""
    if "calls" in calls.columns:
        return calls.with_columns(pl.col("calls").cast(pl.Int64))
    return calls.with_columns(pl.lit(1, pl.Int64).alias("calls"))


def _failed_not_throttled() -> pl.Expr:
    """A row's failed attempts that were not 429s (5xx, timeouts): a 429 attempt is a failed one
    too (status Error), so it is taken out; a source counting them apart cannot go below 0."""
    return (pl.col("failed_attempts") - pl.col("throttled_attempts")).clip(lower_bound=0)


def signal_counts(calls: pl.DataFrame) -> pl.DataFrame:
    """Per (window, provider, model): calls, calls failed after their retries, attempts, failed
    attempts but 429s, 429 attempts, retries and calls off the request path
    (:data:`SIGNAL_COUNTS_SCHEMA`), from :func:`llm_call_rows`. Pure."""
    if calls.is_empty():
        return empty(SIGNAL_COUNTS_SCHEMA)
    n = pl.col("calls")
    return (
        _counted(calls)
        .group_by("window", "provider", "model")
        .agg(
            n.sum().alias("calls"),
            pl.col("attempts").sum(),
            pl.col("failed_calls").sum().alias("errors"),
            _failed_not_throttled().sum().alias("failed_attempts"),
            pl.col("throttled_attempts").sum().alias("throttled"),
            (pl.col("attempts").sum() - n.sum()).alias("retries"),
            n.filter(~pl.col("sync")).sum().alias("cold"),
        )
        .cast(pl.Schema(SIGNAL_COUNTS_SCHEMA))
        .select(list(SIGNAL_COUNTS_SCHEMA))
    )


def llm_calls_summary(calls: pl.DataFrame) -> pl.DataFrame:
    """Per (provider, model) of the current window: calls on and off the request path, attempts,
    the rate of calls failed after their retries, of failed (not 429) attempts, of 429 attempts
    and of retries, tokens and backoff (:data:`LLM_CALLS_SCHEMA`). Pure."""
    current = calls.filter(pl.col("window") == "current")
    if current.is_empty():
        return empty(LLM_CALLS_SCHEMA)
    n = pl.col("calls")
    return (
        _counted(current)
        .group_by("provider", "model")
        .agg(
            n.sum().cast(pl.Int64).alias("calls"),
            n.filter(pl.col("sync")).sum().cast(pl.Int64).alias("sync_calls"),
            pl.col("attempts").sum(),
            pl.col("failed_attempts").sum(),
            _failed_not_throttled().sum().alias("_failed_not_throttled"),
            pl.col("throttled_attempts").sum(),
            pl.col("failed_calls").sum(),
            pl.col("tokens").sum(),
            (pl.col("backoff_ns").sum() / 1e6).alias("backoff_ms"),
        )
        .with_columns(
            (pl.col("calls") - pl.col("sync_calls")).alias("cold_calls"),
            (pl.col("failed_calls") / pl.col("calls")).alias("error_rate"),
            (pl.col("_failed_not_throttled") / pl.col("attempts")).alias("failed_attempt_rate"),
            (pl.col("throttled_attempts") / pl.col("attempts")).alias("throttle_rate"),
            ((pl.col("attempts") - pl.col("calls")) / pl.col("calls")).alias("retry_rate"),
        )
        .with_columns((pl.col("cold_calls") / pl.col("calls")).alias("cold_share"))
        .sort("provider", "model")
        .cast(pl.Schema(LLM_CALLS_SCHEMA))
        .select(list(LLM_CALLS_SCHEMA))
    )
