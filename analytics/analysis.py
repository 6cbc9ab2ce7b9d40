"""One analysis run: every metric over a window and its baseline, as Polars frames and as JSON.

``analyze`` runs the SQL reads (one query per shape of data: hot-path roots, LLM and workflow spans,
the spans of the tail and workflow traces, release times, flag evaluations, queued jobs) and hands
the narrow results to the pure metric functions of the sibling modules, overlapping the two.
"""

from __future__ import annotations

import copy
import io
import json
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any, cast

import polars as pl

from analytics._common import Windows, first_of_each, series_every
from analytics.abandonment import (
    ABANDONMENT_SCHEMA,
    ABANDONMENT_SUMMARY_SCHEMA,
    abandonment,
    abandonment_summary,
)
from analytics.aggregates import (
    abandonment_from_state,
    abandonment_summary_from_state,
    boundary_samples,
    hot_path_from_state,
    hot_path_series_from_state,
)
from analytics.ancestry import boundary_traces, without_queued_calls
from analytics.attribution import (
    ATTRIBUTION_SCHEMA,
    ATTRIBUTION_SPANS_SCHEMA,
    LLM_SIGNALS_SCHEMA,
    attribute,
    critical_path,
    llm_causes,
    llm_signals,
    tail_spans,
    tail_traces,
)
from analytics.boundary import (
    BOUNDARY_RELEASES_SCHEMA,
    BOUNDARY_SCHEMA,
    boundary,
    boundary_of,
    counterfactual,
    with_critical_path,
)
from analytics.cold_path import (
    COLD_PATH_CDF_SCHEMA,
    COLD_PATH_SCHEMA,
    COLD_PATH_SERIES_SCHEMA,
    cold_path_cdf,
    cold_path_cdf_from_stats,
    cold_path_from_stats,
    cold_path_series,
    cold_path_series_from_stats,
    cold_path_summary,
    fetch_jobs,
    jobs_from_raw,
    jobs_from_spans,
)
from analytics.conventions import Conventions
from analytics.drift import DriftReport
from analytics.hedges import HEDGES_SCHEMA, existing_hedges, fetch_hedge_spans
from analytics.hot_path import (
    HOT_PATH_SCHEMA,
    HOT_PATH_SERIES_SCHEMA,
    hot_path_series,
    hot_path_summary,
    request_rows,
    with_sync_llm_calls,
)
from analytics.llm_anatomy import (
    LLM_ANATOMY_SCHEMA,
    LLM_ANATOMY_SERIES_SCHEMA,
    LLM_CAUSE_COLUMNS,
    anatomy_buckets,
    anatomy_every,
    anatomy_totals,
    llm_anatomy,
    llm_anatomy_series,
    usd_per_token,
    with_llm_causes,
)
from analytics.llm_calls import (
    LLM_CALLS_SCHEMA,
    calls_in_windows,
    llm_calls_summary,
    logical_calls,
    signal_counts,
    span_attempts,
)
from analytics.llm_spans import fetch_llm_spans, fetch_roots
from analytics.releases import (
    RELEASE_COUPLING_SCHEMA,
    RELEASES_SCHEMA,
    fetch_release_times,
    release_coupling,
    release_steps,
    served_versions,
    step_reads,
)
from analytics.request_costs import LLM_COSTS_SCHEMA, llm_costs, request_llm_state, with_release_costs
from analytics.retries import (
    RETRY_AMPLIFICATION_SCHEMA,
    RETRY_HOPS_SCHEMA,
    retry_metrics,
    retry_metrics_from_state,
    with_baseline,
    workflow_spans,
    workflows_from_spans,
)
from analytics.slices import SLICES_SCHEMA, fetch_flag_evaluations, slices
from analytics.summaries import SummaryInputs, step_requests, summarised_inputs, summary_extent
from analytics.trace_spans import fetch_trace_spans, with_span_attributes
from analytics.what_if import WHAT_IF_CALLS_SCHEMA, WHAT_IF_SCHEMA, what_if, with_cheapest_option
from storage import Store, iso_z

__all__ = ["FRAME_SCHEMAS", "Analysis", "analyze"]

FRAME_SCHEMAS: dict[str, dict[str, Any]] = {
    "hot_path": HOT_PATH_SCHEMA,
    "releases": RELEASES_SCHEMA,
    "release_coupling": RELEASE_COUPLING_SCHEMA,
    "hot_path_series": HOT_PATH_SERIES_SCHEMA,
    "cold_path": COLD_PATH_SCHEMA,
    "cold_path_series": COLD_PATH_SERIES_SCHEMA,
    "cold_path_cdf": COLD_PATH_CDF_SCHEMA,
    "abandonment": ABANDONMENT_SCHEMA,
    "abandonment_summary": ABANDONMENT_SUMMARY_SCHEMA,
    "retry_hops": RETRY_HOPS_SCHEMA,
    "retry_amplification": RETRY_AMPLIFICATION_SCHEMA,
    "attribution": {**ATTRIBUTION_SCHEMA, **LLM_CAUSE_COLUMNS},
    "attribution_spans": ATTRIBUTION_SPANS_SCHEMA,
    "llm_signals": LLM_SIGNALS_SCHEMA,
    "llm_calls": LLM_CALLS_SCHEMA,
    "llm_anatomy": LLM_ANATOMY_SCHEMA,
    "llm_anatomy_series": LLM_ANATOMY_SERIES_SCHEMA,
    "boundary": BOUNDARY_SCHEMA,
    "boundary_releases": BOUNDARY_RELEASES_SCHEMA,
    "slices": SLICES_SCHEMA,
    "what_if": WHAT_IF_SCHEMA,
    "existing_hedges": HEDGES_SCHEMA,
    "llm_costs": LLM_COSTS_SCHEMA,
}

# The JSON of the boundary and of each slice variant (docs/analytics.md; the frames hold more).
BOUNDARY_KEYS = [
    "service",
    "operation",
    "requests",
    "p99_ms",
    "budget_ms",
    "budget_source",
    "requests_over_budget",
    "requests_over_budget_per_day",
    "sync_llm_calls_per_request",
    "p99_without_sync_llm_ms",
    "requests_over_budget_without_sync_llm",
    "recommendation",
    "reasons",
    "sampled_requests",
    "effective_sample_size",
    "p99_warning",
    "cheapest_option",
]
SLICE_VARIANT_KEYS = [
    "variant",
    "requests",
    "p50_ms",
    "p99_ms",
    "abandonment_rate",
    "abandonment_rate_low",
    "abandonment_rate_high",
    "sync_llm_calls_per_request",
    "cold_p99_s",
    "p99_delta_ms",
    "abandonment_delta",
    "significant",
]


def _iso(value: datetime | None) -> str | None:
    return None if value is None else iso_z(value)


def _num(value: Any) -> Any:
    # JSON has no NaN/Infinity: a ratio over an empty side is reported as null.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _records(frame: pl.DataFrame, columns: list[str]) -> list[dict[str, Any]]:
    # A frame built before a column existed (a hand-made or older one) reports it as null.
    missing = [pl.lit(None).alias(c) for c in columns if c not in frame.columns]
    out = []
    for row in frame.with_columns(missing).select(columns).iter_rows(named=True):
        out.append({k: _iso(v) if isinstance(v, datetime) else _num(v) for k, v in row.items()})
    return out


class _Deferred:
    """A frame of a lazy :class:`Analysis` not computed yet."""

    __slots__ = ("compute",)

    def __init__(self, compute: Callable[[str], pl.DataFrame]) -> None:
        self.compute = compute


@dataclass(frozen=True)
class Analysis:
    """Every metric of one run. Frames and their columns: see ``FRAME_SCHEMAS`` and docs/analytics.md.

    Usage::

        analysis = analyze(store, start, end)
        analysis.attribution.filter(pl.col("verdict") == "llm")
        print(analysis.to_json())
    """

    start: datetime
    end: datetime
    baseline_start: datetime
    baseline_end: datetime
    hot_path: pl.DataFrame
    releases: pl.DataFrame
    release_coupling: pl.DataFrame
    hot_path_series: pl.DataFrame
    cold_path: pl.DataFrame
    cold_path_series: pl.DataFrame
    cold_path_cdf: pl.DataFrame
    abandonment: pl.DataFrame
    abandonment_summary: pl.DataFrame
    retry_hops: pl.DataFrame
    retry_amplification: pl.DataFrame
    attribution: pl.DataFrame
    attribution_spans: pl.DataFrame
    llm_signals: pl.DataFrame
    llm_calls: pl.DataFrame = dataclass_field(default_factory=lambda: pl.DataFrame(schema=LLM_CALLS_SCHEMA))
    llm_anatomy: pl.DataFrame = dataclass_field(
        default_factory=lambda: pl.DataFrame(schema=LLM_ANATOMY_SCHEMA)
    )
    llm_anatomy_series: pl.DataFrame = dataclass_field(
        default_factory=lambda: pl.DataFrame(schema=LLM_ANATOMY_SERIES_SCHEMA)
    )
    boundary: pl.DataFrame = dataclass_field(default_factory=lambda: pl.DataFrame(schema=BOUNDARY_SCHEMA))
    boundary_releases: pl.DataFrame = dataclass_field(
        default_factory=lambda: pl.DataFrame(schema=BOUNDARY_RELEASES_SCHEMA)
    )
    slices: pl.DataFrame = dataclass_field(default_factory=lambda: pl.DataFrame(schema=SLICES_SCHEMA))
    what_if: pl.DataFrame = dataclass_field(default_factory=lambda: pl.DataFrame(schema=WHAT_IF_SCHEMA))
    existing_hedges: pl.DataFrame = dataclass_field(
        default_factory=lambda: pl.DataFrame(schema=HEDGES_SCHEMA)
    )
    llm_costs: pl.DataFrame = dataclass_field(default_factory=lambda: pl.DataFrame(schema=LLM_COSTS_SCHEMA))
    bucket_ms: int = 500
    run_id: str = ""
    # The architecture drift report read beside this analysis (analytics.drift: its own window, the
    # days before ``end``); None: none was read. Not a frame: it is not persisted with the run.
    drift: DriftReport | None = None

    def __getattribute__(self, name: str) -> Any:
        value = object.__getattribute__(self, name)
        if type(value) is _Deferred:
            value = value.compute(name)
            object.__setattr__(self, name, value)
        return value

    @classmethod
    def deferred(cls, windows: Windows, bucket_ms: int, compute: Callable[[str], pl.DataFrame]) -> Analysis:
        """An analysis whose frames ``compute(name)`` makes when each is first read."""
        later = _Deferred(compute)
        return cls(
            start=windows.start,
            end=windows.end,
            baseline_start=windows.baseline_start,
            baseline_end=windows.baseline_end,
            bucket_ms=bucket_ms,
            **cast(dict[str, Any], dict.fromkeys(FRAME_SCHEMAS, later)),
        )

    def with_drift(self, report: DriftReport | None) -> Analysis:
        """This analysis with a drift report (``DriftReport.read``); a frame not computed yet is
        not computed for it."""
        out = copy.copy(self)
        object.__setattr__(out, "drift", report)
        return out

    @property
    def frames(self) -> dict[str, pl.DataFrame]:
        return {name: getattr(self, name) for name in FRAME_SCHEMAS}

    # --- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The ``tailwatch analyze --format json`` object."""
        keys = ["service", "operation"]
        release_cols = [
            "version",
            "released_at",
            "requests_before",
            "requests_after",
            "p99_before_ms",
            "p99_after_ms",
            "p99_delta_ms",
            "significant",
            "sync_llm_calls_per_request_before",
            "sync_llm_calls_per_request_after",
            "step_start",
            "step_end",
            "llm_cost_per_request_before",
            "llm_cost_per_request_after",
            "llm_tokens_per_request_before",
            "llm_tokens_per_request_after",
        ]
        # Each release's model cost per request, before → after (analytics.request_costs).
        releases = with_release_costs(self.releases, self.llm_costs)
        hot = []
        for row in _records(self.hot_path, list(HOT_PATH_SCHEMA)):
            sel = (pl.col("service") == row["service"]) & (pl.col("operation") == row["operation"])
            coupling = _records(
                self.release_coupling.filter(sel),
                ["releases", "spearman_rho", "p99_slope_ms_per_release", "coupled"],
            )
            hot.append(
                {
                    **row,
                    "releases": _records(releases.filter(sel).sort("released_at"), release_cols),
                    "release_coupling": coupling[0]
                    if coupling
                    else {
                        "releases": 0,
                        "spearman_rho": None,
                        "p99_slope_ms_per_release": None,
                        "coupled": False,
                    },
                }
            )
        abandonment_out = []
        for row in _records(self.abandonment_summary, [*keys, "cliff_ms", "latency"]):
            sel = (pl.col("service") == row["service"]) & (pl.col("operation") == row["operation"])
            abandonment_out.append(
                {
                    "service": row["service"],
                    "operation": row["operation"],
                    "bucket_ms": self.bucket_ms,
                    "buckets": _records(
                        self.abandonment.filter(sel),
                        ["lo_ms", "hi_ms", "requests", "abandoned", "rate", "rate_low", "rate_high"],
                    ),
                    "cliff_ms": row["cliff_ms"],
                    # What the buckets read: the duration, or the time to first byte.
                    "latency": row["latency"],
                }
            )
        retries_out = []
        for row in _records(self.retry_amplification, list(RETRY_AMPLIFICATION_SCHEMA)):
            hops = _records(
                self.retry_hops.filter(pl.col("workflow") == row["workflow"]).sort("hop_index"),
                ["hop", "calls", "attempts", "retry_rate", "tokens"],
            )
            retries_out.append(
                {
                    "workflow": row["workflow"],
                    "runs": row["runs"],
                    "hops": hops,
                    "attempt_amplification": row["attempt_amplification"],
                    "token_amplification": row["token_amplification"],
                    "modeled_amplification": row["modeled_amplification"],
                    "baseline_runs": row["baseline_runs"],
                    "baseline_attempt_amplification": row["baseline_attempt_amplification"],
                    "baseline_token_amplification": row["baseline_token_amplification"],
                }
            )
        attribution_out = []
        signal_cols = [
            "provider",
            "model",
            "error_rate_baseline",
            "error_rate_current",
            "throttle_rate_baseline",
            "throttle_rate_current",
            "retry_rate_baseline",
            "retry_rate_current",
            "cold_share_baseline",
            "cold_share_current",
        ]
        for row in _records(self.attribution, list(FRAME_SCHEMAS["attribution"])):
            sel = (pl.col("service") == row["service"]) & (pl.col("operation") == row["operation"])
            attribution_out.append(
                {
                    "service": row["service"],
                    "operation": row["operation"],
                    "baseline_p99_ms": row["baseline_p99_ms"],
                    "current_p99_ms": row["current_p99_ms"],
                    "delta_ms": row["delta_ms"],
                    "llm_share": row["llm_share"],
                    "internal_share": row["internal_share"],
                    "verdict": row["verdict"],
                    "top_spans": _records(
                        self.attribution_spans.filter(sel),
                        ["span_name", "class", "provider", "model", "delta_ms"],
                    ),
                    "exemplar_trace_ids": list(row["exemplar_trace_ids"] or []),
                    "llm_signals": _records(self.llm_signals.filter(sel), signal_cols),
                    **_llm_cause_out(row),
                }
            )
        slices_out = []
        for (service, operation, flag, control), group in self.slices.group_by(
            "service", "operation", "flag", "control", maintain_order=True
        ):
            slices_out.append(
                {
                    "service": service,
                    "operation": operation,
                    "flag": flag,
                    "control": control,
                    "variants": _records(group, SLICE_VARIANT_KEYS),
                }
            )
        drift = (
            {"drift_days": self.drift.days, "drift": [f.to_dict() for f in self.drift.findings]}
            if self.drift is not None
            else {}
        )
        return {
            "window": {
                "start": _iso(self.start),
                "end": _iso(self.end),
                "baseline_start": _iso(self.baseline_start),
                "baseline_end": _iso(self.baseline_end),
            },
            "hot_path": hot,
            "cold_path": _records(self.cold_path, list(COLD_PATH_SCHEMA)),
            "abandonment": abandonment_out,
            "retry_amplification": retries_out,
            "attribution": attribution_out,
            "llm_calls": _records(self.llm_calls, list(LLM_CALLS_SCHEMA)),
            "llm_anatomy": _records(self.llm_anatomy, list(LLM_ANATOMY_SCHEMA)),
            "boundary": [
                {**row, "reasons": list(row["reasons"] or [])}
                for row in _records(self.boundary, BOUNDARY_KEYS)
            ],
            "slices": slices_out,
            "what_if": _records(self.what_if, list(WHAT_IF_SCHEMA)),
            "existing_hedges": _records(self.existing_hedges, list(HEDGES_SCHEMA)),
            "llm_costs": _records(self.llm_costs, list(LLM_COSTS_SCHEMA)),
            **drift,
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    # --- frames as bytes (persistence) ------------------------------------------------------
    def frame_bytes(self) -> dict[str, bytes]:
        """Each frame as Arrow IPC bytes: the exact, typed form :meth:`from_frame_bytes` reads."""
        out = {}
        for name, frame in self.frames.items():
            buffer = io.BytesIO()
            frame.write_ipc(buffer)
            out[name] = buffer.getvalue()
        return out

    @classmethod
    def from_frame_bytes(
        cls,
        window: dict[str, datetime],
        frames: dict[str, bytes],
        *,
        bucket_ms: int = 500,
        run_id: str = "",
    ) -> Analysis:
        loaded: dict[str, pl.DataFrame] = {}
        for name, schema in FRAME_SCHEMAS.items():
            data = frames.get(name)
            frame = pl.read_ipc(io.BytesIO(data)) if data else pl.DataFrame(schema=schema)
            # A run persisted before a column existed reads back with that column empty.
            missing = [pl.lit(None, dtype).alias(c) for c, dtype in schema.items() if c not in frame.columns]
            loaded[name] = frame.with_columns(missing).select(list(schema)) if missing else frame
        return cls(
            start=window["start"],
            end=window["end"],
            baseline_start=window["baseline_start"],
            baseline_end=window["baseline_end"],
            bucket_ms=bucket_ms,
            run_id=run_id,
            **cast(dict[str, Any], loaded),
        )


def _attribution(
    requests: pl.DataFrame, tails: pl.DataFrame, trace_spans: pl.DataFrame, conv: Conventions
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Attribution frames, the LLM causes and the LLM time on each walked trace's critical path
    (``trace_key``, ``llm_ns``: the counterfactual's time for those traces), from the tail traces'
    spans."""
    tail_spans_ = tail_spans(trace_spans)
    # The tail traces get their ids back from their root spans.
    ids = tail_spans_.filter(pl.col("trace_id") != "").select("trace_key", "trace_id").unique()
    tails_with_ids = tails.join(ids, on="trace_key", how="inner")
    path = critical_path(
        tail_spans_.join(tails_with_ids.select("trace_key").unique(), on="trace_key", how="semi")
    )
    attribution, attribution_spans = attribute(requests, tails_with_ids, path, conv)
    walked = path.group_by("trace_key").agg(
        pl.col("critical_ns").filter(pl.col("class") == "llm").sum().cast(pl.Int64).alias("llm_ns")
    )
    return attribution, attribution_spans, llm_causes(attribution, attribution_spans), walked


def analyze(
    store: Store,
    start: datetime,
    end: datetime,
    baseline_start: datetime | None = None,
    baseline_end: datetime | None = None,
    conventions: Conventions | None = None,
    *,
    use_summaries: bool = True,
    lazy: bool = False,
    shared: dict[Any, Any] | None = None,
) -> Analysis:
    """Every metric over [start, end) against the baseline window (default: the window of equal
    length just before ``start``). Datetimes must be timezone-aware.

    Where :func:`analytics.build_summaries` has summarised the spans, their rows are read instead
    (the same figures, see :mod:`analytics.summaries`); ``use_summaries=False`` reads every span.
    ``lazy``: from summaries, each frame is computed when first read (the store must stay open
    until then) — a caller reading a few frames pays for those. ``shared``: a dict the caller keeps
    across the analyses of one moment (a rule evaluation), so that the spans not summarised yet are
    reduced once for all of them."""
    conv = conventions or Conventions()
    windows = Windows.of(start, end, baseline_start, baseline_end)
    # The baseline window on its own, for the metrics read per window (jobs, workflow runs).
    baseline = Windows(
        windows.baseline_start, windows.baseline_end, windows.baseline_start, windows.baseline_end
    )
    every = series_every(windows.start, windows.end, conv.series_buckets)
    # Where the summaries reach, their rows replace the span reads (analytics.summaries).
    summarised = summarised_inputs(store, windows, conv, shared) if use_summaries else None
    if summarised is not None:
        source = _FromSummaries(store, summarised, windows, conv, every)
        if lazy:
            return Analysis.deferred(windows, conv.bucket_ms, source.frame)
        return _analysis(windows, conv, source.frames())
    # The store answers one query at a time: one thread runs the reductions in order while this one
    # does the Polars work on what has arrived, so the two overlap and the store never waits for
    # Python between queries. On an error the queries not yet started are cancelled.
    sql = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailwatch-analysis-sql")
    walk = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailwatch-analysis-walk")
    try:
        roots_f = sql.submit(fetch_roots, store, windows, conv)
        llm_spans_f = sql.submit(fetch_llm_spans, store, windows, conv)
        # The workflow spans come with the LLM-span read; the store's thread picks them out (a few
        # ms) so that the trace-spans query queued after it starts at once.
        workflows_f = sql.submit(
            lambda: (
                workflows_from_spans(llm_spans_f.result(), windows),
                workflows_from_spans(llm_spans_f.result(), baseline),
            )
        )
        # Duplicates are dropped here rather than on the SQL thread, so the next query starts at once
        # (the first row of each key, the row order kept: see first_of_each).
        roots = first_of_each(roots_f.result(), "trace_key")
        # The tails and release bounds need only the roots: their queries are queued while the LLM
        # spans are still being read; the requests get their synchronous LLM calls after.
        rows = request_rows(roots, windows)
        tails = tail_traces(rows, conv)
        # Tail traces, workflow traces and the traces where a consumer may sit between the root and
        # an LLM call, in one pass (see analytics.trace_spans, analytics.ancestry).
        trace_spans_f = sql.submit(
            lambda: fetch_trace_spans(
                store,
                tails,
                pl.concat(workflows_f.result()),
                windows,
                conv,
                boundaries=boundary_traces(llm_spans_f.result(), roots["trace_key"]),
            )
        )
        # The last queries are small: they run while the traces are walked. Release times first, so
        # that the releases are computed while the flag evaluations and jobs are read and only the
        # jobs end the run (the slices need both).
        # Each version's first request bounds the search for its first span.
        first_requests = rows.group_by("service", "version").agg(pl.col("start").min())
        release_times_f = sql.submit(
            lambda: fetch_release_times(store, first_requests, windows, conv, summary_extent(store, conv))
        )
        flags_f = sql.submit(fetch_flag_evaluations, store, windows, conv)
        jobs_f = sql.submit(fetch_jobs, store, windows, conv)
        baseline_jobs_f = sql.submit(fetch_jobs, store, baseline, conv)
        hedge_spans_f = sql.submit(fetch_hedge_spans, store, _what_if_since(windows, conv), windows.end, conv)
        buckets = abandonment(rows, conv)
        buckets_summary = abandonment_summary(rows, buckets, conv)

        llm_spans = first_of_each(llm_spans_f.result(), "span_key")
        attempts = span_attempts(llm_spans)
        trace_rows = trace_spans_f.result()
        # LLM calls below a consumer are queued work, not part of the request they were enqueued by.
        llm_spans = without_queued_calls(llm_spans, trace_rows, roots["trace_key"])
        every_call = logical_calls(llm_spans, attempts, roots["trace_key"])
        requests = with_sync_llm_calls(rows, every_call)
        cost_state = request_llm_state(requests, every_call, [pl.col("window").cast(pl.String)])
        calls = calls_in_windows(every_call, windows, keep=("start_ns", "end_ns"))
        call_sums = anatomy_totals(calls)
        sync_calls = every_call.filter(pl.col("sync")).select("trace_key", "start_ns", "end_ns", "sync")
        what_if_calls = every_call.filter(pl.col("sync")).select(list(WHAT_IF_CALLS_SCHEMA))
        del every_call
        del rows

        hot = hot_path_summary(requests, conv.min_sampled_tail)
        hot_series = hot_path_series(requests, every, conv.min_sampled_tail)

        # The trace walks take the few attributes they need from the LLM-span read.
        trace_spans = with_span_attributes(trace_rows, llm_spans, attempts)
        del llm_spans, trace_rows
        # The critical-path walk is Python (it holds the interpreter) and the retry metrics are Polars
        # (they release it): run side by side, they keep both cores busy once the store is idle.
        walk_f = walk.submit(_attribution, requests, tails, trace_spans, conv)
        workflows, baseline_workflows = workflows_f.result()
        hops, amplification = retry_metrics(workflow_spans(trace_spans, workflows, windows, conv))
        _, baseline_amplification = retry_metrics(
            workflow_spans(trace_spans, baseline_workflows, baseline, conv)
        )
        amplification = with_baseline(amplification, baseline_amplification)
        served = served_versions(requests, release_times_f.result())
        stepped = step_requests(
            store,
            step_reads(served, conv, windows.end),
            conv,
            use_summaries=False,
            known=([(windows.baseline_start, windows.baseline_end), (windows.start, windows.end)], requests),
        )
        release_rows = release_steps(served, stepped, conv, windows.end)
        # The counterfactual's union of call intervals while the walk runs; the walked tail traces'
        # critical paths refine it after.
        current = counterfactual(requests, sync_calls, None, conv)
        del sync_calls
        attribution, attribution_spans, causes, walked = walk_f.result()
        current = with_critical_path(current, walked, conv)
        since = _what_if_since(windows, conv)
        recent = requests.filter((pl.col("window") == "current") & (pl.col("start") >= since))
        what_if_rows = what_if(
            current.join(recent.select("trace_key"), on="trace_key", how="semi", maintain_order="left"),
            what_if_calls,
            buckets_summary,
            buckets,
            (windows.end - since).total_seconds(),
            conv,
            usd_per_token(call_sums, conv.llm_prices),
        )
        del what_if_calls
        boundary_rows, boundary_releases = boundary(
            current,
            buckets_summary,
            buckets,
            release_rows,
            (windows.end - windows.start).total_seconds(),
            conv,
        )
        boundary_rows = with_cheapest_option(boundary_rows, what_if_rows)
        evaluations = flags_f.result()
        jobs = jobs_f.result()
        baseline_jobs = baseline_jobs_f.result()
        slice_rows = slices(current, evaluations, jobs, conv)
        signals = llm_signals(causes, signal_counts(calls))
    finally:
        sql.shutdown(wait=True, cancel_futures=True)
        walk.shutdown(wait=True, cancel_futures=True)

    return _analysis(
        windows,
        conv,
        _frames(
            hot=hot,
            release_rows=release_rows,
            hot_series=hot_series,
            jobs=jobs,
            baseline_jobs=baseline_jobs,
            every=every,
            buckets=buckets,
            buckets_summary=buckets_summary,
            hops=hops,
            amplification=amplification,
            attribution=attribution,
            attribution_spans=attribution_spans,
            signals=signals,
            calls=calls,
            boundary_rows=boundary_rows,
            boundary_releases=boundary_releases,
            slice_rows=slice_rows,
            what_if_rows=what_if_rows,
            hedges=existing_hedges(hedge_spans_f.result()),
            anatomy=llm_anatomy(
                call_sums,
                anatomy_buckets(calls, ["window", "provider", "model"]),
                conv.llm_prices,
                _window_days(windows),
            ),
            anatomy_series=llm_anatomy_series(_series_buckets(calls, anatomy_every(every))),
            costs=llm_costs(cost_state, conv.llm_prices, _window_lengths(windows)),
            conv=conv,
        ),
    )


def _frames(
    *,
    hot: pl.DataFrame,
    release_rows: pl.DataFrame,
    hot_series: pl.DataFrame,
    jobs: pl.DataFrame,
    baseline_jobs: pl.DataFrame,
    every: timedelta,
    buckets: pl.DataFrame,
    buckets_summary: pl.DataFrame,
    hops: pl.DataFrame,
    amplification: pl.DataFrame,
    attribution: pl.DataFrame,
    attribution_spans: pl.DataFrame,
    signals: pl.DataFrame,
    calls: pl.DataFrame,
    boundary_rows: pl.DataFrame,
    boundary_releases: pl.DataFrame,
    slice_rows: pl.DataFrame,
    what_if_rows: pl.DataFrame,
    hedges: pl.DataFrame,
    anatomy: pl.DataFrame,
    anatomy_series: pl.DataFrame,
    costs: pl.DataFrame,
    conv: Conventions,
) -> dict[str, pl.DataFrame]:
    return dict(
        hot_path=hot,
        releases=release_rows,
        release_coupling=release_coupling(release_rows, conv),
        hot_path_series=hot_series,
        cold_path=cold_path_summary(jobs, conv, baseline_jobs),
        cold_path_series=cold_path_series(jobs, every),
        cold_path_cdf=cold_path_cdf(jobs, conv.cdf_points, baseline_jobs),
        abandonment=buckets,
        abandonment_summary=buckets_summary,
        retry_hops=hops,
        retry_amplification=amplification,
        attribution=with_llm_causes(attribution, attribution_spans, anatomy),
        attribution_spans=attribution_spans,
        llm_signals=signals,
        llm_calls=llm_calls_summary(calls),
        llm_anatomy=anatomy,
        llm_anatomy_series=anatomy_series,
        boundary=boundary_rows,
        boundary_releases=boundary_releases,
        slices=slice_rows,
        what_if=what_if_rows,
        existing_hedges=hedges,
        llm_costs=costs,
    )


def _what_if_since(windows: Windows, conv: Conventions) -> datetime:
    """Where the what-if options' requests start: the window's most recent ``what_if_horizon`` (or
    ``exact_horizon``, the shorter; they are simulated from request and call rows)."""
    return max(windows.start, windows.end - min(conv.exact_horizon, conv.what_if_horizon))


def _series_buckets(calls: pl.DataFrame, every: timedelta) -> pl.DataFrame:
    """The anatomy histograms of the current window's calls per time bucket of ``every``."""
    every_ns = int(every.total_seconds()) * 1_000_000_000
    current = calls.filter(pl.col("window") == "current").with_columns(
        ((pl.col("start_ns") // every_ns) * every_ns).alias("bucket_ns")
    )
    return anatomy_buckets(current, ["bucket_ns", "provider", "model"])


def _window_lengths(windows: Windows) -> dict[str, timedelta]:
    return {"current": windows.end - windows.start, "baseline": windows.baseline_end - windows.baseline_start}


def _window_days(windows: Windows) -> tuple[float, float]:
    """The current and baseline windows' lengths in days (a cost per day's denominator)."""
    day = timedelta(days=1)
    return (windows.end - windows.start) / day, (windows.baseline_end - windows.baseline_start) / day


def _llm_cause_out(row: dict[str, Any]) -> dict[str, Any]:
    """An attribution row's cause inside ``llm`` as the JSON carries it (null but on ``llm``)."""
    parts = ("first_token", "generation", "backoff", "more_calls")
    known = row.get("llm_cause") is not None
    return {
        "llm_cause": row.get("llm_cause"),
        "llm_cause_ours": row.get("llm_cause_ours"),
        "llm_cause_provider": row.get("llm_cause_provider"),
        "llm_cause_model": row.get("llm_cause_model"),
        "llm_cause_text": row.get("llm_cause_text"),
        "llm_breakdown_ms": {p: row[f"llm_{p}_ms"] for p in parts} if known else None,
    }


def _analysis(windows: Windows, conv: Conventions, frames: dict[str, pl.DataFrame]) -> Analysis:
    return Analysis(
        start=windows.start,
        end=windows.end,
        baseline_start=windows.baseline_start,
        baseline_end=windows.baseline_end,
        bucket_ms=conv.bucket_ms,
        # Each frame in its declared schema: the requests' categorical keys become plain strings.
        **cast(
            dict[str, Any],
            {name: frame.cast(pl.Schema(FRAME_SCHEMAS[name])) for name, frame in frames.items()},
        ),
    )


class _FromSummaries:
    """The metrics of :func:`analyze` from the summaries' rows: the same functions on the same
    frames, the span reads and per-trace reductions done once when each minute was summarised.
    Each frame is computed when first asked for (with what it needs and no more)."""

    def __init__(
        self, store: Store, inputs: SummaryInputs, windows: Windows, conv: Conventions, every: timedelta
    ) -> None:
        self.store, self.inputs, self.windows, self.conv, self.every = store, inputs, windows, conv, every

    def frame(self, name: str) -> pl.DataFrame:
        return getattr(self, name).cast(pl.Schema(FRAME_SCHEMAS[name]))

    def frames(self) -> dict[str, pl.DataFrame]:
        """Every frame. Those that read much from the store and share no input with the others are
        computed on a second thread, so that the store runs their queries while this one does the
        Python work of the rest (the store's lock keeps one query at a time)."""
        alongside = ["existing_hedges", "llm_anatomy_series"]
        if self._aggregated:
            # Their job statistics (the window's jobs reduced in the store) serve nothing else;
            # a short window's job rows also serve the slices, computed here.
            alongside = ["cold_path", "cold_path_series", "cold_path_cdf", *alongside]
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tailwatch-analysis-sql") as pool:
            later = {name: pool.submit(self.frame, name) for name in alongside}
            try:
                out = {name: self.frame(name) for name in FRAME_SCHEMAS if name not in later}
            except BaseException:
                for future in later.values():
                    future.cancel()
                raise
            out |= {name: future.result() for name, future in later.items()}
        return {name: out[name] for name in FRAME_SCHEMAS}

    # --- what several frames share ------------------------------------------------------------
    @cached_property
    def _attribution(self) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        # Each operation's p99 and tail from SQL (the ranks around the p99 and the tail rows); the
        # request rows where those do not do (sampled data, overlapping windows).
        # Beyond the exact horizon: the p99s from the sketches, the tail among the walked top
        # requests (no request row read); within it, the exact ranks from the top requests.
        fast = self._long_tails if self._aggregated else None
        if fast is None:
            fast = self.inputs.window_tails(self.conv.tail_quantile, self.conv.max_tail_traces)
        requests, stats = (None, fast[0]) if fast is not None else (self.inputs.requests, None)
        tails = fast[1] if fast is not None else tail_traces(self.inputs.requests, self.conv)
        walks, path = self.inputs.walk(tails)
        tails_with_ids = tails.join(walks.select("trace_key", "trace_id"), on="trace_key", how="inner")
        attribution, attribution_spans = attribute(requests, tails_with_ids, path, self.conv, stats)
        causes = llm_causes(attribution, attribution_spans)
        return attribution, attribution_spans, causes, walks.select("trace_key", "llm_ns")

    @property
    def _long_tails(self) -> tuple[pl.DataFrame, pl.DataFrame] | None:
        if not self.inputs.has_tops:
            return None
        stats = self.inputs.tail_stats(self.conv.tail_quantile)
        tails = self.inputs.walked_tails(stats, self.conv.max_tail_traces)
        return None if tails is None else (stats, tails)

    @cached_property
    def _buckets(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        state = self.inputs.abandonment_state() if self._aggregated else None
        if state is not None:
            buckets = abandonment_from_state(state, self.conv)
            return buckets, abandonment_summary_from_state(*self.inputs.request_state(), buckets, self.conv)
        buckets = abandonment(self.inputs.requests, self.conv)
        return buckets, abandonment_summary(self.inputs.requests, buckets, self.conv)

    @cached_property
    def _current(self) -> pl.DataFrame:
        """The current window's requests with the time their synchronous LLM calls hold them."""
        requests = self.inputs.requests.with_columns(self.inputs.sync_llm_ms.alias("sync_llm_ms"))
        no_calls = pl.DataFrame(schema={"trace_key": pl.UInt64, "start_ns": pl.Int64, "end_ns": pl.Int64})
        return counterfactual(requests, no_calls, self._attribution[3], self.conv)

    @cached_property
    def _boundary(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        buckets, buckets_summary = self._buckets
        if self._aggregated:
            samples = boundary_samples(*self.inputs.boundary_state(), self.conv.sync_llm_replacement_ms)
            window_s = (self.windows.end - self.windows.start).total_seconds()
            return boundary_of(samples, buckets_summary, buckets, self.releases, window_s, self.conv)
        return boundary(
            self._current,
            buckets_summary,
            buckets,
            self.releases,
            (self.windows.end - self.windows.start).total_seconds(),
            self.conv,
        )

    @cached_property
    def _jobs(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        return (
            jobs_from_raw(jobs_from_spans(self.inputs.job_spans)),
            jobs_from_raw(jobs_from_spans(self.inputs.baseline_job_spans)),
        )

    @cached_property
    def _retries(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        if self._aggregated:
            w = self.windows
            hops, amplification = retry_metrics_from_state(*self.inputs.retry_state(w.start, w.end))
            _, baseline = retry_metrics_from_state(*self.inputs.retry_state(w.baseline_start, w.baseline_end))
            return hops, with_baseline(amplification, baseline)
        hops, amplification = retry_metrics(self.inputs.workflow_spans)
        _, baseline_amplification = retry_metrics(self.inputs.baseline_workflow_spans)
        return hops, with_baseline(amplification, baseline_amplification)

    # --- the frames -----------------------------------------------------------------------------
    @property
    def _aggregated(self) -> bool:
        """Whether the hot-path family is merged from the per-minute aggregates: a window longer
        than the exact horizon, whose series buckets are whole minutes."""
        w = self.windows
        return w.end - w.start > self.conv.exact_horizon and self.every % timedelta(minutes=1) == timedelta(0)

    @cached_property
    def hot_path(self) -> pl.DataFrame:
        if self._aggregated:
            return hot_path_from_state(
                *self.inputs.request_state(), self.conv.min_sampled_tail, self.inputs.first_byte_state
            )
        return hot_path_summary(self.inputs.requests, self.conv.min_sampled_tail)

    @cached_property
    def hot_path_series(self) -> pl.DataFrame:
        if self._aggregated:
            return hot_path_series_from_state(
                *self.inputs.request_state(self.every),
                self.conv.min_sampled_tail,
                self.inputs.first_byte_series_state(self.every),
            )
        return hot_path_series(self.inputs.requests, self.every, self.conv.min_sampled_tail)

    @cached_property
    def releases(self) -> pl.DataFrame:
        # Each release's own step reads at most release_step_requests a side from the summaries
        # (chosen in SQL), and the window's raw rows where they do not reach.
        keys = self.inputs.served_versions()
        first_requests = keys.group_by("service", "version").agg(pl.col("start").min())
        times = fetch_release_times(self.store, first_requests, self.windows, self.conv, self.inputs.covered)
        served = served_versions(keys, times)
        stepped = step_requests(
            self.store,
            step_reads(served, self.conv, self.windows.end),
            self.conv,
            known=self.inputs.extracted_requests(),
            shared=self.inputs.shared,
        )
        return release_steps(served, stepped, self.conv, self.windows.end)

    @cached_property
    def release_coupling(self) -> pl.DataFrame:
        return release_coupling(self.releases, self.conv)

    @property
    def abandonment(self) -> pl.DataFrame:
        return self._buckets[0]

    @property
    def abandonment_summary(self) -> pl.DataFrame:
        return self._buckets[1]

    @cached_property
    def attribution(self) -> pl.DataFrame:
        return with_llm_causes(self._attribution[0], self._attribution[1], self.llm_anatomy)

    @property
    def attribution_spans(self) -> pl.DataFrame:
        return self._attribution[1]

    @cached_property
    def llm_signals(self) -> pl.DataFrame:
        return llm_signals(self._attribution[2], signal_counts(self.inputs.calls))

    @cached_property
    def llm_calls(self) -> pl.DataFrame:
        return llm_calls_summary(self.inputs.calls)

    @cached_property
    def llm_anatomy_series(self) -> pl.DataFrame:
        return llm_anatomy_series(self.inputs.anatomy_series_buckets(anatomy_every(self.every)))

    @cached_property
    def _call_sums(self) -> pl.DataFrame:
        return anatomy_totals(self.inputs.calls)

    @cached_property
    def llm_costs(self) -> pl.DataFrame:
        return llm_costs(self.inputs.request_llm, self.conv.llm_prices, _window_lengths(self.windows))

    @cached_property
    def llm_anatomy(self) -> pl.DataFrame:
        return llm_anatomy(
            self._call_sums,
            self.inputs.anatomy_buckets,
            self.conv.llm_prices,
            _window_days(self.windows),
        )

    @cached_property
    def boundary(self) -> pl.DataFrame:
        return with_cheapest_option(self._boundary[0], self.what_if)

    @property
    def boundary_releases(self) -> pl.DataFrame:
        return self._boundary[1]

    @cached_property
    def slices(self) -> pl.DataFrame:
        # A slice is the requests of its variant's traces: a long window reads only those.
        if self._aggregated:
            # A slice's jobs are those of its variant's traces: a long window reads only those.
            requests = self.inputs.flagged_requests()
            keys = self.inputs.evaluations["trace_key"].unique()
            jobs = self.inputs.jobs(self.windows.start, self.windows.end, keys)
            return slices(requests, self.inputs.evaluations, jobs, self.conv)
        return slices(self._current, self.inputs.evaluations, self._jobs[0], self.conv)

    @cached_property
    def what_if(self) -> pl.DataFrame:
        # From request and call rows over the most recent what_if_horizon: a long window's older
        # minutes are in the aggregates only, which keep no call.
        w = self.windows
        since = _what_if_since(w, self.conv)
        if self._aggregated:
            rows = self.inputs.requests_between(since, w.end).with_columns(pl.lit("current").alias("window"))
            no_calls = pl.DataFrame(schema={"trace_key": pl.UInt64, "start_ns": pl.Int64, "end_ns": pl.Int64})
            current = counterfactual(rows, no_calls, self._attribution[3], self.conv)
        else:
            recent = self.inputs.requests.filter(
                (pl.col("window") == "current") & (pl.col("start") >= since)
            ).select("trace_key")
            current = self._current.join(recent, on="trace_key", how="semi", maintain_order="left")
        calls = self.inputs.sync_calls(since, w.end + self.conv.trace_margin)
        buckets, buckets_summary = self._buckets
        usd = usd_per_token(self._call_sums, self.conv.llm_prices)
        return what_if(
            current, calls, buckets_summary, buckets, (w.end - since).total_seconds(), self.conv, usd
        )

    @cached_property
    def _job_stats(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        # Beyond the exact horizon the engine reduces the jobs and sends per-bucket lists of their
        # durations: no job row crosses.
        w = self.windows
        return (
            self.inputs.job_stats(w.start, w.end, self.every),
            self.inputs.job_stats(w.baseline_start, w.baseline_end, self.every),
        )

    @cached_property
    def existing_hedges(self) -> pl.DataFrame:
        # The spans of the most recent exact_horizon, as the what-if options.
        since = _what_if_since(self.windows, self.conv)
        return existing_hedges(fetch_hedge_spans(self.store, since, self.windows.end, self.conv))

    @cached_property
    def cold_path(self) -> pl.DataFrame:
        if self._aggregated:
            return cold_path_from_stats(self._job_stats[0], self.conv, self._job_stats[1])
        jobs, baseline_jobs = self._jobs
        return cold_path_summary(jobs, self.conv, baseline_jobs)

    @cached_property
    def cold_path_series(self) -> pl.DataFrame:
        if self._aggregated:
            return cold_path_series_from_stats(self._job_stats[0])
        return cold_path_series(self._jobs[0], self.every)

    @cached_property
    def cold_path_cdf(self) -> pl.DataFrame:
        if self._aggregated:
            return cold_path_cdf_from_stats(self._job_stats[0], self.conv.cdf_points, self._job_stats[1])
        jobs, baseline_jobs = self._jobs
        return cold_path_cdf(jobs, self.conv.cdf_points, baseline_jobs)

    @property
    def retry_hops(self) -> pl.DataFrame:
        return self._retries[0]

    @property
    def retry_amplification(self) -> pl.DataFrame:
        return self._retries[1]
