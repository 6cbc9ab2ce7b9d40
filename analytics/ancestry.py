"""Which spans run below a cold-path boundary: the trace structure that tells queued work from the
request path.

Celery's instrumentation (by default), and any single-message consumer that parents its processing
span to the producer, puts the worker's spans in the request's trace: ``POST /chat`` (Server) →
``apply_async/summarise`` (Producer) → ``run/summarise`` (Consumer) → ``chat gpt-4o``. The model call
there is not on the request path — the request returned long before the worker ran. A span is on a
hot request's path only if it is reached from the hot root through parent links without passing a
boundary (a Consumer span, or a messaging ``process``/``receive`` span of any kind); everything
below a boundary is cold-path work of its job.

The LLM-span read returns the boundary spans and the candidate synchronous calls; only traces that
hold both need their structure, which the trace-spans pass reads with the tail and workflow traces
(:func:`analytics.trace_spans.fetch_trace_spans`).
"""

from __future__ import annotations

import polars as pl

__all__ = ["below_boundaries", "boundary_traces", "without_queued_calls"]

# Parent links followed down from a boundary; deeper chains are not real traces.
_MAX_DEPTH = 64


def boundary_traces(llm_spans: pl.DataFrame, hot_traces: pl.Series | None = None) -> pl.Series:
    """Trace keys holding both a boundary span and a candidate synchronous LLM call (from
    :func:`analytics.llm_spans.fetch_llm_spans`), among ``hot_traces`` when given (only a hot
    request's calls can be synchronous: a worker's own trace needs no walk). Pure."""
    boundaries = llm_spans.filter(pl.col("is_boundary")).select("trace_key").unique()
    if hot_traces is not None:
        boundaries = boundaries.filter(pl.col("trace_key").is_in(hot_traces.implode()))
    if boundaries.is_empty():
        return pl.Series("trace_key", [], dtype=pl.UInt64)
    candidates = llm_spans.filter(pl.col("sync")).select("trace_key").unique()
    return boundaries.join(candidates, on="trace_key", how="semi")["trace_key"]


def below_boundaries(structure: pl.DataFrame, boundary_keys: pl.Series) -> pl.Series:
    """``span_key`` of every boundary span and every span below one, from ``structure``
    (``span_key``, ``parent_key`` of the traces involved). Pure."""
    edges = structure.select("parent_key", "span_key").unique()
    frontier = boundary_keys.unique().rename("span_key")
    found = [frontier]
    for _ in range(_MAX_DEPTH):
        if frontier.is_empty():
            break
        children = edges.filter(pl.col("parent_key").is_in(frontier.implode()))["span_key"].unique()
        # A span already found ends its branch (a malformed trace may link in a cycle).
        frontier = children.filter(~children.is_in(pl.concat(found).implode()))
        found.append(frontier)
    return pl.concat(found).unique()


def without_queued_calls(
    llm_spans: pl.DataFrame, structure: pl.DataFrame, hot_traces: pl.Series | None = None
) -> pl.DataFrame:
    """``llm_spans`` with ``sync`` cleared for the LLM calls below a boundary span (in ``hot_traces``
    when given), the structure of their traces taken from ``structure`` (the trace-spans pass). Pure."""
    traces = boundary_traces(llm_spans, hot_traces)
    if traces.is_empty():
        return llm_spans
    seeds = llm_spans.filter(pl.col("is_boundary") & pl.col("trace_key").is_in(traces.implode()))["span_key"]
    part = structure.filter(pl.col("trace_key").is_in(traces.implode()))
    queued = below_boundaries(part, seeds)
    return llm_spans.with_columns(pl.col("sync") & ~pl.col("span_key").is_in(queued.implode()))
