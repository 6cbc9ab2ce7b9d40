"""Slices of a migration: the hot requests split by a feature flag's variant (or any configured
attribute), each variant against the flag's control.

A request takes a flag's variant from its trace: a span carrying the flag key and variant as
attributes (``feature_flag.key``, ``feature_flag.result.variant``), or a flag-evaluation span event
on any span (``feature_flag.evaluation``, the older ``feature_flag``) — the first evaluation of each
flag in the trace wins. Attributes named in ``Conventions.slice_attributes`` split requests the same
way, the attribute's name standing for the flag and its value for the variant.

Per variant: requests, exact p50/p99 (linear interpolation), abandonment rate with its 95% Wilson
interval, synchronous LLM calls per request and, for the work its requests enqueued, the cold
path's enqueue-to-ready p99 (the jobs whose producer sits in one of the variant's traces: what
its users wait for instead). Against the control: the p99 and abandonment deltas; the p99 move is
significant as a release step is (:func:`analytics.releases.p99_step_significance`), the
abandonment move when Newcombe's interval of the difference excludes 0 with at least
``min_release_requests`` requests a side and |Δ| ≥ ``slice_min_abandonment_delta``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from analytics._common import Windows, empty, normalize
from analytics.conventions import FLAG_KEY, FLAG_VARIANT, Conventions
from analytics.releases import p99_step_significance
from analytics.stats import proportion_delta_interval, wilson_interval
from collectors import TRACES_TABLE, inspect_traces, json_first, json_lookups
from storage import Store

__all__ = [
    "FLAG_EVALUATIONS_SCHEMA",
    "SLICES_SCHEMA",
    "control_variant",
    "fetch_flag_evaluations",
    "flag_evaluations_sql",
    "slices",
]

FLAG_EVALUATIONS_SCHEMA: dict[str, Any] = {
    "trace_key": pl.UInt64,  # cityHash64(TraceId)
    "flag": pl.String,
    "variant": pl.String,
    "at_ns": pl.Int64,  # when it was evaluated (the span's start for attributes)
}

SLICES_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "flag": pl.String,
    "control": pl.String,
    "variant": pl.String,
    "is_control": pl.Boolean,
    "requests": pl.Int64,
    "p50_ms": pl.Float64,
    "p99_ms": pl.Float64,
    "abandonment_rate": pl.Float64,
    "abandonment_rate_low": pl.Float64,
    "abandonment_rate_high": pl.Float64,
    "sync_llm_calls_per_request": pl.Float64,
    "cold_p99_s": pl.Float64,  # null when the variant's requests enqueued nothing that completed
    "p99_delta_ms": pl.Float64,  # null for the control
    "abandonment_delta": pl.Float64,  # null for the control
    "significant": pl.Boolean,  # p99 or abandonment moved significantly; null for the control
    # Beyond the interface: which of the two moved, and how many jobs the cold p99 is over.
    "p99_significant": pl.Boolean,
    "abandonment_significant": pl.Boolean,
    "cold_jobs": pl.Int64,
}

_EVENT_FLAG = "arrayFirst(v -> v != '', arrayMap(k -> e.2[k], {cv_flag_key_attrs:Array(String)}))"
_EVENT_VARIANT = "arrayFirst(v -> v != '', arrayMap(k -> e.2[k], {cv_flag_variant_attrs:Array(String)}))"
_SLICE_ATTRS = (
    "arrayMap(k -> (k, SpanAttributes.values[indexOf(SpanAttributes.keys, k)], {ts}), "
    "arrayFilter(k -> has(SpanAttributes.keys, k), {{cv_slice_attrs:Array(String)}}))"
)


_JSON_EVENT_FLAG = json_first("e.2", "cv_flag_key_attrs")
_JSON_EVENT_VARIANT = json_first("e.2", "cv_flag_variant_attrs")
_JSON_SLICE_ATTRS = (
    "arrayFilter(x -> x.2 != '', ["
    + ", ".join(f"({k}, {v}, {{ts}})" for k, v in json_lookups("SpanAttributes", "cv_slice_attrs"))
    + "])"
)


def flag_evaluations_sql(table: str, *, json: bool = False) -> str:
    """Every flag evaluation of spans started in the current window or its margin: one row per
    (span, flag) from the span's attributes, the configured slice attributes and its evaluation
    events. PREWHERE reads the attribute keys and event names only, so the maps and events of
    spans without a flag are never decompressed. ``json``: the table's attribute columns are JSON
    (:class:`collectors.TracesLayout`), whose paths are looked up one constant at a time; the
    remaining Map idioms are rewritten by :meth:`collectors.TracesLayout.adapt`."""
    ts = "toUnixTimestamp64Nano(Timestamp)"
    event_flag, event_variant = (
        (_JSON_EVENT_FLAG, _JSON_EVENT_VARIANT) if json else (_EVENT_FLAG, _EVENT_VARIANT)
    )
    slice_attrs = _JSON_SLICE_ATTRS.replace("{ts}", ts) if json else _SLICE_ATTRS.format(ts=ts)
    return f"""
SELECT cityHash64(TraceId) AS trace_key, ev.1 AS flag, ev.2 AS variant, ev.3 AS at_ns,
       toUnixTimestamp64Nano(Timestamp) AS span_ns
FROM {table}
ARRAY JOIN arrayConcat(
    if(hasAny(SpanAttributes.keys, {{cv_flag_key_attrs:Array(String)}}),
       [({FLAG_KEY}, {FLAG_VARIANT}, {ts})], []),
    {slice_attrs},
    arrayMap(e -> ({event_flag}, {event_variant}, toUnixTimestamp64Nano(e.3)),
             arrayFilter(e -> has({{cv_flag_events:Array(String)}}, e.1),
                         arrayZip(`Events.Name`, `Events.Attributes`, `Events.Timestamp`)))
) AS ev
PREWHERE hasAny(SpanAttributes.keys, {{cv_flag_key_attrs:Array(String)}})
      OR hasAny(SpanAttributes.keys, {{cv_slice_attrs:Array(String)}})
      OR hasAny(`Events.Name`, {{cv_flag_events:Array(String)}})
WHERE Timestamp >= {{s:DateTime64(9)}} AND Timestamp < {{e_m:DateTime64(9)}} AND ev.1 != '' AND ev.2 != ''
"""


def fetch_flag_evaluations(
    store: Store, windows: Windows, conventions: Conventions, *, margin: bool = True
) -> pl.DataFrame:
    """Flag evaluations (:data:`FLAG_EVALUATIONS_SCHEMA`) of the current window's spans (and its
    trace margin unless ``margin`` is False), duplicates included (:func:`slices` keeps the first
    evaluation of each flag per trace), with ``span_ns``, the start of the span that carried it."""
    params = {**conventions.sql_parameters(), **windows.params(conventions)}
    if not margin:
        params["e_m"] = windows.end
    layout = inspect_traces(store)
    sql = layout.adapt(flag_evaluations_sql(store.table(TRACES_TABLE), json=layout.json))
    frame = store.query_polars(sql, params)
    schema = {**FLAG_EVALUATIONS_SCHEMA, "span_ns": pl.Int64}
    if frame.is_empty():
        return empty(schema)
    return normalize(frame).cast(pl.Schema(schema)).select(list(schema))


def control_variant(requests_by_variant: dict[str, int], conventions: Conventions) -> str:
    """The control among a flag's variants (name → requests): the first of
    ``slice_control_variants`` present (case-insensitive), else the variant with the most requests
    (the first by name on a tie)."""
    by_lower = {variant.lower(): variant for variant in sorted(requests_by_variant)}
    for name in conventions.slice_control_variants:
        if name.lower() in by_lower:
            return by_lower[name.lower()]
    return min(requests_by_variant, key=lambda v: (-requests_by_variant[v], v))


def _against_control(
    row: dict[str, Any],
    durations: np.ndarray,
    control: dict[str, Any],
    control_ms: np.ndarray,
    conv: Conventions,
) -> dict[str, Any]:
    p99_delta = row["p99_ms"] - control["p99_ms"]
    p99_significant, _, _ = p99_step_significance(control_ms, durations, conv, p99_delta, control["p99_ms"])
    abandonment_delta = row["abandonment_rate"] - control["abandonment_rate"]
    low, high = proportion_delta_interval(
        row["abandoned"], row["requests"], control["abandoned"], control["requests"]
    )
    enough = min(row["requests"], control["requests"]) >= conv.min_release_requests
    abandonment_significant = (
        enough
        and low is not None
        and high is not None
        and (low > 0 or high < 0)
        and abs(abandonment_delta) >= conv.slice_min_abandonment_delta
    )
    return {
        "p99_delta_ms": p99_delta,
        "abandonment_delta": abandonment_delta,
        "significant": p99_significant or abandonment_significant,
        "p99_significant": p99_significant,
        "abandonment_significant": abandonment_significant,
    }


def slices(
    requests: pl.DataFrame, evaluations: pl.DataFrame, jobs: pl.DataFrame, conventions: Conventions
) -> pl.DataFrame:
    """One row per (service, operation, flag, variant) (:data:`SLICES_SCHEMA`) from the current
    window's requests (``trace_key``, ``service``, ``operation``, ``duration_ms``, ``abandoned``,
    ``sync_llm_calls``), the flag evaluations (:data:`FLAG_EVALUATIONS_SCHEMA`) and the jobs of the
    cold path (:data:`analytics.cold_path.JOBS_SCHEMA`). Pure."""
    if requests.is_empty() or evaluations.is_empty():
        return empty(SLICES_SCHEMA)
    first = (
        evaluations.sort("at_ns")
        .unique(subset=["trace_key", "flag"], keep="first", maintain_order=True)
        .select("trace_key", "flag", "variant")
    )
    tagged = requests.select(
        "trace_key",
        pl.col("service").cast(pl.String),
        pl.col("operation").cast(pl.String),
        "duration_ms",
        "abandoned",
        "sync_llm_calls",
    ).join(first, on="trace_key", how="inner")
    if tagged.is_empty():
        return empty(SLICES_SCHEMA)
    keys = ["service", "operation", "flag", "variant"]
    per_variant = tagged.group_by(keys).agg(
        pl.len().cast(pl.Int64).alias("requests"),
        pl.col("duration_ms").quantile(0.5, interpolation="linear").alias("p50_ms"),
        pl.col("duration_ms").quantile(0.99, interpolation="linear").alias("p99_ms"),
        pl.col("abandoned").sum().cast(pl.Int64).alias("abandoned"),
        pl.col("sync_llm_calls").mean().alias("sync_llm_calls_per_request"),
        pl.col("duration_ms").alias("durations"),
    )
    cold = (
        tagged.select("trace_key", *keys)
        .unique()
        .join(jobs.select("trace_key", "enqueue_to_ready_s"), on="trace_key", how="inner")
        .group_by(keys)
        .agg(
            pl.len().cast(pl.Int64).alias("cold_jobs"),
            pl.col("enqueue_to_ready_s").quantile(0.99, interpolation="linear").alias("cold_p99_s"),
        )
    )
    per_variant = per_variant.join(cold, on=keys, how="left").with_columns(
        pl.col("cold_jobs").fill_null(0), (pl.col("abandoned") / pl.col("requests")).alias("abandonment_rate")
    )
    rows: list[dict[str, Any]] = []
    for (service, operation, flag), group in sorted(
        per_variant.partition_by("service", "operation", "flag", as_dict=True).items(), key=lambda kv: kv[0]
    ):
        variants = {r["variant"]: r for r in group.iter_rows(named=True)}
        control = control_variant({v: r["requests"] for v, r in variants.items()}, conventions)
        c = variants[control]
        control_ms = np.asarray(c["durations"], dtype=np.float64)
        for variant in sorted(variants, key=lambda v: (v != control, v)):
            r = variants[variant]
            low, high = wilson_interval(r["abandoned"], r["requests"])
            out = {
                "service": service,
                "operation": operation,
                "flag": flag,
                "control": control,
                "variant": variant,
                "is_control": variant == control,
                "requests": r["requests"],
                "p50_ms": r["p50_ms"],
                "p99_ms": r["p99_ms"],
                "abandonment_rate": r["abandonment_rate"],
                "abandonment_rate_low": low,
                "abandonment_rate_high": high,
                "sync_llm_calls_per_request": r["sync_llm_calls_per_request"],
                "cold_p99_s": r["cold_p99_s"],
                "cold_jobs": r["cold_jobs"],
                "p99_delta_ms": None,
                "abandonment_delta": None,
                "significant": None,
                "p99_significant": None,
                "abandonment_significant": None,
            }
            if variant != control:
                out |= _against_control(
                    r, np.asarray(r["durations"], dtype=np.float64), c, control_ms, conventions
                )
            rows.append(out)
    return pl.DataFrame(rows, schema=SLICES_SCHEMA)
