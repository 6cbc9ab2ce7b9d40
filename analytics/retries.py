"""Per-hop retry amplification of agent workflows.

A workflow is a trace containing a workflow span: ``gen_ai.operation.name`` ``invoke_workflow`` or
in-process ``invoke_agent``, Traceloop's ``traceloop.span.kind`` ``workflow``/``agent``, or
OpenInference's ``AGENT``/``CHAIN`` (the earliest such span is the workflow span; its name from
``gen_ai.workflow.name`` / ``gen_ai.agent.name`` / ``traceloop.workflow.name`` or the span name).
Its *hops* are the distinct names of the workflow span's direct children.

Same-name children of the workflow span are attempts of one logical call only when the earlier one
failed (error status, error type, HTTP status >= 400) or the later one carries a resend count, and
the later one starts after the earlier one ended: an agent calling the same model three times in a
row makes three calls. A call's attempts are its sibling spans plus the attempts the provider SDK
made inside them (each LLM span's HTTP attempts beyond the first, anywhere below:
:mod:`analytics.llm_calls`). An attempt's tokens are the usage (input + output, under any of the
conventions' names) of the attempt span and every span below it.

Per workflow: ``attempt_amplification`` = attempts / logical calls (observed),
``token_amplification`` = tokens of all attempts / tokens of the final attempts (observed), and
``modeled_amplification`` = ∏(1 + retry_rate of each hop) — the compounding model that holds when a
retry replays the work behind it (nested calls, re-sent context). Observed below modeled means the
hops' retries do not compound in this workflow; observed near modeled means they do.

``exemplar_trace_id`` is the run to open first: the trace of the workflow's most retried run
(attempts beyond its logical calls; ties → the run that started last), '' when no run was retried.
The id comes from the trace's root span, the one span whose id the trace-spans pass reads.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from analytics._common import Windows, empty
from analytics.conventions import Conventions
from analytics.llm_spans import fetch_llm_spans
from storage import Store

__all__ = [
    "RETRY_AMPLIFICATION_SCHEMA",
    "RETRY_HOPS_SCHEMA",
    "RETRY_HOP_STATE_SCHEMA",
    "RETRY_RUN_STATE_SCHEMA",
    "WORKFLOWS_SCHEMA",
    "WORKFLOW_SPANS_SCHEMA",
    "fetch_workflows",
    "retry_metrics",
    "retry_metrics_from_state",
    "retry_state",
    "with_baseline",
    "workflow_spans",
    "workflows_from_spans",
]

WORKFLOW_SPANS_SCHEMA: dict[str, Any] = {
    "trace_key": pl.UInt64,
    "span_key": pl.UInt64,  # cityHash64(TraceId, SpanId)
    "parent_key": pl.UInt64,  # cityHash64(TraceId, ParentSpanId): the parent's span_key
    "name": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "failed": pl.Boolean,
    "tokens": pl.Int64,
    "resend": pl.Int64,
    "extra_attempts": pl.Int64,  # an LLM span's SDK-internal attempts beyond the first
    "wf_span_key": pl.UInt64,  # span_key of the trace's workflow span
    "workflow": pl.String,
    "trace_id": pl.String,  # the trace's id on its root span, '' on the others
}

RETRY_HOPS_SCHEMA: dict[str, Any] = {
    "workflow": pl.String,
    "hop": pl.String,
    "hop_index": pl.Int64,
    "calls": pl.Int64,
    "attempts": pl.Int64,
    "retry_rate": pl.Float64,
    "tokens": pl.Int64,
}

RETRY_AMPLIFICATION_SCHEMA: dict[str, Any] = {
    "workflow": pl.String,
    "runs": pl.Int64,
    "attempt_amplification": pl.Float64,
    "token_amplification": pl.Float64,
    "modeled_amplification": pl.Float64,
    "exemplar_trace_id": pl.String,  # the most retried run ('' when none was retried)
    # The same workflow over the baseline window (null where it did not run then).
    "baseline_runs": pl.Int64,
    "baseline_attempt_amplification": pl.Float64,
    "baseline_token_amplification": pl.Float64,
}

_MAX_DEPTH = 64


WORKFLOWS_SCHEMA: dict[str, Any] = {
    "trace_key": pl.UInt64,
    "wf_span_key": pl.UInt64,
    "workflow": pl.String,
}


def workflows_from_spans(llm_spans: pl.DataFrame, windows: Windows) -> pl.DataFrame:
    """One row per trace whose workflow span (its earliest) started in [start, end)
    (:data:`WORKFLOWS_SCHEMA`), from the workflow spans of
    :func:`analytics.llm_spans.fetch_llm_spans` (duplicates change nothing). Pure."""
    start = pl.col("start_ns")
    spans = llm_spans.filter(
        pl.col("is_workflow")
        & (start >= pl.lit(windows.start).dt.epoch("ns"))
        & (start < pl.lit(windows.end).dt.epoch("ns"))
    )
    if spans.is_empty():
        return empty(WORKFLOWS_SCHEMA)
    return (
        spans.group_by("trace_key")
        .agg(
            pl.col("span_key").sort_by(start).first().alias("wf_span_key"),
            pl.col("workflow").cast(pl.String).sort_by(start).first(),
        )
        .cast(pl.Schema(WORKFLOWS_SCHEMA))
        .select(list(WORKFLOWS_SCHEMA))
    )


def fetch_workflows(store: Store, windows: Windows, conventions: Conventions) -> pl.DataFrame:
    """:func:`workflows_from_spans` over a read of the store."""
    return workflows_from_spans(fetch_llm_spans(store, windows, conventions), windows)


def workflow_spans(
    trace_spans: pl.DataFrame, workflows: pl.DataFrame, windows: Windows, conventions: Conventions
) -> pl.DataFrame:
    """The spans of the workflow traces (from :func:`analytics.trace_spans.fetch_trace_spans`) that
    start in [start, end + trace margin), with their workflow span and name. Pure."""
    lo = pl.lit(windows.start).dt.epoch("ns")
    hi = pl.lit(windows.end + conventions.trace_margin).dt.epoch("ns")
    return (
        trace_spans.filter((pl.col("start_ns") >= lo) & (pl.col("start_ns") < hi))
        .select(*(c for c in WORKFLOW_SPANS_SCHEMA if c in trace_spans.columns))
        .join(workflows, on="trace_key", how="inner")
        .select(list(WORKFLOW_SPANS_SCHEMA))
    )


def _attempt_totals(spans: pl.DataFrame, attempts: pl.DataFrame) -> pl.DataFrame:
    """Tokens and SDK-internal extra attempts of each attempt: its own plus its descendants', by
    walking parents up to the attempt. Ids are the 64-bit keys :func:`retry_metrics` gives them."""
    keys = attempts.select(pl.col("span").alias("cur"), pl.lit(True).alias("is_attempt"))
    parents = spans.select(pl.col("span").alias("cur"), pl.col("parent").alias("up"))
    pending = spans.filter((pl.col("tokens") > 0) | (pl.col("extra_attempts") > 0)).select(
        "tokens", "extra_attempts", pl.col("span").alias("cur")
    )
    owned: list[pl.DataFrame] = []
    for _ in range(_MAX_DEPTH):
        if pending.is_empty():
            break
        joined = pending.join(keys, on="cur", how="left")
        owned.append(
            joined.filter(pl.col("is_attempt")).select(
                pl.col("cur").alias("span"), "tokens", "extra_attempts"
            )
        )
        pending = (
            joined.filter(pl.col("is_attempt").is_null())
            .join(parents, on="cur", how="inner")
            .select("tokens", "extra_attempts", pl.col("up").alias("cur"))
        )
    if not owned:
        return pl.DataFrame(
            schema={"span": pl.UInt64, "attempt_tokens": pl.Int64, "inner_attempts": pl.Int64}
        )
    return (
        pl.concat(owned)
        .group_by("span")
        .agg(
            pl.col("tokens").sum().cast(pl.Int64).alias("attempt_tokens"),
            pl.col("extra_attempts").sum().cast(pl.Int64).alias("inner_attempts"),
        )
    )


def with_baseline(amplification: pl.DataFrame, baseline: pl.DataFrame) -> pl.DataFrame:
    """``amplification`` (of the current window) with each workflow's runs and amplifications over
    the baseline window, from ``baseline`` (:func:`retry_metrics` of the baseline's workflows). Pure."""
    base = baseline.select(
        "workflow",
        pl.col("runs").alias("baseline_runs"),
        pl.col("attempt_amplification").alias("baseline_attempt_amplification"),
        pl.col("token_amplification").alias("baseline_token_amplification"),
    )
    own = [c for c in RETRY_AMPLIFICATION_SCHEMA if not c.startswith("baseline_")]
    return (
        amplification.select(own)
        .join(base, on="workflow", how="left")
        .sort("workflow")
        .select(list(RETRY_AMPLIFICATION_SCHEMA))
    )


RETRY_HOP_STATE_SCHEMA: dict[str, Any] = {
    "workflow": pl.String,
    "hop": pl.String,
    "calls": pl.Int64,
    "attempts": pl.Int64,
    "tokens": pl.Int64,
    "final_tokens": pl.Int64,
    "offset_sum": pl.Float64,  # Σ of each call's offset from its run's first attempt (ns)
}
RETRY_RUN_STATE_SCHEMA: dict[str, Any] = {
    "workflow": pl.String,
    "runs": pl.Int64,
    # The most retried run (retries beyond its calls, then the latest start, then the smallest id):
    # what the exemplar is; retries 0 and id '' when none was retried or none has a known id.
    "best_retries": pl.Int64,
    "best_start_ns": pl.Int64,
    "best_trace_id": pl.String,
}


def retry_state(spans: pl.DataFrame, group: list[pl.Expr] | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The mergeable state of :func:`retry_metrics` (per hop: calls, attempts, tokens and offsets
    summed; per workflow: runs and the most retried run) from the spans of workflow traces, per
    ``group`` (expressions over the spans' columns, e.g. the minute the run started) besides the
    workflow. Pure."""
    extra = group or []
    names = [e.meta.output_name() for e in extra]
    # Only root spans carry the id: one row per trace that has one.
    trace_ids = (
        spans.filter(pl.col("trace_id") != "")
        .group_by(pl.col("trace_key").alias("trace"))
        .agg(pl.col("trace_id").first())
        if "trace_id" in spans.columns
        else pl.DataFrame(schema={"trace": pl.UInt64, "trace_id": pl.String})
    )
    # Joins and groups on the store's 64-bit keys and categorical names: a fraction of the cost of
    # hashing strings in every step.
    spans = spans.select(
        pl.col("trace_key").alias("trace"),
        pl.col("span_key").alias("span"),
        pl.col("parent_key").alias("parent"),
        (pl.col("parent_key") == pl.col("wf_span_key")).alias("is_attempt"),
        pl.col("name").cast(pl.Categorical),
        pl.col("workflow").cast(pl.Categorical),
        "start_ns",
        "end_ns",
        "failed",
        "tokens",
        "resend",
        "extra_attempts",
        *extra,
    )
    attempts = spans.filter(pl.col("is_attempt"))
    hop_schema = {**RETRY_HOP_STATE_SCHEMA, **{n: spans.schema[n] for n in names}}
    run_schema = {**RETRY_RUN_STATE_SCHEMA, **{n: spans.schema[n] for n in names}}
    if attempts.is_empty():
        return empty(hop_schema), empty(run_schema)
    attempts = (
        attempts.join(_attempt_totals(spans, attempts), on="span", how="left")
        .with_columns(pl.col("attempt_tokens", "inner_attempts").fill_null(0))
        .with_columns((pl.col("start_ns") - pl.col("start_ns").min().over("trace")).alias("offset_ns"))
        .sort("trace", "name", "start_ns")
    )
    # A sibling continues the call before it only after a failure (or when it says it is a resend).
    # Sorted by (trace, name, start): "the sibling before" is the row before with the same keys.
    same_hop = (pl.col("trace") == pl.col("trace").shift(1)) & (pl.col("name") == pl.col("name").shift(1))
    retries_previous = (
        same_hop
        & (pl.col("failed").shift(1) | (pl.col("resend") > 0))
        & (pl.col("start_ns") >= pl.col("end_ns").shift(1))
    )
    attempts = attempts.with_columns(
        (~retries_previous.fill_null(False)).cast(pl.Int64).cum_sum().alias("call_no")
    )
    calls = attempts.group_by("workflow", "trace", pl.col("name").alias("hop"), "call_no", *names).agg(
        (pl.len() + pl.col("inner_attempts").sum()).cast(pl.Int64).alias("attempts"),
        pl.col("attempt_tokens").sum().alias("tokens"),
        # The final attempt is the latest one to start.
        pl.col("attempt_tokens").sort_by("start_ns").last().alias("final_tokens"),
        pl.col("offset_ns").min().alias("offset_ns"),
        pl.col("start_ns").min(),
    )
    hops = calls.group_by("workflow", "hop", *names).agg(
        pl.len().cast(pl.Int64).alias("calls"),
        pl.col("attempts").sum().cast(pl.Int64),
        pl.col("tokens").sum().cast(pl.Int64),
        pl.col("final_tokens").sum().cast(pl.Int64),
        pl.col("offset_ns").cast(pl.Float64).sum().alias("offset_sum"),
    )
    per_run = (
        calls.group_by("workflow", "trace", *names)
        .agg((pl.col("attempts").sum() - pl.len()).alias("retries"), pl.col("start_ns").min())
        .join(trace_ids, on="trace", how="left")
    )
    runs = per_run.group_by("workflow", *names).agg(pl.len().cast(pl.Int64).alias("runs"))
    best = (
        per_run.filter((pl.col("retries") > 0) & pl.col("trace_id").is_not_null())
        .sort(["retries", "start_ns", "trace_id"], descending=[True, True, False])
        .group_by("workflow", *names, maintain_order=True)
        .agg(
            pl.col("retries").first().cast(pl.Int64).alias("best_retries"),
            pl.col("start_ns").first().alias("best_start_ns"),
            pl.col("trace_id").first().alias("best_trace_id"),
        )
    )
    run_state = runs.join(best, on=["workflow", *names], how="left").with_columns(
        pl.col("best_retries").fill_null(0),
        pl.col("best_start_ns").fill_null(0),
        pl.col("best_trace_id").fill_null(""),
    )
    return (
        hops.with_columns(pl.col("workflow", "hop").cast(pl.String))
        .select(list(hop_schema))
        .cast(pl.Schema(hop_schema)),
        run_state.with_columns(pl.col("workflow").cast(pl.String))
        .select(list(run_schema))
        .cast(pl.Schema(run_schema)),
    )


def retry_metrics(spans: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(retry_hops, retry_amplification) from the spans of workflow traces. Pure. Without a
    ``trace_id`` column every ``exemplar_trace_id`` is ''. The baseline columns are null (see
    :func:`with_baseline`)."""
    return retry_metrics_from_state(*retry_state(spans))


def retry_metrics_from_state(
    hop_state: pl.DataFrame, run_state: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(retry_hops, retry_amplification) from merged :func:`retry_state` (rows of several groups,
    e.g. minutes, add up). Pure."""
    if hop_state.is_empty():
        return empty(RETRY_HOPS_SCHEMA), empty(RETRY_AMPLIFICATION_SCHEMA)
    hops = (
        hop_state.group_by("workflow", "hop")
        .agg(pl.col("calls", "attempts", "tokens", "final_tokens", "offset_sum").sum())
        .with_columns(
            ((pl.col("attempts") - pl.col("calls")) / pl.col("calls")).alias("retry_rate"),
            (pl.col("offset_sum") / pl.col("calls")).alias("offset"),
        )
        # The hops in the order a run reaches them (mean offset), ties by name.
        .sort("workflow", "offset", "hop")
        .with_columns(pl.int_range(1, pl.len() + 1).over("workflow").cast(pl.Int64).alias("hop_index"))
    )
    runs = run_state.group_by("workflow").agg(pl.col("runs").sum())
    best = (
        run_state.filter(pl.col("best_retries") > 0)
        .sort(["best_retries", "best_start_ns", "best_trace_id"], descending=[True, True, False])
        .group_by("workflow", maintain_order=True)
        .agg(pl.col("best_trace_id").first())
    )
    run_counts = dict(runs.iter_rows())
    exemplars = dict(best.iter_rows())
    rows: list[dict[str, Any]] = []
    for (workflow,), group in hops.group_by("workflow", maintain_order=True):
        final_tokens = int(group["final_tokens"].sum())
        attempts_total, calls_total = int(group["attempts"].sum()), int(group["calls"].sum())
        tokens_total = int(group["tokens"].sum())
        rows.append(
            {
                "workflow": str(workflow),
                "runs": int(run_counts.get(workflow, 0)),
                "attempt_amplification": attempts_total / calls_total,
                "token_amplification": tokens_total / final_tokens if final_tokens else None,
                "modeled_amplification": math.prod(1.0 + r for r in group["retry_rate"].to_list()),
                "exemplar_trace_id": exemplars.get(workflow, ""),
                "baseline_runs": None,
                "baseline_attempt_amplification": None,
                "baseline_token_amplification": None,
            }
        )
    amplification = pl.DataFrame(rows, schema=RETRY_AMPLIFICATION_SCHEMA).sort("workflow")
    return hops.select(list(RETRY_HOPS_SCHEMA)).cast(pl.Schema(RETRY_HOPS_SCHEMA)), amplification
