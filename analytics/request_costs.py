"""What a hot request costs in model calls: tokens and USD per request, per version, and the step at
each release (Polars, pure).

A request's model cost is the sum over its synchronous model calls (the logical calls on its request
path, :mod:`analytics.llm_calls`) of each call's tokens at its model's price
(:func:`analytics.llm_anatomy.call_cost`: uncached input, cached input and output tokens at the
configured USD per million). Cost is linear in tokens, so the cost of a group of requests is the
price of its summed tokens per model, and the mergeable state is those sums:

=====================  =====================================================================
state                  merges by
=====================  =====================================================================
``requests``           sum — Σw of the requests (a row per group with empty provider and model)
``calls``              sum — Σw·(synchronous calls) per provider and model
``input_tokens`` …     sum — Σw·(input, output, cached input tokens) per provider and model
=====================  =====================================================================

per (minute, service, operation, version) in ``tailwatch_agg_request_llm``
(:mod:`analytics.summaries`), and per (window, service, operation, version) when read. A group whose
calls touch a model without a price has no cost (null, never 0); a group without calls costs 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import polars as pl

from analytics._common import empty
from analytics.conventions import Price
from analytics.llm_anatomy import call_cost, price_of

__all__ = [
    "LLM_COSTS_SCHEMA",
    "REQUEST_LLM_STATE_SCHEMA",
    "llm_costs",
    "request_llm_state",
    "with_release_costs",
]

_KEYS = ["service", "operation", "version"]
_SUMS = ["requests", "calls", "input_tokens", "output_tokens", "cached_tokens"]

REQUEST_LLM_STATE_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "version": pl.String,
    "provider": pl.String,  # "" on the requests' own row
    "model": pl.String,
    **dict.fromkeys(_SUMS, pl.Float64),
}

LLM_COSTS_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "version": pl.String,  # "" on the row of the operation's every version
    "window": pl.String,  # "current" or "baseline"
    "requests": pl.Int64,
    "sync_llm_calls_per_request": pl.Float64,
    "llm_tokens_per_request": pl.Float64,  # input + output
    "cached_input_ratio": pl.Float64,  # cached input tokens / input tokens; null without input
    "llm_cost_per_request": pl.Float64,  # USD; null when a model of its calls has no price
    "llm_cost_per_day": pl.Float64,
}


def request_llm_state(
    requests: pl.DataFrame, calls: pl.DataFrame, group: Sequence[pl.Expr] = ()
) -> pl.DataFrame:
    """:data:`REQUEST_LLM_STATE_SCHEMA` (plus the ``group`` columns, computed on the request rows)
    of ``requests`` (``trace_key``, ``service``, ``operation``, ``version``, ``weight``) and their
    logical ``calls`` (``trace_key``, ``sync``, ``provider``, ``model``, ``input_tokens``,
    ``output_tokens``, ``cached_tokens``): each request's synchronous calls, weighted by the
    requests its root stands for. Pure."""
    names = [e.meta.output_name() for e in group]
    # The keys keep their type (categorical from analyze()) until grouped: a string per request
    # row of a long raw window costs more than the rest of this together.
    rows = requests.select(
        "trace_key",
        *_KEYS,
        pl.col("weight").fill_null(1.0).alias("w")
        if "weight" in requests.columns
        else pl.lit(1.0).alias("w"),
        *group,
    )
    keys = [*names, *_KEYS]
    own = rows.group_by(keys).agg(pl.col("w").sum().alias("requests"))
    own = own.with_columns(
        pl.lit("").alias("provider"),
        pl.lit("").alias("model"),
        *(pl.lit(0.0).alias(c) for c in _SUMS[1:]),
    )
    sync = calls.filter(pl.col("sync")).select(
        "trace_key", "provider", "model", "input_tokens", "output_tokens", "cached_tokens"
    )
    joined = rows.join(sync, on="trace_key", how="inner")
    w = pl.col("w")
    per_model = joined.group_by(*keys, "provider", "model").agg(
        pl.lit(0.0).alias("requests"),
        w.sum().alias("calls"),
        *(
            (w * pl.col(c).cast(pl.Float64)).sum().alias(c)
            for c in ("input_tokens", "output_tokens", "cached_tokens")
        ),
    )
    columns = [*names, *REQUEST_LLM_STATE_SCHEMA]
    strings = pl.col(*_KEYS, "provider", "model").cast(pl.String)
    return pl.concat(
        [own.with_columns(strings).select(columns), per_model.with_columns(strings).select(columns)],
        how="vertical_relaxed",
    )


def llm_costs(
    state: pl.DataFrame, prices: Sequence[Price], window_lengths: dict[str, timedelta]
) -> pl.DataFrame:
    """:data:`LLM_COSTS_SCHEMA` from merged state with a ``window`` column: per window, service,
    operation and version, and per window, service and operation (``version`` ""), the requests, their
    synchronous calls, tokens and cost per request, and the cost per day (over the window's length
    in ``window_lengths``). Pure."""
    if state.is_empty():
        return empty(LLM_COSTS_SCHEMA)
    every = state.with_columns(pl.lit("").alias("version"))
    both = pl.concat([state.select(every.columns), every])
    merged = both.group_by("window", *_KEYS, "provider", "model").agg(pl.col(*_SUMS).sum())
    rows = []
    for (window, service, operation, version), g in merged.group_by("window", *_KEYS, maintain_order=True):
        requests = float(g["requests"].sum())
        if requests <= 0:
            continue
        calls = g.filter(pl.col("provider") != "")
        cost: float | None = 0.0
        for provider, model, inputs, outputs, cached in calls.select(
            "provider", "model", "input_tokens", "output_tokens", "cached_tokens"
        ).iter_rows():
            part = call_cost(price_of(prices, provider, model), inputs, outputs, cached)
            cost = None if part is None or cost is None else cost + part
        inputs = float(calls["input_tokens"].sum())
        days = window_lengths[str(window)] / timedelta(days=1)
        rows.append(
            {
                "service": service,
                "operation": operation,
                "version": version,
                "window": window,
                "requests": round(requests),
                "sync_llm_calls_per_request": float(calls["calls"].sum()) / requests,
                "llm_tokens_per_request": (inputs + float(calls["output_tokens"].sum())) / requests,
                "cached_input_ratio": float(calls["cached_tokens"].sum()) / inputs if inputs > 0 else None,
                "llm_cost_per_request": None if cost is None else cost / requests,
                "llm_cost_per_day": None if cost is None or days <= 0 else cost / days,
            }
        )
    if not rows:
        return empty(LLM_COSTS_SCHEMA)
    return (
        pl.DataFrame(rows, schema=LLM_COSTS_SCHEMA)
        .sort("service", "operation", "version", "window")
        .select(list(LLM_COSTS_SCHEMA))
    )


def with_release_costs(releases: pl.DataFrame, costs: pl.DataFrame) -> pl.DataFrame:
    """The release rows with ``llm_cost_per_request_before``/``_after`` and
    ``llm_tokens_per_request_before``/``_after``: the released version's figures over the current
    window (after), the version released before it on the operation over both windows (before; the
    operation's baseline when it is the window's first release). Pure."""
    added = {
        "llm_cost_per_request_before": pl.Float64,
        "llm_cost_per_request_after": pl.Float64,
        "llm_tokens_per_request_before": pl.Float64,
        "llm_tokens_per_request_after": pl.Float64,
    }
    if releases.is_empty() or costs.is_empty():
        return releases.with_columns(pl.lit(None, t).alias(c) for c, t in added.items())
    per_version = costs.filter(pl.col("version") != "")
    out = []
    for r in releases.sort("service", "operation", "released_at").iter_rows(named=True):
        mine = per_version.filter(
            (pl.col("service") == r["service"])
            & (pl.col("operation") == r["operation"])
            & (pl.col("version") == r["version"])
            & (pl.col("window") == "current")
        )
        earlier = releases.filter(
            (pl.col("service") == r["service"])
            & (pl.col("operation") == r["operation"])
            & (pl.col("released_at") < r["released_at"])
        ).sort("released_at")
        if earlier.height:
            prior = per_version.filter(
                (pl.col("service") == r["service"])
                & (pl.col("operation") == r["operation"])
                & (pl.col("version") == earlier["version"][-1])
            )
            # The previous version over both windows: its requests summed, not its two averages.
            before = _pooled(prior)
        else:
            before = _pooled(
                costs.filter(
                    (pl.col("service") == r["service"])
                    & (pl.col("operation") == r["operation"])
                    & (pl.col("version") == "")
                    & (pl.col("window") == "baseline")
                )
            )
        after = _pooled(mine)
        out.append(
            {
                **r,
                "llm_cost_per_request_before": before[0],
                "llm_cost_per_request_after": after[0],
                "llm_tokens_per_request_before": before[1],
                "llm_tokens_per_request_after": after[1],
            }
        )
    schema: dict[str, Any] = {**releases.schema, **added}
    return pl.DataFrame(out, schema=schema).select(list(schema))


def _pooled(rows: pl.DataFrame) -> tuple[float | None, float | None]:
    """(cost, tokens) per request over ``rows`` of :data:`LLM_COSTS_SCHEMA` pooled by requests."""
    if rows.is_empty() or rows["requests"].sum() <= 0:
        return None, None
    n = rows["requests"].cast(pl.Float64)
    tokens = float((rows["llm_tokens_per_request"] * n).sum()) / float(n.sum())
    if rows["llm_cost_per_request"].is_null().any():
        return None, tokens
    return float((rows["llm_cost_per_request"] * n).sum()) / float(n.sum()), tokens
