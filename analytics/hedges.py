"""Hedges already in the traces: a second request to the same provider/model sent while the first
still ran, both children of one parent span — what they won, saved and cost (SQL beside the Polars
metric code, which is pure).

**A hedge** is a pair of LLM spans with the same parent and provider/model, the *hedge* starting
after the *first* started and before it ended (each span of a sibling group is paired with the one
before it when they overlap). The hedge **wins** when it ends before the first. The request waited
for the earlier end, min(end₁, end₂); without the hedge it would have waited for end₁: **latency
saved** = end₁ − min(end₁, end₂) (0 when the first won). That is exact only when the loser ran to
its end; a loser cut short (cancelled, status Error) ends at the cut, so its pair's saving is not
known and is left out of ``latency_saved_ms`` (counted in ``losers_cut``). **Extra tokens** are
the losers' tokens over the winners'. Under the ``openai-v2`` instrumentation a cancelled loser
leaves no span at all (its span is never ended): such hedges are not seen here (docs/analytics.md).

Read: the LLM spans starting in the window's most recent ``exact_horizon`` whose sibling group (same
parent, provider and model) has at least two spans — nothing else comes back.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import polars as pl

from analytics._common import empty
from analytics.conventions import ERRORED, IS_LLM, MAYBE_LLM, MODEL, PROVIDER, TOKENS, Conventions
from collectors import TRACES_TABLE, inspect_traces
from storage import Store

__all__ = ["HEDGES_SCHEMA", "HEDGE_SPANS_SCHEMA", "existing_hedges", "fetch_hedge_spans", "hedge_spans_sql"]

HEDGE_SPANS_SCHEMA: dict[str, Any] = {
    "parent_key": pl.UInt64,  # cityHash64(TraceId, ParentSpanId)
    "service": pl.String,
    "provider": pl.String,
    "model": pl.String,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "tokens": pl.Int64,
    "errored": pl.Boolean,
}

HEDGES_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "provider": pl.String,
    "model": pl.String,
    "hedges": pl.Int64,  # pairs of overlapping sibling calls
    "wins": pl.Int64,  # the hedge ended first
    "win_rate": pl.Float64,
    "losers_cut": pl.Int64,  # the loser ended in error (cancelled, failed): its saving unknown
    "latency_saved_ms": pl.Float64,  # mean over the pairs whose loser ran to its end; null if none
    "extra_tokens_ratio": pl.Float64,  # losers' tokens / winners' tokens; null without tokens
}


def hedge_spans_sql(table: str) -> str:
    """The LLM spans starting in [{s}, {e}) with at least one sibling of the same provider/model,
    one row per span."""
    return f"""
SELECT parent_key, service, provider, model, start_ns, end_ns, tokens, errored
FROM (
    SELECT *, count() OVER (PARTITION BY parent_key, provider, model) AS siblings
    FROM (
        SELECT cityHash64(TraceId, SpanId) AS span_key, cityHash64(TraceId, ParentSpanId) AS parent_key,
               ServiceName AS service, {PROVIDER} AS provider, {MODEL} AS model,
               toUnixTimestamp64Nano(Timestamp) AS start_ns,
               toUnixTimestamp64Nano(Timestamp) + toInt64(Duration) AS end_ns,
               toInt64({TOKENS}) AS tokens, {ERRORED} AS errored
        FROM {table}
        PREWHERE {MAYBE_LLM}
        WHERE Timestamp >= {{s:DateTime64(9)}} AND Timestamp < {{e:DateTime64(9)}}
              AND ParentSpanId != '' AND {IS_LLM}
        LIMIT 1 BY span_key
    )
)
WHERE siblings >= 2
"""


def fetch_hedge_spans(store: Store, since: datetime, end: datetime, conventions: Conventions) -> pl.DataFrame:
    """:data:`HEDGE_SPANS_SCHEMA` rows of the spans starting in [since, end)."""
    sql = inspect_traces(store).adapt(hedge_spans_sql(store.table(TRACES_TABLE)))
    frame = store.query_polars(sql, {**conventions.sql_parameters(), "s": since, "e": end})
    if frame.is_empty():
        return empty(HEDGE_SPANS_SCHEMA)
    return frame.cast(pl.Schema(HEDGE_SPANS_SCHEMA)).select(list(HEDGE_SPANS_SCHEMA))


def existing_hedges(spans: pl.DataFrame) -> pl.DataFrame:
    """:data:`HEDGES_SCHEMA` per (service, provider, model) from :data:`HEDGE_SPANS_SCHEMA` rows.
    Pure."""
    group = ["parent_key", "provider", "model"]
    pairs = (
        spans.sort(*group, "start_ns", "end_ns")
        .with_columns(
            pl.col("end_ns").shift(1).over(group).alias("first_end"),
            pl.col("start_ns").shift(1).over(group).alias("first_start"),
            pl.col("tokens").shift(1).over(group).alias("first_tokens"),
            pl.col("errored").shift(1).over(group).alias("first_errored"),
        )
        .filter(pl.col("first_end").is_not_null() & (pl.col("start_ns") < pl.col("first_end")))
        .with_columns(
            (pl.col("end_ns") < pl.col("first_end")).alias("won"),
        )
        .with_columns(
            pl.when(pl.col("won")).then(pl.col("first_errored")).otherwise(pl.col("errored")).alias("cut"),
            pl.when(pl.col("won"))
            .then(pl.col("first_tokens"))
            .otherwise(pl.col("tokens"))
            .alias("lost_tokens"),
            pl.when(pl.col("won"))
            .then(pl.col("tokens"))
            .otherwise(pl.col("first_tokens"))
            .alias("won_tokens"),
            ((pl.col("first_end") - pl.min_horizontal("first_end", "end_ns")) / 1e6).alias("saved_ms"),
        )
    )
    if pairs.is_empty():
        return empty(HEDGES_SCHEMA)
    won_tokens = pl.col("won_tokens").fill_null(0).sum()
    return (
        pairs.group_by("service", "provider", "model")
        .agg(
            pl.len().cast(pl.Int64).alias("hedges"),
            pl.col("won").sum().cast(pl.Int64).alias("wins"),
            pl.col("cut").sum().cast(pl.Int64).alias("losers_cut"),
            pl.col("saved_ms").filter(~pl.col("cut")).mean().alias("latency_saved_ms"),
            pl.when(won_tokens > 0)
            .then(pl.col("lost_tokens").fill_null(0).sum() / won_tokens)
            .otherwise(None)
            .alias("extra_tokens_ratio"),
        )
        .with_columns((pl.col("wins") / pl.col("hedges")).alias("win_rate"))
        .sort("service", "provider", "model")
        .select(list(HEDGES_SCHEMA))
    )
