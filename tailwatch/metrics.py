"""The tail metrics on ``/metrics``: the latest persisted analysis and the alert states as gauges.

:class:`TailMetrics` is a prometheus_client collector registered on the service's registry, beside
the ingest and job series. A scrape never touches the store: ``collect()`` hands out a snapshot
that a background thread rebuilds from the store — after a job run (the service asks for it), or
when a scrape finds the snapshot older than ``refresh_after_s``. The receiver serves ``/metrics``
on the same event loop as ingest, and the embedded store answers one query at a time (an analysis
holds it for seconds), so a scrape that read the store would stall exports.

Each refresh reads the newest run id (one row) and the alert states; the analysis frames are
loaded only when a newer run exists, and their gauges are built once per run. A store that fails is
logged and counted (``tailwatch_tail_metrics_refresh_errors_total``); the last snapshot stays.

The series and their labels are documented in docs/service.md; :func:`analysis_families` and
:func:`alert_families` are the pure part (frames in, metric families out).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any

import polars as pl
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from analytics import Analysis, latest_analysis, load_analysis, runs
from slo_rules import list_alerts
from storage import Store

__all__ = [
    "MAX_SERIES_PER_FAMILY",
    "REFRESH_AFTER_S",
    "TailMetrics",
    "alert_families",
    "analysis_families",
]

log = logging.getLogger("tailwatch.metrics")

# A scrape that finds the snapshot older than this asks for a refresh (and is answered with the
# snapshot it found: the next scrape gets the new one).
REFRESH_AFTER_S = 15.0
# Label values come from span data: a service that puts an id in its span names would otherwise
# turn one family into millions of series. Rows are kept in order of traffic, the rest counted.
MAX_SERIES_PER_FAMILY = 2000

_QUANTILES = (("0.5", "p50"), ("0.95", "p95"), ("0.99", "p99"), ("0.999", "p999"))
_VERDICTS = ("llm", "internal", "mixed", "none")
_LABEL_NAME = re.compile(r"[^a-zA-Z0-9_]")


@dataclass(frozen=True)
class _Spec:
    name: str
    documentation: str
    labels: tuple[str, ...] = ()


# Every analysis gauge, in exposition order (docs/service.md lists the same).
_SPECS: dict[str, _Spec] = {
    spec.name: spec
    for spec in (
        _Spec(
            "tailwatch_analysis_window_start_timestamp_seconds",
            "Start of the window of the latest persisted analysis, as Unix time.",
        ),
        _Spec(
            "tailwatch_analysis_window_end_timestamp_seconds",
            "End of the window of the latest persisted analysis, as Unix time.",
        ),
        _Spec(
            "tailwatch_hot_path_latency_seconds",
            "Hot-path request latency quantile over the analysis window, all versions together.",
            ("service", "operation", "quantile"),
        ),
        _Spec(
            "tailwatch_hot_path_requests",
            "Hot-path requests in the analysis window.",
            ("service", "operation"),
        ),
        _Spec(
            "tailwatch_hot_path_first_byte_seconds",
            "Time to the response's first body byte (streamed endpoints), quantile over the analysis "
            "window; only operations whose server marks it.",
            ("service", "operation", "quantile"),
        ),
        _Spec(
            "tailwatch_hot_path_streamed_requests",
            "Hot-path requests in the analysis window whose body went out in several sends.",
            ("service", "operation"),
        ),
        _Spec(
            "tailwatch_hot_path_sync_llm_calls_per_request",
            "Synchronous LLM calls per hot-path request in the analysis window.",
            ("service", "operation"),
        ),
        _Spec(
            "tailwatch_release_latency_seconds",
            "Hot-path latency quantile of one version's requests in the analysis window.",
            ("service", "operation", "version", "quantile"),
        ),
        _Spec(
            "tailwatch_release_p99_delta_seconds",
            "p99 of this version minus p99 of the version released before it.",
            ("service", "operation", "version"),
        ),
        _Spec(
            "tailwatch_release_p99_change_significant",
            "1 when the p99 change into this version is practically and statistically significant.",
            ("service", "operation", "version"),
        ),
        _Spec(
            "tailwatch_release_requests",
            "Requests served by this version in the analysis window.",
            ("service", "operation", "version"),
        ),
        _Spec(
            "tailwatch_release_sync_llm_calls_per_request",
            "Synchronous LLM calls per request of this version in the analysis window.",
            ("service", "operation", "version"),
        ),
        _Spec(
            "tailwatch_release_timestamp_seconds",
            "When this version was first seen, as Unix time.",
            ("service", "operation", "version"),
        ),
        _Spec(
            "tailwatch_cold_path_enqueue_to_ready_seconds",
            "Cold-path enqueue-to-ready time quantile of the jobs enqueued in the analysis window.",
            ("queue", "quantile"),
        ),
        _Spec("tailwatch_cold_path_jobs", "Jobs enqueued in the analysis window.", ("queue",)),
        _Spec(
            "tailwatch_cold_path_pending_jobs",
            "Jobs enqueued in the analysis window and not ready at its end.",
            ("queue",),
        ),
        _Spec("tailwatch_cold_path_starved", "1 when the queue's tail is starved.", ("queue",)),
        _Spec(
            "tailwatch_abandonment_ratio",
            "Share of hot-path requests abandoned by the client in the analysis window.",
            ("service", "operation"),
        ),
        _Spec(
            "tailwatch_abandonment_bucket_ratio",
            "Share of requests abandoned among those whose latency fell in [lower_seconds, upper_seconds).",
            ("service", "operation", "lower_seconds", "upper_seconds"),
        ),
        _Spec(
            "tailwatch_abandonment_cliff_seconds",
            "Latency from which abandonment jumps (the cliff), absent when there is none.",
            ("service", "operation"),
        ),
        _Spec(
            "tailwatch_retry_attempt_amplification_ratio",
            "LLM call attempts per logical call in the workflow (1: no retries).",
            ("workflow",),
        ),
        _Spec(
            "tailwatch_retry_token_amplification_ratio",
            "Tokens of all attempts over tokens of the final attempts in the workflow (1: no retries).",
            ("workflow",),
        ),
        _Spec("tailwatch_retry_workflow_runs", "Workflow runs in the analysis window.", ("workflow",)),
        _Spec(
            "tailwatch_attribution_share_ratio",
            "Share of the p99 change against the baseline spent on LLM or on internal spans.",
            ("service", "operation", "class"),
        ),
        _Spec(
            "tailwatch_attribution_p99_delta_seconds",
            "p99 of the analysis window minus p99 of the baseline window.",
            ("service", "operation"),
        ),
        _Spec(
            "tailwatch_attribution_verdict",
            "1 for the attribution verdict of the p99 change (llm, internal, mixed, none), 0 for the others.",
            ("service", "operation", "verdict"),
        ),
        _Spec("tailwatch_llm_calls", "Logical LLM calls in the analysis window.", ("provider", "model")),
        _Spec(
            "tailwatch_llm_call_error_ratio",
            "LLM calls that failed after their retries over calls in the analysis window.",
            ("provider", "model"),
        ),
        _Spec(
            "tailwatch_llm_call_failed_attempt_ratio",
            "LLM call attempts that failed other than with a 429 (5xx, timeouts) over attempts in the "
            "analysis window.",
            ("provider", "model"),
        ),
        _Spec(
            "tailwatch_llm_call_throttle_ratio",
            "LLM call attempts answered 429 over attempts in the analysis window.",
            ("provider", "model"),
        ),
        _Spec(
            "tailwatch_llm_call_retry_ratio",
            "Attempts beyond the first per logical LLM call in the analysis window.",
            ("provider", "model"),
        ),
        _Spec(
            "tailwatch_llm_call_cold_ratio",
            "Share of LLM calls made off the request path (queued work) in the analysis window.",
            ("provider", "model"),
        ),
        _Spec("tailwatch_llm_tokens", "LLM tokens in the analysis window.", ("provider", "model")),
        _Spec(
            "tailwatch_llm_time_to_first_token_seconds",
            "Time to first token of a model's calls in the analysis window (quantile 0.5 and 0.99; "
            "source attribute, or estimated from duration against output tokens: 0.5 only).",
            ("provider", "model", "quantile", "source"),
        ),
        _Spec(
            "tailwatch_llm_seconds_per_output_token",
            "Median generation time per output token of a model's calls in the analysis window.",
            ("provider", "model"),
        ),
        _Spec(
            "tailwatch_llm_cached_input_ratio",
            "Input tokens read from the prompt cache over input tokens in the analysis window.",
            ("provider", "model"),
        ),
        _Spec(
            "tailwatch_llm_cost_usd_per_day",
            "What a model's calls of the analysis window cost, per day (absent without its price).",
            ("provider", "model"),
        ),
        _Spec(
            "tailwatch_hot_path_llm_tokens_per_request",
            "Tokens of the synchronous model calls per hot-path request in the analysis window.",
            ("service", "operation"),
        ),
        _Spec(
            "tailwatch_hot_path_llm_cost_usd_per_request",
            "What a hot-path request's synchronous model calls cost in the analysis window (absent "
            "when a model it calls has no price).",
            ("service", "operation"),
        ),
    )
}

ALERTS = "tailwatch_alerts"
_ALERTS_HELP = "1 for each pending or firing alert, labelled with its labels, alertstate and cause."
_AGE = "tailwatch_analysis_age_seconds"
_AGE_HELP = "Seconds from the end of the latest persisted analysis window to this scrape."
_ERRORS = "tailwatch_tail_metrics_refresh_errors"
_ERRORS_HELP = "Failed reads of the latest analysis or the alert states (the last snapshot is kept)."
_REFRESHED = "tailwatch_tail_metrics_last_refresh_timestamp_seconds"
_REFRESHED_HELP = "Unix time of the last successful read of the latest analysis and the alert states."
_DROPPED = "tailwatch_tail_metrics_series_dropped"
_DROPPED_HELP = "Series left out of a tail-metric family by the per-family cap, in the current snapshot."


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _seconds(ms: Any) -> float | None:
    value = _finite(ms)
    return None if value is None else value / 1000.0


def _label(value: Any) -> str:
    return "" if value is None else str(value)


def _seconds_label(ms: Any) -> str:
    # Bucket bounds are whole milliseconds: as exact decimal seconds ("0.5", "2", "1.25").
    return "" if ms is None else format(Decimal(int(ms)) / 1000, "f")


class _Family:
    """One gauge family being filled, with at most ``cap`` samples: a row's samples (a quantile
    each, a class each…) are kept or dropped together, and dropped ones are counted."""

    def __init__(self, spec: _Spec, cap: int) -> None:
        self.metric = GaugeMetricFamily(spec.name, spec.documentation, labels=spec.labels)
        self.cap = cap
        self.dropped = 0

    def row(self, samples: Iterable[tuple[Sequence[str], Any]]) -> None:
        kept = [(labels, v) for labels, value in samples if (v := _finite(value)) is not None]
        if len(self.metric.samples) + len(kept) > self.cap:
            self.dropped += len(kept)
            return
        for labels, value in kept:
            self.metric.add_metric(labels, value)


@dataclass
class _Builder:
    cap: int
    families: dict[str, _Family] = field(default_factory=dict)

    def __call__(self, name: str) -> _Family:
        if name not in self.families:
            self.families[name] = _Family(_SPECS[name], self.cap)
        return self.families[name]

    def metrics(self) -> list[Metric]:
        return [f.metric for f in self.families.values() if f.metric.samples]

    def dropped(self) -> dict[str, int]:
        return {name: f.dropped for name, f in self.families.items()}


def _rows(frame: pl.DataFrame, by: Sequence[str], descending: Sequence[bool]) -> Iterator[dict[str, Any]]:
    # Busiest first, so that the cap drops the smallest; ties in a stable label order.
    yield from frame.sort(list(by), descending=list(descending), nulls_last=True).iter_rows(named=True)


def analysis_families(
    analysis: Analysis, *, max_series: int = MAX_SERIES_PER_FAMILY
) -> tuple[list[Metric], dict[str, int]]:
    """The gauges of one analysis and, per family, how many series the cap left out. Pure.

    Durations are in seconds and shares in ratios (0–1); label values are the span data's own
    strings. A value the analysis left empty (a percentile over no request, a ratio over nothing)
    is no sample at all rather than NaN.
    """
    if max_series < 1:
        raise ValueError(f"max_series must be at least 1, got {max_series}")
    b = _Builder(max_series)
    b("tailwatch_analysis_window_start_timestamp_seconds").row([((), analysis.start.timestamp())])
    b("tailwatch_analysis_window_end_timestamp_seconds").row([((), analysis.end.timestamp())])

    hot_ops = ["service", "operation"]
    for r in _rows(analysis.hot_path, ["requests", *hot_ops], [True, False, False]):
        key = (_label(r["service"]), _label(r["operation"]))
        b("tailwatch_hot_path_latency_seconds").row(
            ((*key, q), _seconds(r[f"{col}_ms"])) for q, col in _QUANTILES
        )
        b("tailwatch_hot_path_requests").row([(key, r["requests"])])
        b("tailwatch_hot_path_sync_llm_calls_per_request").row([(key, r["sync_llm_calls_per_request"])])
        if r["first_byte_requests"]:
            b("tailwatch_hot_path_first_byte_seconds").row(
                ((*key, q), _seconds(r[f"ttfb_{col}_ms"])) for q, col in _QUANTILES if col in ("p50", "p99")
            )
            b("tailwatch_hot_path_streamed_requests").row([(key, r["streamed_requests"])])

    for r in _rows(analysis.releases, ["requests_after", *hot_ops, "version"], [True, False, False, False]):
        version = (_label(r["service"]), _label(r["operation"]), _label(r["version"]))
        b("tailwatch_release_latency_seconds").row([((*version, "0.99"), _seconds(r["p99_after_ms"]))])
        b("tailwatch_release_p99_delta_seconds").row([(version, _seconds(r["p99_delta_ms"]))])
        significant = r["significant"]
        b("tailwatch_release_p99_change_significant").row(
            [(version, None if significant is None else float(bool(significant)))]
        )
        b("tailwatch_release_requests").row([(version, r["requests_after"])])
        b("tailwatch_release_sync_llm_calls_per_request").row(
            [(version, r["sync_llm_calls_per_request_after"])]
        )
        released = r["released_at"]
        b("tailwatch_release_timestamp_seconds").row(
            [(version, released.timestamp() if released is not None else None)]
        )

    for r in _rows(analysis.cold_path, ["jobs", "queue"], [True, False]):
        queue = _label(r["queue"])
        b("tailwatch_cold_path_enqueue_to_ready_seconds").row(
            ((queue, q), r[f"{col}_s"]) for q, col in _QUANTILES
        )
        b("tailwatch_cold_path_jobs").row([((queue,), r["jobs"])])
        b("tailwatch_cold_path_pending_jobs").row([((queue,), r["pending"])])
        starved = r["starved"]
        b("tailwatch_cold_path_starved").row([((queue,), None if starved is None else float(bool(starved)))])

    summary = analysis.abandonment_summary
    for r in _rows(summary, ["requests", *hot_ops], [True, False, False]):
        key = (_label(r["service"]), _label(r["operation"]))
        b("tailwatch_abandonment_ratio").row([(key, r["rate"])])
        b("tailwatch_abandonment_cliff_seconds").row([(key, _seconds(r["cliff_ms"]))])
    # The buckets of the busiest operations first, each operation's buckets in latency order.
    traffic = summary.select(*hot_ops, pl.col("requests").alias("op_requests"))
    buckets = analysis.abandonment.join(traffic, on=hot_ops, how="left")
    for r in _rows(buckets, ["op_requests", *hot_ops, "lo_ms"], [True, False, False, False]):
        b("tailwatch_abandonment_bucket_ratio").row(
            [
                (
                    (
                        _label(r["service"]),
                        _label(r["operation"]),
                        _seconds_label(r["lo_ms"]),
                        _seconds_label(r["hi_ms"]),
                    ),
                    r["rate"],
                )
            ]
        )

    for r in _rows(analysis.retry_amplification, ["runs", "workflow"], [True, False]):
        workflow = (_label(r["workflow"]),)
        b("tailwatch_retry_attempt_amplification_ratio").row([(workflow, r["attempt_amplification"])])
        b("tailwatch_retry_token_amplification_ratio").row([(workflow, r["token_amplification"])])
        b("tailwatch_retry_workflow_runs").row([(workflow, r["runs"])])

    for r in _rows(analysis.attribution, ["current_requests", *hot_ops], [True, False, False]):
        key = (_label(r["service"]), _label(r["operation"]))
        b("tailwatch_attribution_share_ratio").row(
            [((*key, "llm"), r["llm_share"]), ((*key, "internal"), r["internal_share"])]
        )
        b("tailwatch_attribution_p99_delta_seconds").row([(key, _seconds(r["delta_ms"]))])
        verdict = _label(r["verdict"])
        if verdict:
            states = _VERDICTS if verdict in _VERDICTS else (*_VERDICTS, verdict)
            b("tailwatch_attribution_verdict").row(
                ((*key, state), 1.0 if state == verdict else 0.0) for state in states
            )

    for r in _rows(analysis.llm_calls, ["calls", "provider", "model"], [True, False, False]):
        key = (_label(r["provider"]), _label(r["model"]))
        b("tailwatch_llm_calls").row([(key, r["calls"])])
        b("tailwatch_llm_call_error_ratio").row([(key, r["error_rate"])])
        b("tailwatch_llm_call_failed_attempt_ratio").row([(key, r["failed_attempt_rate"])])
        b("tailwatch_llm_call_throttle_ratio").row([(key, r["throttle_rate"])])
        b("tailwatch_llm_call_retry_ratio").row([(key, r["retry_rate"])])
        b("tailwatch_llm_call_cold_ratio").row([(key, r["cold_share"])])
        b("tailwatch_llm_tokens").row([(key, r["tokens"])])

    anatomy = getattr(analysis, "llm_anatomy", None)  # absent from runs that predate it
    for r in [] if anatomy is None else _rows(anatomy, ["calls", "provider", "model"], [True, False, False]):
        key = (_label(r["provider"]), _label(r["model"]))
        source = _label(r["ttft_source"])
        if source:
            b("tailwatch_llm_time_to_first_token_seconds").row(
                [
                    ((*key, "0.5", source), _seconds(r["ttft_p50_ms"])),
                    ((*key, "0.99", source), _seconds(r["ttft_p99_ms"])),
                ]
            )
        b("tailwatch_llm_seconds_per_output_token").row([(key, _seconds(r["ms_per_output_token_p50"]))])
        b("tailwatch_llm_cached_input_ratio").row([(key, r["cached_input_ratio"])])
        b("tailwatch_llm_cost_usd_per_day").row([(key, r["cost_per_day"])])
    costs = analysis.llm_costs.filter((pl.col("window") == "current") & (pl.col("version") == ""))
    for r in _rows(costs, ["requests", *hot_ops], [True, False, False]):
        if not r["sync_llm_calls_per_request"]:
            continue
        key = (_label(r["service"]), _label(r["operation"]))
        b("tailwatch_hot_path_llm_tokens_per_request").row([(key, r["llm_tokens_per_request"])])
        b("tailwatch_hot_path_llm_cost_usd_per_request").row([(key, r["llm_cost_per_request"])])
    return b.metrics(), b.dropped()


def _label_name(name: str) -> str | None:
    """A rule's label name as a Prometheus label name (invalid characters as ``_``); ``None`` for
    names Prometheus reserves (``__…``)."""
    cleaned = _LABEL_NAME.sub("_", name)
    if not cleaned or cleaned.startswith("__"):
        return None
    return f"_{cleaned}" if cleaned[0].isdigit() else cleaned


def _alert_labels(row: Mapping[str, Any]) -> dict[str, str]:
    try:
        raw = json.loads(row.get("labels") or "{}")
    except ValueError:
        raw = {}
    if not isinstance(raw, dict):
        raw = {}
    # The typed columns back up a labels document that lacks them.
    for name in ("alertname", "severity", "service", "operation", "queue", "workflow", "path"):
        if not raw.get(name) and row.get(name):
            raw[name] = row[name]
    labels: dict[str, str] = {}
    for name, value in raw.items():
        clean = _label_name(str(name))
        if clean is not None and clean not in ("alertstate",) and _label(value) != "":
            labels.setdefault(clean, _label(value))
    labels["alertstate"] = _label(row.get("state"))
    if row.get("cause") and "cause" not in labels:
        labels["cause"] = _label(row["cause"])
    return labels


def alert_families(alerts: pl.DataFrame, *, max_series: int = MAX_SERIES_PER_FAMILY) -> tuple[Metric, int]:
    """``tailwatch_alerts``: 1 per pending or firing alert of ``slo_rules.list_alerts`` (firing
    first), like Prometheus's ``ALERTS``; and how many the cap left out. Pure."""
    metric = Metric(ALERTS, _ALERTS_HELP, "gauge")
    seen: set[frozenset[tuple[str, str]]] = set()
    dropped = 0
    for row in alerts.iter_rows(named=True):
        if row.get("state") not in ("firing", "pending"):
            continue
        labels = _alert_labels(row)
        identity = frozenset(labels.items())
        if identity in seen:
            continue
        seen.add(identity)
        if len(metric.samples) >= max_series:
            dropped += 1
            continue
        metric.add_sample(ALERTS, labels, 1.0)
    return metric, dropped


@dataclass(frozen=True)
class _Snapshot:
    """What a scrape hands out. The analysis part is kept until a newer run exists; the frames
    themselves are not (only the gauges built from them)."""

    analysis_metrics: list[Metric]
    analysis_dropped: dict[str, int]
    alerts: Metric
    alerts_dropped: int = 0
    window_end: float | None = None
    run_id: str | None = None
    refreshed_at: float | None = None  # Unix time of the last good read


def _empty_snapshot() -> _Snapshot:
    return _Snapshot([], {}, Metric(ALERTS, _ALERTS_HELP, "gauge"))


class TailMetrics:
    """The latest persisted analysis and the alert states as Prometheus gauges.

    A collector (``collect()`` yields ``GaugeMetricFamily`` s) for any ``CollectorRegistry``; a
    scrape reads a snapshot only, never the store. Usage::

        registry = CollectorRegistry()
        tail = TailMetrics(store, registry=registry)
        tail.start()            # first read in the background
        ...
        tail.refresh_soon()     # after a job wrote a run or changed an alert
        print(generate_latest(registry).decode())
        tail.stop()

    ``refresh()`` reads the store in the caller's thread (tests, or a caller that wants it now).
    """

    def __init__(
        self,
        store: Store,
        *,
        registry: CollectorRegistry | None = None,
        refresh_after_s: float = REFRESH_AFTER_S,
        max_series: int = MAX_SERIES_PER_FAMILY,
        scheduled_window: Callable[[], tuple[datetime, datetime] | None] | None = None,
    ) -> None:
        if refresh_after_s <= 0:
            raise ValueError(f"refresh_after_s must be positive, got {refresh_after_s}")
        if max_series < 1:
            raise ValueError(f"max_series must be at least 1, got {max_series}")
        self.store = store
        # The service's schedule names the analysis to expose: runs are also persisted for each
        # notified alert and by ad-hoc exports, so "the newest run" can be someone else's window.
        self.scheduled_window = scheduled_window
        self._window: tuple[datetime, datetime] | None = None
        self.refresh_after_s = refresh_after_s
        self.max_series = max_series
        self.errors = 0
        self._snapshot = _empty_snapshot()
        self._checked = -math.inf  # monotonic time of the last read, good or not
        self._failing = False
        self._read_lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.registry = registry
        if registry is not None:
            registry.register(self)

    # --- prometheus_client's collector interface ---------------------------------------------
    def describe(self) -> Iterator[Metric]:
        """Every family name, so the registry refuses a collision at registration."""
        for spec in _SPECS.values():
            yield GaugeMetricFamily(spec.name, spec.documentation, labels=spec.labels)
        yield Metric(ALERTS, _ALERTS_HELP, "gauge")
        yield GaugeMetricFamily(_AGE, _AGE_HELP)
        yield CounterMetricFamily(_ERRORS, _ERRORS_HELP)
        yield GaugeMetricFamily(_REFRESHED, _REFRESHED_HELP)
        yield GaugeMetricFamily(_DROPPED, _DROPPED_HELP, labels=["family"])

    def collect(self) -> Iterator[Metric]:
        snapshot = self._snapshot
        if time.monotonic() - self._checked >= self.refresh_after_s:
            self._wake.set()  # the refresher reads; this scrape answers with what it has
        yield from snapshot.analysis_metrics
        if snapshot.window_end is not None:
            yield GaugeMetricFamily(_AGE, _AGE_HELP, value=max(0.0, time.time() - snapshot.window_end))
        yield snapshot.alerts
        yield CounterMetricFamily(_ERRORS, _ERRORS_HELP, value=self.errors)
        if snapshot.refreshed_at is not None:
            yield GaugeMetricFamily(_REFRESHED, _REFRESHED_HELP, value=snapshot.refreshed_at)
        # Only the families that hit the cap: a healthy service adds no series here.
        dropped = GaugeMetricFamily(_DROPPED, _DROPPED_HELP, labels=["family"])
        for name, count in sorted({**snapshot.analysis_dropped, ALERTS: snapshot.alerts_dropped}.items()):
            if count:
                dropped.add_metric([name], count)
        yield dropped

    # --- reading the store ----------------------------------------------------------------------
    def refresh(self) -> bool:
        """Read the newest run id and the alert states now (the analysis only when it changed);
        ``False`` if the store failed, in which case the previous snapshot stays."""
        with self._read_lock:
            self._checked = time.monotonic()
            previous = self._snapshot
            try:
                window = self.scheduled_window() if self.scheduled_window is not None else None
                analysis: Analysis | None = None
                if window is not None:
                    # The scheduled run (re-read when the schedule has moved on to a new window).
                    run_id = previous.run_id if window == self._window else None
                    if run_id is None:
                        analysis = load_analysis(self.store, *window)
                        run_id = analysis.run_id if analysis is not None else None
                        self._window = window if analysis is not None else None
                else:
                    # No scheduled run yet in this process (just started): the newest persisted one.
                    newest = runs(self.store, limit=1)
                    run_id = str(newest["run_id"][0]) if newest.height else None
                    if run_id is not None and run_id != previous.run_id:
                        analysis = latest_analysis(self.store)
                alerts = list_alerts(self.store)
            except Exception as exc:
                self.errors += 1
                if not self._failing:  # once per outage, not once per scrape
                    log.warning("tail metrics: could not read the store (%s); serving the last snapshot", exc)
                self._failing = True
                return False
            if self._failing:
                log.info("tail metrics: the store answers again")
                self._failing = False
            alert_metric, alerts_dropped = alert_families(alerts, max_series=self.max_series)
            if analysis is not None:
                metrics, dropped = analysis_families(analysis, max_series=self.max_series)
                part = _Snapshot(metrics, dropped, alert_metric, 0, analysis.end.timestamp(), analysis.run_id)
            elif run_id is None:
                part = _empty_snapshot()
            else:  # the same run as before
                part = previous
            self._snapshot = replace(
                part, alerts=alert_metric, alerts_dropped=alerts_dropped, refreshed_at=time.time()
            )
            return True

    def refresh_soon(self) -> None:
        """Ask the background thread to read the store (after a job run); returns at once."""
        self._wake.set()

    def start(self) -> None:
        """Start the background reader; its first read begins at once."""
        if self._thread is not None:
            return
        self._stopping.clear()
        self._wake.set()
        self._thread = threading.Thread(target=self._loop, name="tailwatch-tail-metrics", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the reader (waiting up to ``timeout_s`` for a read in progress) and unregister."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self.registry is not None:
            with contextlib.suppress(KeyError):  # unregistered by its owner already
                self.registry.unregister(self)
            self.registry = None

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            if self._stopping.is_set():
                return
            self._wake.clear()
            try:
                self.refresh()
            except Exception:  # a bug here must not end the thread: the next wake tries again
                log.exception("tail metrics: refresh failed")
