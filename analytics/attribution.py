"""Attribution of a hot-path tail change to LLM spans or to internal spans, on the critical path.

For each (service, operation) the p99 of the baseline and the current window are compared. The *tail
traces* of a window are its requests at or above that window's p99 (at most ``max_tail_traces``, the
slowest). Their spans are fetched (deduplicated in SQL) and each trace's **critical path** is
computed as Jaeger's UI does it after Uber's CRISP: from the root, follow the last-finishing child;
the parent owns the time after that child ended; then continue with the child that finished last
before the current one started, and so on; gaps with no child running belong to the parent.
Children overflowing their parent are clipped to it, children wholly outside are dropped, and
Consumer children (queued work parented to its producer) are pruned as non-blocking. Every
nanosecond of the root's duration is owned by exactly one span.

Classes: a span is ``llm`` when it is an LLM span (see :mod:`analytics.conventions`) or lies below
one — an LLM client's HTTP child is still the model's time — and its time is credited to that LLM
span's name, provider and model. Every other span is ``internal``; so is the *own* time of
structure spans (workflow, in-process agent, tool): time a workflow or tool span owns on the
critical path is time no model call was running — orchestration, parsing, waiting in our code —
while whatever runs inside them is credited to the spans that ran.

Per class, the mean critical-path time per tail trace is compared between the windows:
``llm_delta_ms`` and ``internal_delta_ms`` are those changes (they sum to the change in mean tail
latency). When the p99 rose, ``llm_share`` and ``internal_share`` split it in proportion to the
positive parts of the two changes (summing to 1). ``verdict``: ``none`` when the p99 rose less than
``attribution_min_delta_ms`` or a window has fewer than ``attribution_min_requests`` requests;
``llm`` / ``internal`` when that side's share is at least ``attribution_dominance``; else ``mixed``.

With parallel LLM calls the slowest one gets the critical-path credit; the others only matter as far
as they are on the path.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import polars as pl

from analytics._common import Windows, empty, first_of_each
from analytics.conventions import (
    Conventions,
)
from analytics.llm_spans import fetch_llm_spans, fetch_roots
from analytics.trace_spans import TRACE_SPANS_SCHEMA
from collectors.store import Store

__all__ = [
    "ATTRIBUTION_SCHEMA",
    "ATTRIBUTION_SPANS_SCHEMA",
    "CRITICAL_PATH_SCHEMA",
    "LLM_SIGNALS_SCHEMA",
    "TAIL_SPANS_SCHEMA",
    "attribute",
    "critical_path",
    "fetch_llm_signals",
    "llm_signal_counts",
    "llm_signals",
    "tail_spans",
    "tail_traces",
]

# The columns of analytics.trace_spans the critical path reads.
TAIL_SPANS_SCHEMA: dict[str, Any] = {
    name: TRACE_SPANS_SCHEMA[name]
    for name in (
        "trace_key",
        "trace_id",
        "span_key",
        "parent_key",
        "name",
        "kind",
        "start_ns",
        "end_ns",
        "is_llm",
        "provider",
        "model",
    )
}

CRITICAL_PATH_SCHEMA: dict[str, Any] = {
    "trace_key": pl.UInt64,
    "span_key": pl.UInt64,
    "critical_ns": pl.Int64,
    "self_ns": pl.Int64,
    "class": pl.String,
    "span_name": pl.String,
    "provider": pl.String,
    "model": pl.String,
}

ATTRIBUTION_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "baseline_p99_ms": pl.Float64,
    "current_p99_ms": pl.Float64,
    "delta_ms": pl.Float64,
    "llm_share": pl.Float64,
    "internal_share": pl.Float64,
    "verdict": pl.String,
    "llm_delta_ms": pl.Float64,
    "internal_delta_ms": pl.Float64,
    "baseline_requests": pl.Int64,
    "current_requests": pl.Int64,
    "exemplar_trace_ids": pl.List(pl.String),
}

ATTRIBUTION_SPANS_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "span_name": pl.String,
    "class": pl.String,
    "provider": pl.String,
    "model": pl.String,
    "delta_ms": pl.Float64,
}

LLM_SIGNALS_SCHEMA: dict[str, Any] = {
    "service": pl.String,
    "operation": pl.String,
    "provider": pl.String,
    "model": pl.String,
    "error_rate_baseline": pl.Float64,
    "error_rate_current": pl.Float64,
    "throttle_rate_baseline": pl.Float64,
    "throttle_rate_current": pl.Float64,
    "retry_rate_baseline": pl.Float64,
    "retry_rate_current": pl.Float64,
    "cold_share_baseline": pl.Float64,
    "cold_share_current": pl.Float64,
}

_KEYS = ["service", "operation"]


# --- tail selection (pure) ------------------------------------------------------------------


def tail_traces(requests: pl.DataFrame, conventions: Conventions) -> pl.DataFrame:
    """Requests at or above their window's p99 (per operation), the slowest ``max_tail_traces``."""
    # trace_id rides along when the caller has it (tests, tools); analyze() maps keys to ids later.
    cols = ["service", "operation", "window", "trace_key", "duration_ms", "start"]
    cols += ["trace_id"] if "trace_id" in requests.columns else []
    if requests.is_empty():
        return requests.select(cols)
    threshold = pl.col("duration_ms").quantile(conventions.tail_quantile, interpolation="linear")
    return (
        requests.filter(pl.col("duration_ms") >= threshold.over("service", "operation", "window"))
        .sort("duration_ms", descending=True)
        .group_by("service", "operation", "window", maintain_order=True)
        .head(conventions.max_tail_traces)
        .select(cols)
    )


# --- SQL: spans of the tail traces -------------------------------------------------------------


def tail_spans(trace_spans: pl.DataFrame) -> pl.DataFrame:
    """The columns the critical path reads, from :func:`analytics.trace_spans.fetch_trace_spans`."""
    return trace_spans.select(list(TAIL_SPANS_SCHEMA))


# --- critical path (pure) ----------------------------------------------------------------------


def _trace_critical_path(rows: list[tuple[Any, ...]]) -> Iterable[tuple[Any, ...]]:
    """rows: (span_key, parent_key, name, kind, start, end, is_llm, provider, model) of one trace."""
    by_key = {r[0]: r for r in rows}
    children: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    roots = []
    for r in rows:
        if r[1] and r[1] in by_key and r[1] != r[0]:
            children[r[1]].append(r)
        else:
            roots.append(r)
    if not roots:
        return []
    # The request's root: the earliest parentless span, the longest on ties.
    root = min(roots, key=lambda r: (r[4], -(r[5] - r[4])))
    credit: dict[int, int] = defaultdict(int)

    def walk(span: tuple[Any, ...], lo: int, hi: int) -> None:
        t = hi
        kids = []
        for c in children.get(span[0], ()):
            if c[3] == "Consumer":
                continue  # queued work parented to its producer does not block the request
            cs, ce = max(c[4], lo), min(c[5], hi)
            if ce <= cs:
                continue
            kids.append((ce, cs, c))
        kids.sort(key=lambda k: (k[0], k[1]), reverse=True)
        for ce, cs, child in kids:
            if t <= lo:
                break
            if ce > t:
                continue  # ran in parallel with the critical child: not on the path
            credit[span[0]] += t - ce
            walk(child, cs, ce)
            t = cs
        if t > lo:
            credit[span[0]] += t - lo

    walk(root, root[4], root[5])

    # Self time: duration minus the union of child intervals clamped to the span.
    out = []
    # Class and label inheritance, top-down: the nearest LLM ancestor-or-self names the time.
    stack: list[tuple[tuple[Any, ...], tuple[Any, ...] | None]] = [(root, None)]
    while stack:
        span, llm_owner = stack.pop()
        owner = span if span[6] else llm_owner
        intervals = sorted((max(c[4], span[4]), min(c[5], span[5])) for c in children.get(span[0], ()))
        covered, cur_s, cur_e = 0, None, None
        for s, e in intervals:
            if e <= s:
                continue
            if cur_e is None or s > cur_e:
                if cur_e is not None and cur_s is not None:
                    covered += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        if cur_e is not None and cur_s is not None:
            covered += cur_e - cur_s
        self_ns = max(0, (span[5] - span[4]) - covered)
        label = owner if owner is not None else span
        out.append(
            (
                span[0],
                credit.get(span[0], 0),
                self_ns,
                "llm" if owner is not None else "internal",
                label[2],
                label[7] if owner is not None else "",
                label[8] if owner is not None else "",
            )
        )
        for c in children.get(span[0], ()):
            stack.append((c, owner))
    return out


def critical_path(spans: pl.DataFrame) -> pl.DataFrame:
    """Per span of each trace: critical-path time, self time, class and the label its time goes to.

    Only spans reachable from the trace's root through parent links appear. Pure.
    """
    if spans.is_empty():
        return empty(CRITICAL_PATH_SCHEMA)
    rows: list[tuple[Any, ...]] = []
    # The order _trace_critical_path reads, after the trace key: the tail-span columns but the id.
    cols = [c for c in TAIL_SPANS_SCHEMA if c != "trace_id"]
    # One sorted pass instead of a frame per trace: per-group frames cost more than the walk itself.
    current: int | None = None
    group: list[tuple[Any, ...]] = []
    for row in spans.select(cols).sort("trace_key").iter_rows():
        if row[0] != current:
            if group and current is not None:
                rows.extend((current, *r) for r in _trace_critical_path(group))
            current, group = row[0], []
        group.append(row[1:])
    if group and current is not None:
        rows.extend((current, *r) for r in _trace_critical_path(group))
    return pl.DataFrame(rows, schema=CRITICAL_PATH_SCHEMA, orient="row")


# --- attribution (pure) ------------------------------------------------------------------------


def attribute(
    requests: pl.DataFrame, tails: pl.DataFrame, path: pl.DataFrame, conventions: Conventions
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(attribution, attribution_spans) from the requests of both windows, the tail traces and the
    critical path of those traces. Pure."""
    current_ops = requests.filter(pl.col("window") == "current").select(_KEYS).unique()
    if current_ops.is_empty():
        return empty(ATTRIBUTION_SCHEMA), empty(ATTRIBUTION_SPANS_SCHEMA)
    stats = (
        requests.group_by(*_KEYS, "window")
        .agg(
            pl.len().cast(pl.Int64).alias("n"),
            pl.col("duration_ms").quantile(conventions.tail_quantile, interpolation="linear").alias("p99"),
        )
        .pivot(on="window", index=_KEYS, values=["n", "p99"])
    )
    for col in ("n_current", "n_baseline", "p99_current", "p99_baseline"):
        if col not in stats.columns:
            stats = stats.with_columns(pl.lit(None, dtype=pl.Float64).alias(col))
    stats = current_ops.join(stats, on=_KEYS, how="left")

    n_tail = tails.group_by(*_KEYS, "window").agg(pl.len().alias("n_tail"))
    credited = (
        path.join(tails.select(*_KEYS, "window", "trace_key"), on="trace_key", how="inner")
        .group_by(*_KEYS, "window", "span_name", "class", "provider", "model")
        .agg(pl.col("critical_ns").sum())
        .join(n_tail, on=[*_KEYS, "window"], how="left")
        .with_columns((pl.col("critical_ns") / pl.col("n_tail") / 1e6).alias("mean_ms"))
    )
    label = [*_KEYS, "span_name", "class", "provider", "model"]
    per_span = (
        credited.pivot(on="window", index=label, values="mean_ms")
        if not credited.is_empty()
        else pl.DataFrame(schema={**{k: pl.String for k in label}})
    )
    for col in ("current", "baseline"):
        if col not in per_span.columns:
            per_span = per_span.with_columns(pl.lit(0.0).alias(col))
    per_span = per_span.with_columns(
        (pl.col("current").fill_null(0.0) - pl.col("baseline").fill_null(0.0)).alias("delta_ms")
    )
    by_class = per_span.group_by(*_KEYS).agg(
        pl.col("delta_ms").filter(pl.col("class") == "llm").sum().alias("llm_delta_ms"),
        pl.col("delta_ms").filter(pl.col("class") == "internal").sum().alias("internal_delta_ms"),
    )
    exemplars = (
        tails.filter(pl.col("window") == "current")
        .sort("duration_ms", descending=True)
        .group_by(*_KEYS, maintain_order=True)
        .agg(pl.col("trace_id").head(conventions.exemplars).alias("exemplar_trace_ids"))
    )
    frame = (
        stats.join(by_class, on=_KEYS, how="left")
        .join(exemplars, on=_KEYS, how="left")
        .with_columns(
            pl.col("llm_delta_ms").fill_null(0.0),
            pl.col("internal_delta_ms").fill_null(0.0),
            pl.col("exemplar_trace_ids").fill_null([]),
            (pl.col("p99_current") - pl.col("p99_baseline")).alias("delta_ms"),
        )
    )
    rows = []
    for r in frame.iter_rows(named=True):
        delta = r["delta_ms"]
        llm_pos, int_pos = max(r["llm_delta_ms"], 0.0), max(r["internal_delta_ms"], 0.0)
        llm_share = internal_share = 0.0
        if delta is not None and delta > 0 and llm_pos + int_pos > 0:
            llm_share = llm_pos / (llm_pos + int_pos)
            internal_share = 1.0 - llm_share
        enough = (r["n_current"] or 0) >= conventions.attribution_min_requests and (
            r["n_baseline"] or 0
        ) >= conventions.attribution_min_requests
        if (
            delta is None
            or not enough
            or delta < conventions.attribution_min_delta_ms
            or llm_pos + int_pos == 0
        ):
            verdict = "none"
        elif llm_share >= conventions.attribution_dominance:
            verdict = "llm"
        elif internal_share >= conventions.attribution_dominance:
            verdict = "internal"
        else:
            verdict = "mixed"
        rows.append(
            {
                "service": r["service"],
                "operation": r["operation"],
                "baseline_p99_ms": r["p99_baseline"],
                "current_p99_ms": r["p99_current"],
                "delta_ms": delta,
                "llm_share": llm_share,
                "internal_share": internal_share,
                "verdict": verdict,
                "llm_delta_ms": r["llm_delta_ms"],
                "internal_delta_ms": r["internal_delta_ms"],
                "baseline_requests": int(r["n_baseline"] or 0),
                "current_requests": int(r["n_current"] or 0),
                "exemplar_trace_ids": list(r["exemplar_trace_ids"] or []),
            }
        )
    attribution = pl.DataFrame(rows, schema=ATTRIBUTION_SCHEMA).sort(*_KEYS)
    spans_out = (
        per_span.with_columns(pl.col("delta_ms").abs().alias("_abs"))
        .filter(pl.col("_abs") > 0)
        .sort("_abs", descending=True)
        .group_by(*_KEYS, maintain_order=True)
        .head(conventions.top_spans)
        .sort([*_KEYS, "delta_ms"], descending=[False, False, True])
        .select(list(ATTRIBUTION_SPANS_SCHEMA))
        if not per_span.is_empty()
        else empty(ATTRIBUTION_SPANS_SCHEMA)
    )
    return attribution, spans_out.cast(pl.Schema(ATTRIBUTION_SPANS_SCHEMA))


# --- LLM-side signals ---------------------------------------------------------------------------


_SIGNAL_COUNTS_SCHEMA: dict[str, Any] = {
    "window": pl.String,
    "provider": pl.String,
    "model": pl.String,
    "calls": pl.Int64,
    "errors": pl.Int64,
    "throttled": pl.Int64,
    "retries": pl.Int64,
    "cold": pl.Int64,
}


def llm_signal_counts(llm_spans: pl.DataFrame, roots: pl.DataFrame, windows: Windows) -> pl.DataFrame:
    """Per (window, provider, model): LLM spans, errors, 429s, retries and spans from cold-path work,
    from :func:`analytics.llm_spans.fetch_llm_spans` (one row per span) and the hot-path roots of
    :func:`analytics.llm_spans.fetch_roots`. Pure.

    Retries are the attempts beyond the first of each logical call (spans − distinct (trace, parent,
    name) calls) or the spans carrying a resend count, whichever is larger. A span belongs to the
    window it starts in; it is cold-path work when it is marked cold or its trace has no hot-path root.
    """
    start = pl.col("start_ns")
    window = (
        pl.when(
            (start >= pl.lit(windows.start).dt.epoch("ns")) & (start < pl.lit(windows.end).dt.epoch("ns"))
        )
        .then(pl.lit("current"))
        .when(
            (start >= pl.lit(windows.baseline_start).dt.epoch("ns"))
            & (start < pl.lit(windows.baseline_end).dt.epoch("ns"))
        )
        .then(pl.lit("baseline"))
    )
    counts = (
        llm_spans.filter(pl.col("is_llm"))
        .with_columns(window.alias("window"))
        .filter(pl.col("window").is_not_null())
        .with_columns(pl.col("trace_key").is_in(roots["trace_key"].implode()).alias("hot"))
        .group_by("window", "provider", "model")
        .agg(
            pl.len().alias("calls"),
            pl.col("errored").sum().alias("errors"),
            pl.col("throttled").sum(),
            pl.max_horizontal(pl.len() - pl.col("call_key").n_unique(), (pl.col("resend") > 0).sum()).alias(
                "retries"
            ),
            (pl.col("cold_marked") | ~pl.col("hot")).sum().alias("cold"),
        )
    )
    return counts.cast(pl.Schema(_SIGNAL_COUNTS_SCHEMA)).select(list(_SIGNAL_COUNTS_SCHEMA))


def fetch_llm_signals(
    store: Store, pairs: pl.DataFrame, windows: Windows, conventions: Conventions
) -> pl.DataFrame:
    """:func:`llm_signal_counts` for the (provider, model) pairs in ``pairs``, read from the store."""
    if pairs.is_empty():
        return empty(_SIGNAL_COUNTS_SCHEMA)
    counts = llm_signal_counts(
        first_of_each(fetch_llm_spans(store, windows, conventions), "span_key"),
        fetch_roots(store, windows, conventions),
        windows,
    )
    return counts.join(pairs.select("provider", "model").unique(), on=["provider", "model"], how="semi")


def llm_causes(attribution: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """(service, operation, provider, model) of LLM spans that grew, for operations whose verdict
    involves the LLM side. Pure."""
    suspects = attribution.filter(pl.col("verdict").is_in(["llm", "mixed"])).select(_KEYS)
    return (
        spans.filter((pl.col("class") == "llm") & (pl.col("delta_ms") > 0))
        .join(suspects, on=_KEYS, how="inner")
        .select(*_KEYS, "provider", "model")
        .unique()
        .sort(*_KEYS, "provider", "model")
    )


def llm_signals(causes: pl.DataFrame, counts: pl.DataFrame) -> pl.DataFrame:
    """Per cause: error, 429, retry rates and cold-path share of calls, baseline and current. Pure."""
    if causes.is_empty():
        return empty(LLM_SIGNALS_SCHEMA)
    rates = counts.with_columns(
        (pl.col("errors") / pl.col("calls")).alias("error_rate"),
        (pl.col("throttled") / pl.col("calls")).alias("throttle_rate"),
        (pl.col("retries") / pl.col("calls")).alias("retry_rate"),
        (pl.col("cold") / pl.col("calls")).alias("cold_share"),
    )
    out = causes
    for window in ("baseline", "current"):
        part = rates.filter(pl.col("window") == window).select(
            "provider",
            "model",
            *[
                pl.col(m).alias(f"{m}_{window}")
                for m in ("error_rate", "throttle_rate", "retry_rate", "cold_share")
            ],
        )
        out = out.join(part, on=["provider", "model"], how="left")
    return out.select(list(LLM_SIGNALS_SCHEMA)).cast(pl.Schema(LLM_SIGNALS_SCHEMA))
