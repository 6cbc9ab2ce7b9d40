"""Attribution of a hot-path tail change to LLM spans or to internal spans, on the critical path.

For each (service, operation) the p99 of the baseline and the current window are compared. The *tail
traces* of a window are its requests at or above that window's p99 (at most ``max_tail_traces``, the
slowest). Their spans are fetched (deduplicated in SQL) and each trace's **critical path** is
computed as Jaeger's UI does it after Uber's CRISP: from the root, follow the last-finishing child;
the parent owns the time after that child ended; then continue with the child that finished last
before the current one started, and so on; gaps with no child running belong to the parent.
Children overflowing their parent are clipped to it, children wholly outside are dropped, and
cold-path boundaries (Consumer children — queued work parented to its producer, as Celery does —
and messaging process/receive spans) are pruned as non-blocking. Every nanosecond of the root's
duration is owned by exactly one span.

Classes: a span is ``llm`` when it is an LLM span (see :mod:`analytics.conventions`) or lies below
one — an LLM client's HTTP child is still the model's time — and its time is credited to that LLM
span's name, provider and model — except the LLM span's own time between two of its HTTP attempts,
which is the SDK's retry backoff and is labelled ``retry backoff`` (still ``llm``: the provider's
429s caused it), so a slow provider and a throttling one read apart. Every other span is
``internal``; so is the *own* time of structure spans (workflow, in-process agent, tool): time a
workflow or tool span owns on the critical path is time no model call was running — orchestration,
parsing, waiting in our code — while whatever runs inside them is credited to the spans that ran.

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

import itertools
from typing import Any

import numpy as np
import polars as pl

from analytics._common import Windows, empty, first_of_each
from analytics.ancestry import boundary_traces, without_queued_calls
from analytics.conventions import (
    Conventions,
)
from analytics.hot_path import is_weighted, request_stats
from analytics.llm_calls import SIGNAL_COUNTS_SCHEMA, llm_call_rows, signal_counts, span_attempts
from analytics.llm_spans import fetch_llm_spans, fetch_roots
from analytics.trace_spans import TRACE_SPANS_SCHEMA, fetch_structure
from storage import Store

__all__ = [
    "ATTRIBUTION_SCHEMA",
    "ATTRIBUTION_SPANS_SCHEMA",
    "CRITICAL_PATH_SCHEMA",
    "LLM_SIGNALS_SCHEMA",
    "RETRY_BACKOFF",
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
        "is_boundary",
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
    "failed_attempt_rate_baseline": pl.Float64,
    "failed_attempt_rate_current": pl.Float64,
}

_KEYS = ["service", "operation"]

# The label of an LLM call's critical-path time spent waiting between its attempts.
RETRY_BACKOFF = "retry backoff"


# --- tail selection (pure) ------------------------------------------------------------------


def window_stats(requests: pl.DataFrame, conventions: Conventions) -> pl.DataFrame:
    """Per (service, operation, window): ``n`` requests and their ``p99`` (the ``tail_quantile``).
    In sampled data both are of the population the weights describe, as in the hot-path summary
    (:func:`analytics.hot_path.request_stats`): the weighted count, rounded, and the weighted
    percentile. Pure."""
    if not is_weighted(requests):
        return requests.group_by(*_KEYS, "window").agg(
            pl.len().cast(pl.Int64).alias("n"),
            pl.col("duration_ms").quantile(conventions.tail_quantile, interpolation="linear").alias("p99"),
        )
    stats = request_stats(
        requests, [*_KEYS, "window"], {"p99": conventions.tail_quantile}, conventions.min_sampled_tail
    )
    return stats.select(*_KEYS, "window", pl.col("requests").cast(pl.Int64).alias("n"), "p99")


def tail_traces(requests: pl.DataFrame, conventions: Conventions) -> pl.DataFrame:
    """Requests at or above their window's p99 (per operation), the slowest ``max_tail_traces``."""
    # trace_id rides along when the caller has it (tests, tools); analyze() maps keys to ids later.
    cols = ["service", "operation", "window", "trace_key", "duration_ms", "start"]
    cols += ["trace_id"] if "trace_id" in requests.columns else []
    if requests.is_empty():
        return requests.select(cols)
    if is_weighted(requests):
        # Sampled data: the tail starts at the p99 of the population the weights describe.
        thresholds = window_stats(requests, conventions).select(*_KEYS, "window", "p99")
        tail = requests.join(thresholds, on=[*_KEYS, "window"], how="left").filter(
            pl.col("duration_ms") >= pl.col("p99")
        )
    else:
        threshold = pl.col("duration_ms").quantile(conventions.tail_quantile, interpolation="linear")
        tail = requests.filter(pl.col("duration_ms") >= threshold.over("service", "operation", "window"))
    return (
        tail
        # Ties broken by trace: the chosen traces must not depend on the order the store returned rows.
        .sort(["duration_ms", "trace_key"], descending=[True, False])
        .group_by("service", "operation", "window", maintain_order=True)
        .head(conventions.max_tail_traces)
        .select(cols)
    )


# --- SQL: spans of the tail traces -------------------------------------------------------------


def tail_spans(trace_spans: pl.DataFrame) -> pl.DataFrame:
    """The columns the critical path reads, from :func:`analytics.trace_spans.fetch_trace_spans`."""
    return trace_spans.select(list(TAIL_SPANS_SCHEMA))


# --- critical path (pure) ----------------------------------------------------------------------


Span = tuple[Any, ...]


def _trace_critical_path(rows: list[Span]) -> list[Span]:
    """rows: (span_key, parent_key, name, kind, start, end, is_llm, provider, model, is_boundary) of one
    trace."""
    # Plain dicts and locals throughout: a tail trace has a handful of spans, so the walk's cost is
    # per-trace overhead (a quarter less than with defaultdicts and a key function per sort).
    by_key = {r[0]: r for r in rows}
    children: dict[int, list[Span]] = {}
    roots = []
    for r in rows:
        parent = r[1]
        if parent and parent != r[0] and parent in by_key:
            siblings = children.get(parent)
            if siblings is None:
                children[parent] = [r]
            else:
                siblings.append(r)
        else:
            roots.append(r)
    if not roots:
        return []
    # The request's root: the earliest parentless span, the longest on ties (the first of equals).
    root = roots[0]
    for r in roots[1:]:
        if r[4] < root[4] or (r[4] == root[4] and r[5] - r[4] > root[5] - root[4]):
            root = r
    credit: dict[int, int] = {}
    backoff: dict[int, int] = {}

    def walk(span: Span, lo: int, hi: int) -> None:
        # Backwards from the span's end: the child ending last (within [lo, hi)) is on the path, then
        # the child ending last before it started, and so on; the gaps are the span's own time.
        t = hi
        own = 0
        # An LLM span's time between two of its children (HTTP attempts) is the SDK's retry backoff.
        waited = 0
        kids = []
        for c in children.get(span[0], ()):
            if c[3] == "Consumer" or c[9]:
                continue  # queued work parented to its producer does not block the request
            cs = c[4] if c[4] > lo else lo
            ce = c[5] if c[5] < hi else hi
            if ce > cs:
                kids.append((ce, cs, c))
        if len(kids) > 1:
            kids.sort(key=lambda k: (k[0], k[1]), reverse=True)
        after_child = False
        for ce, cs, child in kids:
            if t <= lo:
                break
            if ce > t:
                continue  # ran in parallel with the critical child: not on the path
            if after_child and span[6]:
                waited += t - ce
            else:
                own += t - ce
            walk(child, cs, ce)
            t = cs
            after_child = True
        if t > lo:
            own += t - lo
        if own:
            credit[span[0]] = credit.get(span[0], 0) + own
        if waited:
            backoff[span[0]] = backoff.get(span[0], 0) + waited

    walk(root, root[4], root[5])

    out = []
    # Class and label inheritance, top-down: the nearest LLM ancestor-or-self names the time.
    stack: list[tuple[Span, Span | None]] = [(root, None)]
    while stack:
        span, llm_owner = stack.pop()
        owner = span if span[6] else llm_owner
        start, end = span[4], span[5]
        # Self time: duration minus the union of child intervals clamped to the span.
        covered = 0
        kids = children.get(span[0])
        if kids:
            cur_s = cur_e = 0
            merging = False
            for s, e in sorted((c[4] if c[4] > start else start, c[5] if c[5] < end else end) for c in kids):
                if e <= s:
                    continue
                if not merging or s > cur_e:
                    if merging:
                        covered += cur_e - cur_s
                    cur_s, cur_e, merging = s, e, True
                elif e > cur_e:
                    cur_e = e
            if merging:
                covered += cur_e - cur_s
            for c in kids:
                stack.append((c, owner))
        self_ns = max(0, (end - start) - covered)
        if owner is not None:
            out.append((span[0], credit.get(span[0], 0), self_ns, "llm", owner[2], owner[7], owner[8]))
            if span[0] in backoff:
                out.append((span[0], backoff[span[0]], 0, "llm", RETRY_BACKOFF, owner[7], owner[8]))
        else:
            out.append((span[0], credit.get(span[0], 0), self_ns, "internal", span[2], "", ""))
    return out


def critical_path(spans: pl.DataFrame) -> pl.DataFrame:
    """Per span of each trace: critical-path time, self time, class and the label its time goes to.

    Only spans reachable from the trace's root through parent links appear. Pure.
    """
    if spans.is_empty():
        return empty(CRITICAL_PATH_SCHEMA)
    # The order _trace_critical_path reads: the tail-span columns but the trace key and id. One sorted
    # pass cut at the trace boundaries instead of a frame per trace: per-group frames cost more than
    # the walk itself.
    ordered = spans.sort("trace_key")
    keys = ordered["trace_key"].to_numpy()
    rows = ordered.select([c for c in TAIL_SPANS_SCHEMA if c not in ("trace_key", "trace_id")]).rows()
    cuts = [0, *(np.flatnonzero(keys[1:] != keys[:-1]) + 1).tolist(), len(rows)]
    out: list[Span] = []
    for lo, hi in itertools.pairwise(cuts):
        trace_key = int(keys[lo])
        out.extend((trace_key, *r) for r in _trace_critical_path(rows[lo:hi]))
    return pl.DataFrame(out, schema=CRITICAL_PATH_SCHEMA, orient="row")


# --- attribution (pure) ------------------------------------------------------------------------


def attribute(
    requests: pl.DataFrame | None,
    tails: pl.DataFrame,
    path: pl.DataFrame,
    conventions: Conventions,
    stats: pl.DataFrame | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(attribution, attribution_spans) from the requests of both windows, the tail traces and the
    critical path of those traces; ``stats``: their :func:`window_stats` when already known (then
    ``requests`` is not read). Pure."""
    if stats is None:
        assert requests is not None, "attribute() needs the requests or their window stats"
        stats = window_stats(requests, conventions)
    current_ops = stats.filter((pl.col("window") == "current") & (pl.col("n") > 0)).select(_KEYS).unique()
    if current_ops.is_empty():
        return empty(ATTRIBUTION_SCHEMA), empty(ATTRIBUTION_SPANS_SCHEMA)
    stats = stats.pivot(on="window", index=_KEYS, values=["n", "p99"])
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
        .sort(["duration_ms", "trace_key"], descending=[True, False])
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


def llm_signal_counts(
    llm_spans: pl.DataFrame, roots: pl.DataFrame, windows: Windows, structure: pl.DataFrame | None = None
) -> pl.DataFrame:
    """Per (window, provider, model): logical LLM calls, calls failed after their retries, attempts,
    failed (not 429) and 429 attempts, retries and calls off the request path
    (:data:`analytics.llm_calls.SIGNAL_COUNTS_SCHEMA`), from
    :func:`analytics.llm_spans.fetch_llm_spans` (one row per span), the hot-path roots of
    :func:`analytics.llm_spans.fetch_roots` and, when calls may run below a consumer in a request's
    trace, the structure of those traces. Pure.

    A call's error is the failure its user met (its last span in error after every retry); failed
    attempts and 429s are counted on the attempts that went over the wire (the HTTP children of each
    LLM span), so a call that succeeded after a throttled attempt shows its 429 and no error. A call is
    cold-path work when it is marked cold, runs below a consumer, or its trace has no hot-path root.
    """
    if structure is not None:
        llm_spans = without_queued_calls(llm_spans, structure, roots["trace_key"])
    calls = llm_call_rows(llm_spans, span_attempts(llm_spans), roots["trace_key"], windows)
    return signal_counts(calls)


def fetch_llm_signals(
    store: Store, pairs: pl.DataFrame, windows: Windows, conventions: Conventions
) -> pl.DataFrame:
    """:func:`llm_signal_counts` for the (provider, model) pairs in ``pairs``, read from the store."""
    if pairs.is_empty():
        return empty(SIGNAL_COUNTS_SCHEMA)
    llm_spans = first_of_each(fetch_llm_spans(store, windows, conventions), "span_key")
    roots = fetch_roots(store, windows, conventions)
    structure = fetch_structure(store, boundary_traces(llm_spans, roots["trace_key"]), windows, conventions)
    counts = llm_signal_counts(llm_spans, roots, windows, structure)
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
    """Per cause: the rate of calls failed after their retries (``error_rate``), of failed attempts
    but 429s (``failed_attempt_rate``: 5xx, timeouts), of 429 attempts (``throttle_rate``), of
    retries and the cold-path share of calls, baseline and current. Pure."""
    if causes.is_empty():
        return empty(LLM_SIGNALS_SCHEMA)
    # Errors per call (what the user met); failed and 429 attempts per attempt (what the provider
    # answered); retries and cold share per call.
    rates = counts.with_columns(
        (pl.col("errors") / pl.col("calls")).alias("error_rate"),
        (pl.col("failed_attempts") / pl.col("attempts")).alias("failed_attempt_rate"),
        (pl.col("throttled") / pl.col("attempts")).alias("throttle_rate"),
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
                for m in ("error_rate", "failed_attempt_rate", "throttle_rate", "retry_rate", "cold_share")
            ],
        )
        out = out.join(part, on=["provider", "model"], how="left")
    return out.select(list(LLM_SIGNALS_SCHEMA)).cast(pl.Schema(LLM_SIGNALS_SCHEMA))
