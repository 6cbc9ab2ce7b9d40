"""Architecture drift (seed 004): from the traces of a long window, read by day, the signs that a batch
job has quietly become an online service.

Six kinds of finding, each comparing the first ``drift_edge_days`` days of the drift window ("then")
with the last ones ("now"):

* ``shared_operation`` — one function (span name, plus ``code.function.name``/``code.namespace`` or
  the older ``code.function`` where present) reached from hot requests and from jobs, whose share of
  calls made on the hot path rose from below ``drift_hot_share`` to at or above it.
* ``batch_shrinking`` — a run (a consumer/process span, or a root marked cold) whose items per run
  (``messaging.batch.message_count`` or ``batch_size_attributes``) fell while its runs per day climbed,
  each by at least ``drift_batch_factor``.
* ``unit_cost_rising`` — a unit of work (a hot request, a run's item, or a run) whose model calls
  or tokens per unit rose by at least ``drift_cost_factor``.
* ``whole_batch_retry`` — a run whose retries (runs of the same ``messaging.message.id`` after a
  failed one) reprocess at least ``drift_retry_reprocessed`` items per item that failed.
* ``queue_unbounded`` — a queue whose backlog (enqueued minus completed jobs, summed by day) grows over
  the last days.
* ``no_latency_target`` — a hot operation that reaches a shared function, with a p99 and no latency
  budget (``latency_budgets``) and no ``latency_slo`` rule covering it (the covered (service,
  operation) globs are an argument: analytics does not read rule files).

The hot side is what a hot request reaches without crossing a queue boundary, the cold side what a job
reaches (a root marked cold, or anything below a boundary): the ancestry of :mod:`analytics.ancestry`,
computed here in SQL per trace for the traces holding a boundary. The heavy reductions are per-day
GROUP BYs in ClickHouse over the span table; Python receives a few rows per (day, function), (day,
run), (day, queue) and (day, operation). The report reads raw spans (no per-minute aggregate holds
these keys): the span table's TTL bounds how many days it can look back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from fnmatch import fnmatchcase
from typing import Any, Literal

import polars as pl

from analytics._common import AnalysisError, normalize
from analytics.cold_path import jobs_reduction_sql, jobs_sql
from analytics.conventions import (
    BATCH_SIZE,
    CODE_FUNCTION,
    IS_BOUNDARY,
    IS_COLD_MARKED,
    IS_HOT_ROOT,
    IS_LLM,
    KIND,
    MAYBE_BOUNDARY,
    MAYBE_LLM,
    MESSAGE_ID,
    RUN_FAILED,
    STATUS,
    TOKENS,
    Conventions,
)
from analytics.releases import first_seen_sql
from analytics.schema import DRIFT_REPORTS_TABLE
from collectors import TRACES_TABLE, inspect_traces
from storage import Store, StoreError, as_utc, iso_z

_log = logging.getLogger(__name__)

__all__ = [
    "BY_DAY_KEYS",
    "DRIFT_KINDS",
    "DRIFT_REPORTS_TABLE",
    "DriftFinding",
    "DriftKind",
    "DriftReport",
    "batch_runs_sql",
    "drift_findings",
    "drift_report",
    "queue_days_sql",
    "reaching_requests_sql",
    "retried_runs_sql",
    "shared_calls_sql",
    "span_paths_sql",
    "stored_drift_report",
    "unit_costs_sql",
    "with_releases",
]

DriftKind = Literal[
    "shared_operation",
    "batch_shrinking",
    "unit_cost_rising",
    "queue_unbounded",
    "whole_batch_retry",
    "no_latency_target",
]
DRIFT_KINDS: tuple[str, ...] = DriftKind.__args__  # type: ignore[attr-defined]
# The per-day series of each kind of finding (``DriftFinding.by_day``, besides ``day``); a ratio of a
# day with nothing to divide by is ``None``.
BY_DAY_KEYS: dict[str, tuple[str, ...]] = {
    "shared_operation": ("hot_calls", "cold_calls", "hot_share", "hot_p99_ms", "cold_p99_ms"),
    "batch_shrinking": ("runs", "items_per_run"),
    "unit_cost_rising": ("units", "calls_per_unit", "tokens_per_unit"),
    "queue_unbounded": ("enqueued", "completed", "backlog"),
    "whole_batch_retry": ("retried_jobs", "failed_items", "items_reprocessed"),
    "no_latency_target": ("requests", "p99_ms"),
}
# The seed's test: two or more of the symptoms in one service make an online service never designed
# as one.
Severity = Literal["warning", "critical"]

_DAY_NS = 86_400_000_000_000
# The stored report's shape (tailwatch_drift_reports): a report kept before the findings carried
# their per-day series is not read back as one without them.
_REPORT_FORMAT = 3
# Pointer-jumping steps of the boundary walk: 2**6 = 64 ancestors, as analytics.ancestry's depth.
_JUMPS = 6


@dataclass(frozen=True)
class DriftFinding:
    """One sign of drift: what, where, since when, and the numbers behind it."""

    kind: DriftKind
    service: str
    operation: str  # the function or hot operation; "" for a queue
    queue: str  # "" but for queue_unbounded
    since: datetime  # the first day of the trend (the start of that day of the drift window)
    evidence: dict[str, Any] = field(default_factory=dict)
    severity: Severity = "warning"
    # The per-day series the finding rests on, one dict per day of the drift window (``day``: its
    # start), the keys of its kind (:data:`BY_DAY_KEYS`): what the Drift view draws.
    by_day: list[dict[str, Any]] = field(default_factory=list)
    # The release the change arrived with: the latest version of ``service`` first seen after the
    # first days and by the end of the ``since`` day (None: none arrived then, or no service).
    since_release: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "service": self.service,
            "operation": self.operation,
            "queue": self.queue,
            "since": iso_z(self.since),
            "evidence": {k: _num(v) for k, v in self.evidence.items()},
            "severity": self.severity,
            "since_release": self.since_release,
            "by_day": [
                {k: iso_z(v) if isinstance(v, datetime) else _num(v) for k, v in row.items()}
                for row in self.by_day
            ],
        }


@dataclass(frozen=True)
class DriftReport:
    """The drift findings of the ``days`` days before ``end`` (by day), and the days each edge
    ("then", "now") spans: what an analysis carries for its Drift view and its JSON.

    Usage::

        report = DriftReport.read(store, end, conventions, covered=[("api", "POST /*")])
        analysis = analysis.with_drift(report)
    """

    findings: tuple[DriftFinding, ...]
    end: datetime
    days: int
    edge_days: int

    @property
    def start(self) -> datetime:
        return self.end - timedelta(days=self.days)

    @classmethod
    def read(
        cls,
        store: Store,
        end: datetime,
        conventions: Conventions | None = None,
        *,
        days: int | None = None,
        covered: Iterable[tuple[str, str]] = (),
    ) -> DriftReport:
        """:func:`stored_drift_report` (computed at most once per store and hour) as a report."""
        conv = conventions or Conventions()
        days = conv.drift_days if days is None else days
        findings = stored_drift_report(store, end, conv, days=days, covered=covered)
        return cls(tuple(findings), _hour(end), days, conv.drift_edge_days)


def _hour(end: datetime) -> datetime:
    """The end a stored report is read for: ``end`` taken on the hour."""
    return as_utc(end).replace(minute=0, second=0, microsecond=0)


def _num(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    return value


# --- SQL -------------------------------------------------------------------------------------------
_WINDOW = "Timestamp >= {s:DateTime64(9)} AND Timestamp < {e:DateTime64(9)}"
_DAY = "toInt64(intDiv(toUnixTimestamp64Nano(Timestamp) - {s_ns:Int64}, {day_ns:Int64}))"


# Spans that are not code of the service: model calls (a model reused on both paths is not shared code;
# analytics.llm_calls reports their cold share), calls to a dependency (Client: a database statement,
# an HTTP attempt — the dependency's own Server span, when traced, is its code) and publishes
# (Producer: handing work to a queue).
_NOT_CODE = f"({MAYBE_LLM} AND {IS_LLM}) OR {KIND} IN ('Client', 'Producer')"


def span_paths_sql(table: str) -> str:
    """Every span started in [s, e) that a hot request or a job reaches: ``trace_key``, ``day`` (from
    the window's start), ``service``, ``name``, ``function`` (:data:`CODE_FUNCTION`), ``path`` ('hot'
    or 'cold') and ``duration_ns``.

    Only code is kept: model calls, dependency calls (Client) and publishes (Producer) are left out
    (see ``_NOT_CODE``). Traces without a boundary span take their root's path (a hot root, or
    a root marked cold). A trace holding a boundary is walked per trace in SQL: a span is cold when it
    or an ancestor is a boundary crossed through a queue — its parent a Producer span, or not in the
    trace (a consumer linked to its producer) — found by pointer jumping over the parent index (64
    levels); else hot when the trace has a hot root; the rest (a scheduler's enqueue) is neither. A
    consumer span right under a request's own span is a task run eagerly (Celery's ``apply()``): it
    crossed no queue, and stays on the hot path."""
    steps = []
    for k in range(1, _JUMPS + 1):
        steps.append(
            f"arrayMap((x, j) -> if(j > 0, x OR below{k - 1}[j], x), below{k - 1}, a{k}) AS below{k}"
        )
        if k < _JUMPS:
            steps.append(f"arrayMap(j -> if(j > 0, a{k}[j], 0), a{k}) AS a{k + 1}")
    walk = ",\n           ".join(steps)
    return f"""
WITH hot_traces AS (
    SELECT DISTINCT cityHash64(TraceId) FROM {table}
    PREWHERE ParentSpanId = '' WHERE {_WINDOW} AND {IS_HOT_ROOT}
), cold_traces AS (
    SELECT DISTINCT cityHash64(TraceId) FROM {table}
    PREWHERE ParentSpanId = '' WHERE {_WINDOW} AND {IS_COLD_MARKED}
), boundary_traces AS (
    SELECT DISTINCT cityHash64(TraceId) FROM {table}
    PREWHERE {MAYBE_BOUNDARY} WHERE {_WINDOW} AND {IS_BOUNDARY}
)
SELECT cityHash64(TraceId) AS trace_key, {_DAY} AS day, toString(ServiceName) AS service,
       toString(SpanName) AS name, {CODE_FUNCTION} AS function,
       if(trace_key IN (SELECT * FROM hot_traces), 'hot', 'cold') AS path, toInt64(Duration) AS duration_ns
FROM {table}
WHERE {_WINDOW} AND cityHash64(TraceId) NOT IN (SELECT * FROM boundary_traces)
  AND NOT ({_NOT_CODE})
  AND (cityHash64(TraceId) IN (SELECT * FROM hot_traces)
       OR cityHash64(TraceId) IN (SELECT * FROM cold_traces))
UNION ALL
SELECT trace_key, span.1, span.2, span.3, span.4, if(cold, 'cold', 'hot'), span.5
FROM (
    SELECT cityHash64(TraceId) AS trace_key, groupArray(SpanId) AS ids, groupArray(ParentSpanId) AS parents,
           groupArray(toUInt8({IS_BOUNDARY})) AS boundary,
           groupArray(toUInt8({KIND} = 'Producer')) AS producer,
           groupArray(({_DAY}, toString(ServiceName), toString(SpanName), {CODE_FUNCTION}, toInt64(Duration),
                       {_NOT_CODE})) AS spans,
           max({IS_HOT_ROOT}) AS hot_trace,
           arrayMap(p -> indexOf(ids, p), parents) AS a1,
           arrayMap((b, j) -> toUInt8(b AND (j = 0 OR producer[j] = 1)), boundary, a1) AS below0,
           {walk}
    FROM {table}
    WHERE {_WINDOW} AND cityHash64(TraceId) IN (SELECT * FROM boundary_traces)
    GROUP BY trace_key
)
ARRAY JOIN spans AS span, below{_JUMPS} AS cold
WHERE (cold OR hot_trace) AND NOT span.6"""


def shared_calls_sql(table: str) -> str:
    """Per (day, path, service, function): calls and p99, over :func:`span_paths_sql`; ``op_key``
    names the function (cityHash64 of span name and function)."""
    return f"""
SELECT day, path, service, name, function, cityHash64(name, function) AS op_key, count() AS calls,
       quantile(0.99)(duration_ns) / 1e6 AS p99_ms
FROM ({span_paths_sql(table)})
WHERE day >= 0 AND day < {{days:Int64}}
GROUP BY day, path, service, name, function"""


def reaching_requests_sql(table: str) -> str:
    """Per (day, service, operation) of hot roots whose trace reaches, on its hot path, a function of
    ``{shared:Array(UInt64)}`` (``op_key`` values): requests and p99."""
    return f"""
SELECT {_DAY} AS day, toString(ServiceName) AS service, toString(SpanName) AS operation,
       count() AS requests, quantile(0.99)(Duration) / 1e6 AS p99_ms
FROM {table}
PREWHERE ParentSpanId = ''
WHERE {_WINDOW} AND {IS_HOT_ROOT} AND cityHash64(TraceId) IN (
    SELECT trace_key FROM ({span_paths_sql(table)})
    WHERE path = 'hot' AND has({{shared:Array(UInt64)}}, cityHash64(name, function))
)
GROUP BY day, service, operation"""


def batch_runs_sql(table: str) -> str:
    """Per (day, service, run name): runs (boundary spans and roots marked cold), the runs carrying a
    batch size and their items (:data:`BATCH_SIZE`)."""
    return f"""
SELECT {_DAY} AS day, toString(ServiceName) AS service, toString(SpanName) AS operation,
       count() AS runs, countIf({BATCH_SIZE} IS NOT NULL) AS sized_runs,
       sumIf(assumeNotNull({BATCH_SIZE}), {BATCH_SIZE} IS NOT NULL) AS items
FROM {table}
WHERE {_WINDOW} AND ({IS_BOUNDARY} OR (ParentSpanId = '' AND {IS_COLD_MARKED}))
GROUP BY day, service, operation"""


def unit_costs_sql(table: str) -> str:
    """Per (day, service, operation) of the units of work — hot requests (their root), runs (a root
    marked cold, or a consumer at the root of its trace) — the units, the runs carrying a batch size
    and their items, and the model calls and tokens of their traces: one GROUP BY per trace (its
    root and its LLM spans), then one per day and operation."""
    root = f"(ParentSpanId = '' AND ({IS_HOT_ROOT} OR {IS_COLD_MARKED} OR {IS_BOUNDARY}))"
    llm = f"(ParentSpanId != '' AND {MAYBE_LLM} AND {IS_LLM})"
    return f"""
SELECT day, service, operation, hot, toInt64(count()) AS units, toInt64(sum(sized)) AS sized_runs,
       sum(items) AS items, toInt64(sum(calls)) AS calls, toInt64(sum(tokens)) AS tokens
FROM (
    SELECT trace_key, anyIf(span_day, is_root) AS day, anyIf(span_service, is_root) AS service,
           anyIf(span_name, is_root) AS operation, maxIf(hot_root, is_root) AS hot,
           maxIf(toUInt8(size IS NOT NULL), is_root) AS sized, maxIf(ifNull(size, 0), is_root) AS items,
           countIf(is_llm) AS calls, sumIf(span_tokens, is_llm) AS tokens, countIf(is_root) AS roots
    FROM (
        SELECT cityHash64(TraceId) AS trace_key, {root} AS is_root, {llm} AS is_llm, {_DAY} AS span_day,
               toString(ServiceName) AS span_service, toString(SpanName) AS span_name,
               toUInt8({IS_HOT_ROOT}) AS hot_root, {BATCH_SIZE} AS size, {TOKENS} AS span_tokens
        FROM {table}
        PREWHERE ParentSpanId = '' OR {MAYBE_LLM}
        WHERE {_WINDOW} AND (is_root OR is_llm)
    )
    GROUP BY trace_key
    HAVING roots > 0
)
WHERE day >= 0 AND day < {{days:Int64}}
GROUP BY day, service, operation, hot"""


def retried_runs_sql(table: str) -> str:
    """Per retried job (runs sharing a ``messaging.message.id``, one of them failed) of the runs that
    carry a batch size: each try's start, failure, items, failed items (its direct children with an
    error status) and whether a hot request waits on it: the request's trace holds the run (a Celery
    worker's run below the enqueue), or the run links to it (a consumer in its own trace)."""
    return f"""
WITH hot_traces AS (
    SELECT DISTINCT cityHash64(TraceId) FROM {table}
    PREWHERE ParentSpanId = '' WHERE {_WINDOW} AND {IS_HOT_ROOT}
), runs AS (
    SELECT cityHash64(TraceId, SpanId) AS run_key, cityHash64(TraceId) AS trace_key, {_DAY} AS day,
           toString(ServiceName) AS service, toString(SpanName) AS operation,
           cityHash64({MESSAGE_ID}) AS message_key, toUnixTimestamp64Nano(Timestamp) AS start_ns,
           {RUN_FAILED} AS failed, assumeNotNull({BATCH_SIZE}) AS items,
           -- A run in its own trace, linked to the producer (messaging semconv): its first link.
           cityHash64(`Links.TraceId`[1]) AS linked_key
    FROM {table}
    WHERE {_WINDOW} AND ({IS_BOUNDARY} OR (ParentSpanId = '' AND {IS_COLD_MARKED}))
      AND {BATCH_SIZE} IS NOT NULL AND {MESSAGE_ID} != ''
), bad AS (
    SELECT cityHash64(TraceId, ParentSpanId) AS run_key, count() AS bad_items
    FROM {table}
    WHERE {_WINDOW} AND ParentSpanId != '' AND {STATUS} = 'Error'
      AND cityHash64(TraceId, ParentSpanId) IN (SELECT run_key FROM runs WHERE failed)
    GROUP BY run_key
)
SELECT service, operation, message_key,
       arraySort(t -> t.1, groupArray((start_ns, failed, items, bad_items, day,
                                       trace_key IN (SELECT * FROM hot_traces)
                                       OR linked_key IN (SELECT * FROM hot_traces)))) AS tries
FROM runs LEFT JOIN bad USING (run_key)
GROUP BY service, operation, message_key
HAVING countIf(failed) > 0 AND count() > 1"""


def queue_days_sql(table: str) -> str:
    """Per (queue, day): jobs enqueued and jobs completed that day, from the jobs reduced in SQL
    (:func:`analytics.cold_path.jobs_reduction_sql`)."""
    day = "toInt64(intDiv({v} - {{s_ns:Int64}}, {{day_ns:Int64}}))"
    enq, done = day.format(v="enqueued_ns"), day.format(v="assumeNotNull(ended_ns)")
    return f"""
SELECT queue, d.1 AS day, toInt64(sum(d.2)) AS enqueued, toInt64(sum(d.3)) AS completed
FROM ({jobs_reduction_sql(jobs_sql(table))})
ARRAY JOIN [({enq}, 1, 0), (if(ended_ns IS NULL, -1, {done}), 0, if(ended_ns IS NULL, 0, 1))] AS d
WHERE d.1 >= 0 AND d.1 < {{days:Int64}}
GROUP BY queue, day"""


# --- reads -----------------------------------------------------------------------------------------
def drift_report(
    store: Store,
    end: datetime,
    conventions: Conventions | None = None,
    *,
    days: int | None = None,
    covered: Iterable[tuple[str, str]] = (),
) -> list[DriftFinding]:
    """The drift findings over the ``days`` (default ``drift_days``) days before ``end``, by day.
    ``covered``: (service glob, operation glob) pairs that have a latency target (the ``latency_slo``
    rules); the conventions' ``latency_budgets`` count too."""
    conv = conventions or Conventions()
    days = conv.drift_days if days is None else days
    if days < 2 * conv.drift_edge_days:
        raise AnalysisError(
            f"the drift window needs at least {2 * conv.drift_edge_days} days (twice drift_edge_days), "
            f"got {days}: try --drift-days 14"
        )
    end = as_utc(end)
    start = end - timedelta(days=days)
    table = store.table(TRACES_TABLE)
    adapt = inspect_traces(store).adapt
    params = {
        **conv.sql_parameters(),
        "s": start,
        "e": end,
        "s_ns": int(start.timestamp()) * 1_000_000_000 + start.microsecond * 1000,
        "day_ns": _DAY_NS,
        "days": days,
    }
    calls = normalize(store.query_polars(adapt(shared_calls_sql(table)), params))
    runs = normalize(store.query_polars(adapt(batch_runs_sql(table)), params))
    costs = normalize(store.query_polars(adapt(unit_costs_sql(table)), params))
    queues = normalize(store.query_polars(adapt(queue_days_sql(table)), params))
    shared = shared_keys(calls, conv)
    retried = store.query_rows(adapt(retried_runs_sql(table)), params)
    reaching = pl.DataFrame()
    if shared:
        reaching = normalize(
            store.query_polars(adapt(reaching_requests_sql(table)), {**params, "shared": shared})
        )
    findings = drift_findings(
        start, days, calls, runs, queues, reaching, conv, covered, costs=costs, retried=retried
    )
    services = sorted({f.service for f in findings if f.service})
    if not services:
        return findings
    # The versions of the findings' services and when each was first seen in the window (the
    # releases' own read: one GROUP BY on the services' range of the span table).
    versions = normalize(
        store.query_polars(
            adapt(first_seen_sql(table)),
            {**params, "lo1": start, "hi1": end, "lo2": end, "hi2": end, "services": services},
        )
    )
    return with_releases(findings, versions, start, conv.drift_edge_days)


def with_releases(
    findings: Sequence[DriftFinding], versions: pl.DataFrame, start: datetime, edge_days: int
) -> list[DriftFinding]:
    """Each finding with the release its change arrived with (``since_release``): of the versions
    of its service (``versions``: service, version, first_seen), the one first seen last among
    those first seen after the first ``edge_days`` days ("then": already there) and before the end
    of its ``since`` day. Pure."""
    first: dict[str, list[tuple[datetime, str]]] = {}
    for row in versions.iter_rows(named=True):
        first.setdefault(str(row["service"]), []).append((as_utc(row["first_seen"]), str(row["version"])))
    after = start + timedelta(days=edge_days)
    out = []
    for f in findings:
        arrived = sorted(
            (seen, version)
            for seen, version in first.get(f.service, [])
            if after <= seen < f.since + timedelta(days=1)
        )
        out.append(replace(f, since_release=arrived[-1][1]) if arrived else f)
    return out


def stored_drift_report(
    store: Store,
    end: datetime,
    conventions: Conventions | None = None,
    *,
    days: int | None = None,
    covered: Iterable[tuple[str, str]] = (),
) -> list[DriftFinding]:
    """:func:`drift_report` of the ``days`` before ``end`` taken on the hour, read once per store
    and hour: the first reader stores the findings (``tailwatch_drift_reports``), the others — a
    cron ``alerts evaluate`` every minute, ``analyze`` — read them. The report reads days of raw
    spans (seconds on millions of spans): at most one evaluation an hour pays for it."""
    conv = conventions or Conventions()
    days = conv.drift_days if days is None else days
    hour = _hour(end)
    covered = tuple(sorted(covered))
    key = hashlib.sha256(
        json.dumps(
            {"days": days, "covered": covered, "conventions": conv.to_dict(), "format": _REPORT_FORMAT},
            sort_keys=True,
            default=str,
        ).encode()
    ).hexdigest()[:16]
    if not store.table_exists(DRIFT_REPORTS_TABLE):
        # A store tailwatch's schema was not applied to (`tailwatch schema apply`): read, not kept.
        return drift_report(store, hour, conv, days=days, covered=covered)
    table = store.table(DRIFT_REPORTS_TABLE)
    params = {"end": hour, "key": key}
    rows = store.query_rows(
        f"SELECT findings FROM {table} WHERE end = {{end:DateTime64(3)}} AND key = {{key:String}} "
        "ORDER BY built_at DESC LIMIT 1",
        params,
    )
    if rows:
        return [_finding_of(item) for item in json.loads(rows[0][0])]
    findings = drift_report(store, hour, conv, days=days, covered=covered)
    try:
        store.command(
            f"INSERT INTO {table} (end, key, findings, built_at) "
            "VALUES ({end:DateTime64(3)}, {key:String}, {findings:String}, now64(3))",
            {**params, "findings": json.dumps([f.to_dict() for f in findings])},
        )
    except StoreError as exc:
        # A read-only user still gets its report; the next reader computes it again.
        _log.warning("drift report not kept: %s", exc)
    return findings


def _finding_of(item: dict[str, Any]) -> DriftFinding:
    return DriftFinding(
        kind=item["kind"],
        service=item["service"],
        operation=item["operation"],
        queue=item["queue"],
        since=_day_of(item["since"]),
        evidence=dict(item["evidence"]),
        severity=item["severity"],
        by_day=[
            {k: _day_of(v) if k == "day" else v for k, v in row.items()} for row in item.get("by_day", [])
        ],
        since_release=item.get("since_release"),
    )


def _day_of(value: str) -> datetime:
    return as_utc(datetime.fromisoformat(value.replace("Z", "+00:00")))


# --- metric logic (pure) ---------------------------------------------------------------------------
def shared_keys(calls: pl.DataFrame, conv: Conventions) -> list[int]:
    """``op_key`` of the functions reached from both paths over the window, with at least
    ``drift_min_calls`` calls. Pure."""
    if calls.is_empty():
        return []
    per = calls.group_by("op_key").agg(
        pl.col("calls").filter(pl.col("path") == "hot").sum().alias("hot"),
        pl.col("calls").filter(pl.col("path") == "cold").sum().alias("cold"),
    )
    both = per.filter(
        (pl.col("hot") > 0) & (pl.col("cold") > 0) & (pl.col("hot") + pl.col("cold") >= conv.drift_min_calls)
    )
    return sorted(int(k) for k in both["op_key"])


def _grid(frame: pl.DataFrame, keys: list[str], days: int, values: list[str]) -> pl.DataFrame:
    """``frame`` summed per (keys, day) on every day of the window (0 where nothing happened)."""
    summed = frame.group_by([*keys, "day"]).agg(pl.col(v).sum() for v in values)
    grid = (
        summed.select(keys)
        .unique()
        .join(pl.DataFrame({"day": list(range(days))}, schema={"day": pl.Int64}), how="cross")
    )
    return (
        grid.join(summed.with_columns(pl.col("day").cast(pl.Int64)), on=[*keys, "day"], how="left")
        .with_columns(pl.col(v).fill_null(0) for v in values)
        .sort([*keys, "day"])
    )


def _edges(values: list[float], edge: int) -> tuple[float, float]:
    return sum(values[:edge]) / edge, sum(values[-edge:]) / edge


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _series(day: Any, days: int, **columns: Sequence[Any]) -> list[dict[str, Any]]:
    """One dict per day of the window: its start (``day``) and each column's value that day."""
    return [{"day": day(i), **{k: v[i] for k, v in columns.items()}} for i in range(days)]


def _daily_p99(rows: pl.DataFrame, days: int) -> list[float | None]:
    """Per day of the window, the calls-weighted mean of that day's p99s (:func:`_weighted_p99`)."""
    return [_weighted_p99(rows.filter(pl.col("day") == i)) for i in range(days)]


def drift_findings(
    start: datetime,
    days: int,
    calls: pl.DataFrame,
    runs: pl.DataFrame,
    queues: pl.DataFrame,
    reaching: pl.DataFrame,
    conv: Conventions,
    covered: Iterable[tuple[str, str]] = (),
    *,
    costs: pl.DataFrame | None = None,
    retried: Sequence[Sequence[Any]] = (),
) -> list[DriftFinding]:
    """The findings from the per-day rows of :func:`shared_calls_sql`, :func:`batch_runs_sql`,
    :func:`queue_days_sql`, :func:`reaching_requests_sql`, :func:`unit_costs_sql` and
    :func:`retried_runs_sql`. Pure."""

    def day(index: int) -> datetime:
        return start + timedelta(days=index)

    found: list[DriftFinding] = []
    found += _shared_operations(calls, days, conv, day)
    found += _batches(runs, days, conv, day)
    found += _unit_costs(costs if costs is not None else pl.DataFrame(), days, conv, day)
    found += _queues(queues, days, conv, day)
    found += _whole_batch_retries(retried, days, conv, day)
    found += _no_targets(reaching, days, conv, day, list(covered))
    # Two or more kinds of symptom in one service: an online service never designed as one.
    kinds: dict[str, set[str]] = {}
    for f in found:
        if f.service:
            kinds.setdefault(f.service, set()).add(f.kind)
    out = [
        DriftFinding(
            f.kind,
            f.service,
            f.operation,
            f.queue,
            f.since,
            f.evidence,
            "critical" if len(kinds.get(f.service, ())) >= 2 else "warning",
            f.by_day,
        )
        for f in found
    ]
    return sorted(out, key=lambda f: (DRIFT_KINDS.index(f.kind), f.service, f.operation, f.queue))


def _shared_operations(calls: pl.DataFrame, days: int, conv: Conventions, day: Any) -> list[DriftFinding]:
    if calls.is_empty():
        return []
    edge, threshold = conv.drift_edge_days, conv.drift_hot_share
    shared = set(shared_keys(calls, conv))
    rows = calls.filter(pl.col("op_key").is_in(list(shared)))
    if rows.is_empty():
        return []
    by_path = rows.with_columns(
        pl.when(pl.col("path") == "hot").then(pl.col("calls")).otherwise(0).alias("hot"),
        pl.when(pl.col("path") == "cold").then(pl.col("calls")).otherwise(0).alias("cold"),
    )
    grid = _grid(by_path, ["op_key"], days, ["hot", "cold"])
    out = []
    for (op_key,), g in grid.group_by("op_key", maintain_order=True):
        hot, cold = g["hot"].to_list(), g["cold"].to_list()
        hot_then, hot_now = sum(hot[:edge]), sum(hot[-edge:])
        all_then, all_now = hot_then + sum(cold[:edge]), hot_now + sum(cold[-edge:])
        if all_then == 0 or all_now == 0:
            continue  # not called then or not now: a share that did not move, it appeared or ended
        share_then, share_now = hot_then / all_then, hot_now / all_now
        if not (share_then < threshold <= share_now):
            continue
        crossed = [
            i for i in range(days) if hot[i] + cold[i] > 0 and hot[i] / (hot[i] + cold[i]) >= threshold
        ]
        mine = rows.filter(pl.col("op_key") == op_key)
        hot_rows, cold_rows = mine.filter(pl.col("path") == "hot"), mine.filter(pl.col("path") == "cold")
        recent = pl.col("day") >= days - edge
        name, function = str(mine["name"][0]), str(mine["function"][0])
        # The service whose requests now reach it, by calls over the last days.
        services = (
            hot_rows.group_by("service")
            .agg(pl.col("calls").sum())
            .sort(["calls", "service"], descending=[True, False])
        )
        out.append(
            DriftFinding(
                "shared_operation",
                str(services["service"][0]),
                f"{name} ({function})" if function else name,
                "",
                day(crossed[0]),
                {
                    "span_name": name,
                    "function": function,
                    "hot_calls_per_day_then": hot_then / edge,
                    "hot_calls_per_day_now": hot_now / edge,
                    "cold_calls_per_day_then": (all_then - hot_then) / edge,
                    "cold_calls_per_day_now": (all_now - hot_now) / edge,
                    "hot_share_then": share_then,
                    "hot_share_now": share_now,
                    "hot_p99_ms_now": _weighted_p99(hot_rows.filter(recent)),
                    "cold_p99_ms_now": _weighted_p99(cold_rows.filter(recent)),
                    "cold_services": ",".join(sorted(set(cold_rows["service"].to_list()))),
                },
                by_day=_series(
                    day,
                    days,
                    hot_calls=hot,
                    cold_calls=cold,
                    hot_share=[_ratio(h, h + c) for h, c in zip(hot, cold, strict=True)],
                    hot_p99_ms=_daily_p99(hot_rows, days),
                    cold_p99_ms=_daily_p99(cold_rows, days),
                ),
            )
        )
    return out


def _weighted_p99(rows: pl.DataFrame) -> float | None:
    """The calls-weighted mean of daily p99s (per-day quantiles do not merge exactly)."""
    total = float(rows["calls"].sum()) if not rows.is_empty() else 0.0
    if not total:
        return None
    return float((rows["p99_ms"] * rows["calls"]).sum()) / total


def _batches(runs: pl.DataFrame, days: int, conv: Conventions, day: Any) -> list[DriftFinding]:
    if runs.is_empty():
        return []
    edge, factor = conv.drift_edge_days, conv.drift_batch_factor
    grid = _grid(runs, ["service", "operation"], days, ["runs", "sized_runs", "items"])
    out = []
    for (service, operation), g in grid.group_by("service", "operation", maintain_order=True):
        n, sized, items = g["runs"].to_list(), g["sized_runs"].to_list(), g["items"].to_list()
        sized_then, sized_now = sum(sized[:edge]), sum(sized[-edge:])
        if not sized_then or not sized_now:
            continue  # no batch size then or now: items per run unknown
        runs_then, runs_now = _edges([float(x) for x in n], edge)
        per_run_then = float(sum(items[:edge])) / sized_then
        per_run_now = float(sum(items[-edge:])) / sized_now
        if not (runs_then > 0 and runs_now >= factor * runs_then and per_run_now * factor <= per_run_then):
            continue
        began = [
            i
            for i in range(edge, days)
            if n[i] > runs_then and sized[i] and items[i] / sized[i] < per_run_then
        ]
        out.append(
            DriftFinding(
                "batch_shrinking",
                str(service),
                str(operation),
                "",
                day(began[0] if began else days - edge),
                {
                    "runs_per_day_then": runs_then,
                    "runs_per_day_now": runs_now,
                    "items_per_run_then": per_run_then,
                    "items_per_run_now": per_run_now,
                },
                by_day=_series(
                    day,
                    days,
                    runs=n,
                    items_per_run=[_ratio(i, k) for i, k in zip(items, sized, strict=True)],
                ),
            )
        )
    return out


def _unit_costs(costs: pl.DataFrame, days: int, conv: Conventions, day: Any) -> list[DriftFinding]:
    if costs.is_empty():
        return []
    edge, factor = conv.drift_edge_days, conv.drift_cost_factor
    grid = _grid(
        costs, ["service", "operation", "hot"], days, ["units", "sized_runs", "items", "calls", "tokens"]
    )
    out = []
    for (service, operation, hot), g in grid.group_by("service", "operation", "hot", maintain_order=True):
        units, sized, items = g["units"].to_list(), g["sized_runs"].to_list(), g["items"].to_list()
        calls, tokens = g["calls"].to_list(), g["tokens"].to_list()
        # The unit of work: a hot request; a run's items where every run says how many, else a run.
        by_item = not hot and sum(sized) == sum(units)
        work = [float(i) if by_item else float(u) for i, u in zip(items, units, strict=True)]
        w_then, w_now = sum(work[:edge]), sum(work[-edge:])
        if not w_then or not w_now:
            continue
        per = {
            name: (sum(v[:edge]) / w_then, sum(v[-edge:]) / w_now)
            for name, v in (("calls", calls), ("tokens", tokens))
        }
        rising = [n for n, (then, now) in per.items() if then > 0 and now >= factor * then]
        if not rising:
            continue
        # The first day after the first days whose cost per unit was already past the factor.
        name = rising[-1]
        then = per[name][0]
        values = calls if name == "calls" else tokens
        began = [i for i in range(edge, days) if work[i] and values[i] / work[i] >= factor * then]
        unit = "request" if hot else "item" if by_item else "run"
        out.append(
            DriftFinding(
                "unit_cost_rising",
                str(service),
                str(operation),
                "",
                day(began[0] if began else days - edge),
                {
                    "unit": unit,
                    "units_per_day_then": w_then / edge,
                    "units_per_day_now": w_now / edge,
                    "calls_per_unit_then": per["calls"][0],
                    "calls_per_unit_now": per["calls"][1],
                    "tokens_per_unit_then": per["tokens"][0],
                    "tokens_per_unit_now": per["tokens"][1],
                },
                by_day=_series(
                    day,
                    days,
                    units=work,
                    calls_per_unit=[_ratio(c, w) for c, w in zip(calls, work, strict=True)],
                    tokens_per_unit=[_ratio(t, w) for t, w in zip(tokens, work, strict=True)],
                ),
            )
        )
    return out


def _slope(values: list[float]) -> float:
    """Least-squares slope of ``values`` over their index."""
    n = len(values)
    mean_x, mean_y = (n - 1) / 2, sum(values) / n
    den = sum((i - mean_x) ** 2 for i in range(n))
    return sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values)) / den if den else 0.0


def _queues(queues: pl.DataFrame, days: int, conv: Conventions, day: Any) -> list[DriftFinding]:
    if queues.is_empty():
        return []
    edge = conv.drift_edge_days
    grid = _grid(queues, ["queue"], days, ["enqueued", "completed"])
    out = []
    for (queue,), g in grid.group_by("queue", maintain_order=True):
        enq, done = g["enqueued"].to_list(), g["completed"].to_list()
        backlog, total = [], 0
        for e, c in zip(enq, done, strict=True):
            total += e - c
            backlog.append(float(total))
        recent = backlog[-edge:]
        slope = _slope(recent)
        enq_then, enq_now = _edges([float(x) for x in enq], edge)
        done_then, done_now = _edges([float(x) for x in done], edge)
        # Each of the last days enqueued more than it completed: jobs in flight at the window's end
        # (a backlog on the last day alone) are not a trend.
        grew = all(e > c for e, c in zip(enq[-edge:], done[-edge:], strict=True))
        if not (grew and backlog[-1] > 0 and slope > conv.drift_backlog_growth * enq_now):
            continue
        # The trend began with the trailing run of days that enqueued more than they completed.
        first = days - 1
        while first > 0 and enq[first - 1] > done[first - 1]:
            first -= 1
        out.append(
            DriftFinding(
                "queue_unbounded",
                "",
                "",
                str(queue),
                day(first),
                {
                    "enqueued_per_day_then": enq_then,
                    "enqueued_per_day_now": enq_now,
                    "completed_per_day_then": done_then,
                    "completed_per_day_now": done_now,
                    "backlog_now": backlog[-1],
                    "backlog_slope_per_day": slope,
                },
                by_day=_series(day, days, enqueued=enq, completed=done, backlog=backlog),
            )
        )
    return out


def _whole_batch_retries(
    retried: Sequence[Sequence[Any]], days: int, conv: Conventions, day: Any
) -> list[DriftFinding]:
    """Per (service, run): the retries after a failed try reprocess its whole batch when they process
    at least ``drift_retry_reprocessed`` items per item that failed (its children with an error
    status; a failed try without one counts one: the bad record)."""
    edge = conv.drift_edge_days
    per: dict[tuple[str, str], dict[str, Any]] = {}
    for service, operation, _, tries in retried:
        first_failed = next(i for i, t in enumerate(tries) if t[1])
        failed_items = sum(max(int(t[3] or 0), 1) for t in tries if t[1])
        reprocessed = sum(float(t[2]) for t in tries[first_failed + 1 :])
        acc = per.setdefault(
            (str(service), str(operation)),
            {
                "jobs": 0,
                "jobs_now": 0,
                "failed": 0,
                "reprocessed": 0.0,
                "waiting": 0,
                "first": days,
                "by_day": [[0, 0, 0.0] for _ in range(days)],
            },
        )
        # By the day the job first failed: retried jobs, failed items, items reprocessed.
        failed_day = int(tries[first_failed][4])
        if 0 <= failed_day < days:
            on_day = acc["by_day"][failed_day]
            on_day[0] += 1
            on_day[1] += failed_items
            on_day[2] += reprocessed
        acc["jobs"] += 1
        acc["jobs_now"] += int(tries[first_failed][4]) >= days - edge
        acc["failed"] += failed_items
        acc["reprocessed"] += reprocessed
        acc["waiting"] += int(any(t[5] for t in tries))
        acc["first"] = min(acc["first"], int(tries[first_failed][4]))
    out = []
    for (service, operation), acc in sorted(per.items()):
        ratio = acc["reprocessed"] / acc["failed"] if acc["failed"] else 0.0
        if not acc["jobs_now"] or ratio < conv.drift_retry_reprocessed:
            continue
        out.append(
            DriftFinding(
                "whole_batch_retry",
                service,
                operation,
                "",
                day(max(acc["first"], 0)),
                {
                    "retried_jobs": acc["jobs"],
                    "retried_jobs_now": acc["jobs_now"],
                    "failed_items": acc["failed"],
                    "items_reprocessed": acc["reprocessed"],
                    "items_reprocessed_per_failed_item": ratio,
                    "jobs_hot_requests_waited_on": acc["waiting"],
                },
                by_day=_series(
                    day,
                    days,
                    retried_jobs=[d[0] for d in acc["by_day"]],
                    failed_items=[d[1] for d in acc["by_day"]],
                    items_reprocessed=[d[2] for d in acc["by_day"]],
                ),
            )
        )
    return out


def _no_targets(
    reaching: pl.DataFrame, days: int, conv: Conventions, day: Any, covered: list[tuple[str, str]]
) -> list[DriftFinding]:
    if reaching.is_empty():
        return []
    targets = covered + [(s, o) for s, o, _ in conv.latency_budgets]
    edge = conv.drift_edge_days
    out = []
    for (service, operation), g in reaching.sort("day").group_by("service", "operation", maintain_order=True):
        requests = int(g["requests"].sum())
        if requests < conv.drift_min_requests:
            continue
        if any(fnmatchcase(str(service), s) and fnmatchcase(str(operation), o) for s, o in targets):
            continue
        recent = g.filter(pl.col("day") >= days - edge)
        out.append(
            DriftFinding(
                "no_latency_target",
                str(service),
                str(operation),
                "",
                day(int(g["day"].min())),  # type: ignore[arg-type]
                {
                    "requests": requests,
                    "requests_per_day_now": float(recent["requests"].sum()) / edge,
                    "p99_ms_now": _weighted_p99(recent.rename({"requests": "calls"})),
                },
                by_day=_series(
                    day,
                    days,
                    requests=[int(g.filter(pl.col("day") == i)["requests"].sum()) for i in range(days)],
                    p99_ms=_daily_p99(g.rename({"requests": "calls"}), days),
                ),
            )
        )
    return out
