"""Summaries give the figures a full analysis of the raw spans gives.

One store holds several scenarios at once, shifted so that they share one hour (and its baseline):
an LLM regression, releases in sequence with one inside the window, queues with a starved tail, an
abandonment cliff, workflow retries, a flag split and operations with latency budgets. The expected
answer is always ``analyze(..., use_summaries=False)`` on the same store, plus a few facts taken
from the generated spans themselves (how many requests, when a version first appeared).

The embedded engine allows one open store per process: the store is filled once and summarised
once per module, closed, and every test works on a copy of its directory.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal
from starlette.applications import Starlette
from starlette.testclient import TestClient

from analytics import (
    FRAME_SCHEMAS,
    Analysis,
    Conventions,
    SummaryBuild,
    analyze,
    build_summaries,
    load_run,
    summary_coverage,
)
from analytics.cold_path import cold_path_cdf
from collectors import TRACES_TABLE
from collectors.spans import SpanEvent, SpanRow, insert_spans, new_span_id
from dashboards import export_dashboards
from slo_rules.source import AnalyticsSource
from storage import Store, as_utc, ensure_schema, iso_z, open_store
from tailwatch.api import ServiceApi, api_routes
from tailwatch.config import TailwatchConfig
from tests.analytics.builders import (
    MS,
    S,
    at,
    dt,
    hot_request,
    scenario_abandonment_cliff,
    scenario_boundary,
    scenario_cold_queues,
    scenario_flag_split,
    scenario_llm_regression,
    scenario_release_coupling,
    scenario_retries,
)

HOUR = 3600.0
# The analysed hour starts and ends 17 s past a minute; its default baseline is the hour before.
START = dt(at(HOUR + 17))
END = dt(at(2 * HOUR + 17))
BASELINE_START = dt(at(17))
# Summaries are built up to here: past the window's end and its trace margin.
UNTIL = dt(at(3 * HOUR))
# Release 1.2.0 of the release scenario lands here, inside the window.
RELEASE_AT = at(1.5 * HOUR)
RELEASE_SERVICE = "release-api"


def _shift(spans: list[SpanRow], seconds: float) -> list[SpanRow]:
    """The spans moved in time by ``seconds``, their events with them."""
    offset = int(seconds * S)
    return [
        replace(
            span,
            start_ns=span.start_ns + offset,
            events=tuple(replace(e, timestamp_ns=e.timestamp_ns + offset) for e in span.events),
        )
        for span in spans
    ]


def _is_request_root(span: SpanRow) -> bool:
    # Every hot-path request of the builders has a Server root span.
    return span.parent_span_id == "" and span.kind == "Server"


def _requests_in(spans: list[SpanRow], start: datetime, end: datetime) -> dict[tuple[str, str], int]:
    """Distinct requests per (service, operation) whose root starts in [start, end), from the spans."""
    lo, hi = int(start.timestamp()) * S, int(end.timestamp()) * S
    seen: dict[tuple[str, str], set[str]] = {}
    for span in spans:
        if _is_request_root(span) and lo <= span.start_ns < hi:
            seen.setdefault((span.service, span.name), set()).add(span.trace_id)
    return {key: len(ids) for key, ids in seen.items()}


@dataclass(frozen=True)
class Dataset:
    spans: list[SpanRow]
    budgets: list[dict[str, Any]]  # the latency_budgets convention, as a config file gives it
    conventions: Conventions
    boundary_expected: dict[tuple[str, str], str]


def _with_anatomy(spans: list[SpanRow]) -> list[SpanRow]:
    """The model calls with what instrumentations record of their anatomy: a third with the GenAI
    convention's time to first chunk (util-genai), a third with a chunk event per token's batch
    (OpenLLMetry), the rest with neither; every other call with cached input tokens."""
    out = []
    n = 0
    for span in spans:
        if span.attributes.get("gen_ai.operation.name") != "chat":
            out.append(span)
            continue
        n += 1
        attrs = dict(span.attributes)
        first = span.duration_ns * (0.2 + (n % 7) * 0.05)
        events: tuple[SpanEvent, ...] = span.events
        if n % 3 == 0:
            attrs["gen_ai.response.time_to_first_chunk"] = repr(first / 1e9)
        elif n % 3 == 1:
            events = tuple(
                SpanEvent(
                    span.start_ns + int(first + k * (span.duration_ns - first) / 4),
                    "gen_ai.content.completion.chunk",
                )
                for k in range(4)
            )
        if n % 2 == 0 and "gen_ai.usage.input_tokens" in attrs:
            attrs["gen_ai.usage.cache_read.input_tokens"] = str(int(attrs["gen_ai.usage.input_tokens"]) // 2)
        out.append(replace(span, attributes=attrs, events=events))
    return out


def _dataset() -> Dataset:
    # An LLM regression: the baseline hour [T0, T0+1h), the current hour after it.
    llm = _with_anatomy(scenario_llm_regression(requests=150).spans)
    # Four versions released every 6 h (100 requests each), moved so that 1.2.0 — the one that adds
    # an LLM call — is released half-way through the window, after 1.0.0 and 1.1.0.
    releases = [
        replace(span, service=RELEASE_SERVICE)
        for span in _shift(scenario_release_coupling(per_release=100).spans, (RELEASE_AT - at(12 * HOUR)) / S)
    ]
    cold = _shift(scenario_cold_queues(jobs=150).spans, HOUR + 30)
    abandonment = _shift(scenario_abandonment_cliff(requests=300).spans, HOUR + 40)
    # Workflow runs in the window and in its baseline.
    retries = _shift(scenario_retries(runs=60).spans, HOUR + 50) + _shift(scenario_retries(runs=40).spans, 50)
    flags = _shift(scenario_flag_split(requests=300).spans, HOUR + 20)
    # The boundary scenario's operations with a configured budget (its other operations are the
    # release and abandonment scenarios above), their first 2.5 hours.
    boundary = scenario_boundary(per_release=1)
    keep = {
        s.trace_id
        for s in boundary.spans
        if _is_request_root(s) and s.service in ("status", "reports") and s.start_ns < at(2.5 * HOUR)
    }
    budgeted = [s for s in boundary.spans if s.trace_id in keep]
    spans = llm + releases + cold + abandonment + retries + flags + budgeted
    recommendations = boundary.expected["recommendation"]
    budgets = boundary.expected["budgets"]
    assert isinstance(recommendations, dict) and isinstance(budgets, list)
    return Dataset(
        spans=spans,
        budgets=budgets,
        conventions=Conventions.from_dict({"latency_budgets": budgets}),
        boundary_expected={
            key: value for key, value in recommendations.items() if key[0] in ("status", "reports")
        },
    )


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return _dataset()


@dataclass(frozen=True)
class Prepared:
    filled: Path  # a closed store holding the spans, no summaries
    built: Path  # a closed store holding the spans and their summaries up to UNTIL
    build: SummaryBuild
    coverage: list[tuple[datetime, datetime]]
    first_span: datetime


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory, dataset: Dataset) -> Prepared:
    root = tmp_path_factory.mktemp("summaries")
    filled = root / "filled"
    store = open_store("chdb://" + str(filled))
    try:
        ensure_schema(store)
        insert_spans(store, dataset.spans)
    finally:
        store.close()
    built = root / "built"
    shutil.copytree(filled, built, symlinks=True)
    store = open_store("chdb://" + str(built))
    try:
        build = build_summaries(store, until=UNTIL, conventions=dataset.conventions)
        coverage = summary_coverage(store)
    finally:
        store.close()
    first = min(s.start_ns for s in dataset.spans)
    return Prepared(filled, built, build, coverage, dt(first - first % (60 * S)))


def _open_copy(source: Path, target: Path) -> Store:
    shutil.copytree(source, target, symlinks=True)
    return open_store("chdb://" + str(target))


@pytest.fixture
def built_store(prepared: Prepared, tmp_path: Path) -> Iterator[Store]:
    """A copy of the summarised store, for a test to read and change."""
    store = _open_copy(prepared.built, tmp_path / "store")
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def filled_store(prepared: Prepared, tmp_path: Path) -> Iterator[Store]:
    """A copy of the store with the spans and no summaries."""
    store = _open_copy(prepared.filled, tmp_path / "store")
    try:
        yield store
    finally:
        store.close()


@dataclass(frozen=True)
class WindowAnalyses:
    summarised: Analysis  # the first analysis of the window (tails not walked yet are walked)
    summarised_again: Analysis  # the second (every walk read back from the summaries)
    full: Analysis


@pytest.fixture(scope="module")
def window_analyses(
    prepared: Prepared, dataset: Dataset, tmp_path_factory: pytest.TempPathFactory
) -> WindowAnalyses:
    store = _open_copy(prepared.built, tmp_path_factory.mktemp("window") / "store")
    try:
        conv = dataset.conventions
        summarised = analyze(store, START, END, conventions=conv)
        again = analyze(store, START, END, conventions=conv)
        full = analyze(store, START, END, conventions=conv, use_summaries=False)
    finally:
        store.close()
    return WindowAnalyses(summarised, again, full)


# --- comparing analyses --------------------------------------------------------------------------


def assert_same_analysis(got: Analysis, want: Analysis, label: str = "") -> None:
    """Every figure: the JSON object, then every frame (values, dtypes, row order)."""
    got_dict, want_dict = got.to_dict(), want.to_dict()
    for section in want_dict:
        assert got_dict[section] == want_dict[section], f"{label}: JSON section {section!r} differs"
    assert got_dict == want_dict, label
    assert got.frames.keys() == want.frames.keys()
    for name, frame in want.frames.items():
        try:
            assert_frame_equal(got.frames[name], frame)
        except AssertionError as exc:
            raise AssertionError(f"{label}: frame {name!r} differs: {exc}") from None


def _hot_row(analysis: Analysis, service: str, operation: str) -> dict[str, Any]:
    rows = analysis.hot_path.filter((pl.col("service") == service) & (pl.col("operation") == operation))
    assert rows.height == 1, (service, operation, analysis.hot_path)
    return rows.row(0, named=True)


def _request_counts(analysis: Analysis) -> dict[tuple[str, str], int]:
    return {(r["service"], r["operation"]): r["requests"] for r in analysis.hot_path.iter_rows(named=True)}


# --- the summaries themselves --------------------------------------------------------------------


def test_build_summarises_every_minute_from_the_first_span(prepared: Prepared) -> None:
    build = prepared.build
    assert build.built_from == prepared.first_span
    assert build.built_until == UNTIL
    assert build.minutes == (UNTIL - prepared.first_span) // timedelta(minutes=1)
    assert build.resummarised == 0
    assert build.rows and all(n >= 0 for n in build.rows.values()) and sum(build.rows.values()) > 0
    assert prepared.coverage == [(prepared.first_span, UNTIL)]
    assert "0 minutes again" in build.describe()


def test_a_second_build_with_nothing_new_does_nothing(built_store: Store, dataset: Dataset) -> None:
    again = build_summaries(built_store, until=UNTIL, conventions=dataset.conventions)
    assert (again.built_from, again.minutes, again.resummarised) == (None, 0, 0)
    assert again.describe() == "summaries up to date"


def test_the_mix_gives_every_metric_something_to_compare(
    window_analyses: WindowAnalyses, dataset: Dataset
) -> None:
    # The comparisons below mean something only if every metric has rows in this window.
    full = window_analyses.full
    # Hedged calls already in production are rare and this mix has none: tests/integrations/
    # test_hedge_spans.py checks them on the real client's spans.
    for name in (n for n in FRAME_SCHEMAS if n != "existing_hedges"):
        assert full.frames[name].height > 0, f"no {name} rows in the window"
    assert _request_counts(full) == _requests_in(dataset.spans, START, END)
    baseline = full.retry_amplification.row(0, named=True)
    assert baseline["runs"] > 0 and baseline["baseline_runs"] > 0


def test_the_anatomy_reads_first_tokens_and_cached_tokens_as_the_spans_carry_them(
    window_analyses: WindowAnalyses, dataset: Dataset
) -> None:
    lo, hi = int(START.timestamp() * S), int(END.timestamp() * S)
    # Every call to the model in the window, whichever service made it (the anatomy is per model).
    chat = [
        s
        for s in dataset.spans
        if s.attributes.get("gen_ai.request.model") == "gpt-4o"
        and s.attributes.get("gen_ai.provider.name") == "openai"
        and lo <= s.start_ns < hi
    ]
    firsts = []
    for s in chat:
        if "gen_ai.response.time_to_first_chunk" in s.attributes:
            firsts.append(float(s.attributes["gen_ai.response.time_to_first_chunk"]) * 1000)
        elif s.events:
            firsts.append((min(e.timestamp_ns for e in s.events) - s.start_ns) / 1e6)
    assert 0 < len(firsts) < len(chat)
    row = window_analyses.summarised.llm_anatomy.filter(pl.col("model") == "gpt-4o").row(0, named=True)
    assert row["ttft_source"] == "attribute"
    assert row["ttft_p50_ms"] == pytest.approx(float(np.quantile(firsts, 0.5)), rel=0.005)
    inputs = sum(int(s.attributes.get("gen_ai.usage.input_tokens", 0)) for s in chat)
    cached = sum(int(s.attributes.get("gen_ai.usage.cache_read.input_tokens", 0)) for s in chat)
    assert row["cached_input_ratio"] == pytest.approx(cached / inputs)
    calls = window_analyses.full.llm_calls.filter(pl.col("model") == "gpt-4o")["calls"].sum()
    assert row["calls"] == calls
    assert row["streamed_calls"] == len(firsts)


# --- 1a. a window that starts and ends mid-minute ------------------------------------------------


def test_mid_minute_window_equals_full_recompute(
    window_analyses: WindowAnalyses, prepared: Prepared, dataset: Dataset
) -> None:
    # The window and its default baseline lie wholly inside the summaries.
    assert window_analyses.full.baseline_start == BASELINE_START
    assert prepared.coverage[0][0] <= BASELINE_START and prepared.coverage[-1][1] > END
    assert_same_analysis(window_analyses.summarised, window_analyses.full, "first summarised analysis")
    # The tails walked by the first analysis were kept: the second reads them and agrees.
    assert_same_analysis(window_analyses.summarised_again, window_analyses.full, "second summarised analysis")
    # Known truth: the requests generated in the window, counted from the spans.
    assert _request_counts(window_analyses.summarised) == _requests_in(dataset.spans, START, END)
    for key, recommendation in dataset.boundary_expected.items():
        row = window_analyses.summarised.boundary.filter(
            (pl.col("service") == key[0]) & (pl.col("operation") == key[1])
        )
        assert row["recommendation"].to_list() == [recommendation], key


def test_explicit_baselines_equal_full_recompute(built_store: Store, dataset: Dataset) -> None:
    conv = dataset.conventions
    baselines = (
        # Overlapping the window: requests in both count in both.
        (START - timedelta(minutes=30), END - timedelta(minutes=30)),
        # Starting before the first span, so before the summaries, and ending mid-minute.
        (dt(at(-11 * HOUR + 5)), dt(at(-9 * HOUR + 7))),
    )
    for baseline_start, baseline_end in baselines:
        summarised = analyze(built_store, START, END, baseline_start, baseline_end, conventions=conv)
        full = analyze(
            built_store, START, END, baseline_start, baseline_end, conventions=conv, use_summaries=False
        )
        assert_same_analysis(
            summarised, full, f"baseline {baseline_start:%d %H:%M:%S}–{baseline_end:%d %H:%M:%S}"
        )
        assert summarised.baseline_start == baseline_start and summarised.baseline_end == baseline_end


# --- 1b. a window half covered by summaries ------------------------------------------------------


def test_half_covered_window_equals_full_recompute(
    filled_store: Store, prepared: Prepared, dataset: Dataset
) -> None:
    conv = dataset.conventions
    middle = dt(at(1.5 * HOUR + 17))  # summarised up to the whole minute before it
    build = build_summaries(filled_store, until=middle, conventions=conv)
    assert build.built_until == dt(at(1.5 * HOUR))
    assert summary_coverage(filled_store) == [(prepared.first_span, dt(at(1.5 * HOUR)))]
    summarised = analyze(filled_store, START, END, conventions=conv)
    full = analyze(filled_store, START, END, conventions=conv, use_summaries=False)
    assert_same_analysis(summarised, full, "half-covered window")
    assert _request_counts(summarised) == _requests_in(dataset.spans, START, END)
    # A window that ends mid-minute inside the covered part and one that starts inside it.
    for start, end in ((dt(at(HOUR + 17)), dt(at(1.25 * HOUR + 41))), (dt(at(1.25 * HOUR + 41)), END)):
        assert_same_analysis(
            analyze(filled_store, start, end, conventions=conv),
            analyze(filled_store, start, end, conventions=conv, use_summaries=False),
            f"window {start:%H:%M:%S}–{end:%H:%M:%S}",
        )


# --- 1c. late spans ------------------------------------------------------------------------------


def _late_llm_call(spans: list[SpanRow]) -> tuple[SpanRow, SpanRow]:
    """A ``web GET /answer`` request of the window that starts in a minute's last seconds and
    outlasts it, and an LLM call made by it that starts in the next minute."""
    for root in spans:
        if not (_is_request_root(root) and root.service == "web" and START <= dt(root.start_ns) < END):
            continue
        into_minute = root.start_ns % (60 * S)
        to_next = 60 * S - into_minute
        if to_next < 5 * S and root.duration_ns > to_next + 500 * MS:
            call = SpanRow(
                trace_id=root.trace_id,
                span_id=new_span_id(),
                parent_span_id=root.span_id,
                name="chat gpt-4o",
                start_ns=root.start_ns + to_next + 100 * MS,
                duration_ns=300 * MS,
                kind="Client",
                service=root.service,
                resource_attributes=dict(root.resource_attributes),
                attributes={
                    "gen_ai.operation.name": "chat",
                    "gen_ai.provider.name": "openai",
                    "gen_ai.request.model": "gpt-4o",
                },
            )
            return root, call
    raise AssertionError("no request of the window outlasts its minute")


def test_late_spans_are_summarised_again(built_store: Store, dataset: Dataset) -> None:
    conv = dataset.conventions
    before = analyze(built_store, START, END, conventions=conv)
    # New requests in minutes summarised already, on an operation of the window.
    late: list[SpanRow] = []
    for i in range(40):
        late += hot_request("web", "GET /answer", at(HOUR + 600 + i * 45.0), 250.0 + i, http_status=200)
    # A late LLM call of a request summarised already, in the minute after the request's own.
    root, call = _late_llm_call(dataset.spans)
    late.append(call)
    insert_spans(built_store, late)
    build = build_summaries(built_store, until=UNTIL, conventions=conv)
    assert build.resummarised > 0
    assert build.minutes == 0 and build.built_from is None
    after = analyze(built_store, START, END, conventions=conv)
    full = analyze(built_store, START, END, conventions=conv, use_summaries=False)
    assert_same_analysis(after, full, "after late spans")
    # The late spans changed the figures: 40 more requests, one of them with an LLM call.
    web_before, web_after = _hot_row(before, "web", "GET /answer"), _hot_row(after, "web", "GET /answer")
    generated = _requests_in([*dataset.spans, *late], START, END)[("web", "GET /answer")]
    assert web_after["requests"] == web_before["requests"] + 40 == generated
    assert web_before["sync_llm_calls_per_request"] == 0.0
    assert web_after["sync_llm_calls_per_request"] == pytest.approx(1 / generated)
    assert after.to_dict() != before.to_dict()
    # The request whose call came late is in a minute before the one the call changed.
    assert root.start_ns // (60 * S) < call.start_ns // (60 * S)


# --- 1d. duplicate exports -----------------------------------------------------------------------


def test_duplicate_export_changes_no_figure(built_store: Store, dataset: Dataset) -> None:
    conv = dataset.conventions
    before = analyze(built_store, START, END, conventions=conv)
    rows_before = built_store.query_value(f"SELECT count() FROM {built_store.table(TRACES_TABLE)}")
    # An exporter retry: the spans of the window's first half-hour written a second time.
    repeated = [s for s in dataset.spans if at(HOUR) <= s.start_ns < at(1.5 * HOUR)]
    insert_spans(built_store, repeated)
    rows_after = built_store.query_value(f"SELECT count() FROM {built_store.table(TRACES_TABLE)}")
    assert rows_after == rows_before + len(repeated)
    build = build_summaries(built_store, until=UNTIL, conventions=conv)
    assert build.resummarised > 0
    after = analyze(built_store, START, END, conventions=conv)
    assert_same_analysis(after, before, "after a duplicate export, against before it")
    full = analyze(built_store, START, END, conventions=conv, use_summaries=False)
    assert_same_analysis(after, full, "after a duplicate export")
    assert _request_counts(after) == _requests_in(dataset.spans, START, END)


# --- 1e. a version released mid-window -----------------------------------------------------------


def test_version_released_mid_window(window_analyses: WindowAnalyses, dataset: Dataset) -> None:
    first_span = {
        version: min(
            s.start_ns
            for s in dataset.spans
            if s.service == RELEASE_SERVICE and s.resource_attributes.get("service.version") == version
        )
        for version in ("1.1.0", "1.2.0")
    }
    for analysis in (window_analyses.summarised, window_analyses.full):
        rows = analysis.releases.filter(pl.col("service") == RELEASE_SERVICE).sort("released_at")
        by_version = {r["version"]: r for r in rows.iter_rows(named=True)}
        assert "1.2.0" in by_version, rows
        released = by_version["1.2.0"]["released_at"]
        assert START <= released < END
        assert released == dt(first_span["1.2.0"])
        # Its "before" is the version released earlier, 1.1.0 (released before the window).
        assert by_version["1.1.0"]["released_at"] == dt(first_span["1.1.0"]) < START
        assert by_version["1.2.0"]["requests_before"] > 0 and by_version["1.2.0"]["requests_after"] > 0
        assert by_version["1.2.0"]["sync_llm_calls_per_request_before"] == 0.0
        assert by_version["1.2.0"]["sync_llm_calls_per_request_after"] == 1.0
    for name in ("releases", "release_coupling", "boundary_releases"):
        assert_frame_equal(window_analyses.summarised.frames[name], window_analyses.full.frames[name])
    assert window_analyses.summarised.to_dict()["hot_path"] == window_analyses.full.to_dict()["hot_path"]


# --- 1f. summaries outlive the raw spans ---------------------------------------------------------


def test_summaries_outlive_the_raw_spans(built_store: Store, dataset: Dataset) -> None:
    conv = dataset.conventions
    before = analyze(built_store, START, END, conventions=conv)
    full = analyze(built_store, START, END, conventions=conv, use_summaries=False)
    assert_same_analysis(before, full, "before the deletion")
    table = built_store.table(TRACES_TABLE)
    built_store.command(f"ALTER TABLE {table} DELETE WHERE 1 SETTINGS mutations_sync = 2")
    assert built_store.query_value(f"SELECT count() FROM {table}") == 0
    after = analyze(built_store, START, END, conventions=conv)
    assert_same_analysis(after, before, "after the raw spans are gone")
    assert _request_counts(after) == _requests_in(dataset.spans, START, END)
    # Without the summaries there is nothing left to analyse.
    assert analyze(built_store, START, END, conventions=conv, use_summaries=False).hot_path.is_empty()


def test_summaries_dropped_by_retention_are_not_read(filled_store: Store, dataset: Dataset) -> None:
    """Retention drops whole days of summaries; a window on a dropped day is then not covered and is
    read from the raw spans, which a longer span TTL still keeps."""
    # The spans begin on the evening before T0's day; a retention of 10 h at UNTIL (11:00 on T0's
    # day) reaches back into T0's day, so the day before is dropped.
    conv = replace(dataset.conventions, summary_retention=timedelta(hours=10))
    build_summaries(filled_store, until=UNTIL, conventions=conv)
    day = UNTIL.replace(hour=0, minute=0)
    window_start, window_end = dt(at(-10 * HOUR + 17)), dt(at(-9 * HOUR + 17))
    assert window_end <= day
    generated = _requests_in(dataset.spans, window_start, window_end)
    assert generated, "no requests on the dropped day"
    full = analyze(filled_store, window_start, window_end, conventions=conv, use_summaries=False)
    assert _request_counts(full) == generated
    summarised = analyze(filled_store, window_start, window_end, conventions=conv)
    assert _request_counts(summarised) == generated, (
        "a window on a day whose summaries retention dropped reads no requests: "
        f"{_request_counts(summarised)} instead of {generated}; summary_coverage still reports "
        f"{summary_coverage(filled_store)}"
    )
    assert_same_analysis(summarised, full, "a window on a dropped day")
    assert all(lo >= day for lo, _ in summary_coverage(filled_store))
    # The days retention keeps still answer from the summaries.
    assert_same_analysis(
        analyze(filled_store, START, END, conventions=conv),
        analyze(filled_store, START, END, conventions=conv, use_summaries=False),
        "a window on a kept day",
    )


# --- 1e. whole hours pre-merged ------------------------------------------------------------------

HOURS = "tailwatch_summary_hours"
ANATOMY_HOURS = "tailwatch_agg_llm_anatomy_hours"


def _recorded_hours(store: Store) -> list[datetime]:
    return [h for (h,) in store.query_rows(f"SELECT toDateTime(start, 'UTC') FROM {HOURS} ORDER BY 1")]


def _anatomy_by_hour(store: Store, table: str) -> set[tuple[Any, ...]]:
    """Per (hour, provider, model, measure, bucket) the calls, from the minutes or the hours."""
    rows = store.query_rows(
        f"SELECT toStartOfHour(start) AS h, provider, model, measure, key, sum(n) FROM {table} "
        f"WHERE toDateTime(toStartOfHour(start), 'UTC') IN (SELECT toDateTime(start, 'UTC') FROM {HOURS}) "
        "GROUP BY h, provider, model, measure, key"
    )
    return {tuple(r) for r in rows}


def test_whole_hours_are_read_pre_merged(built_store: Store, prepared: Prepared, dataset: Dataset) -> None:
    """Every hour whose minutes are all summarised is pre-merged and recorded, its rows the sums of
    its minutes'; a window holding whole hours reads them (a wrong row there shows in its figures),
    and equals the recompute. Rows of an hour without its record — a merge killed before recording
    it — are not read, and the next build replaces them; a re-summarised minute re-merges its hour."""
    conv = dataset.conventions
    ((first, until),) = prepared.coverage
    first_hour = first + (-first.minute % 60) * timedelta(minutes=1)
    complete = [
        first_hour + i * timedelta(hours=1) for i in range(int((until - first_hour) / timedelta(hours=1)))
    ]
    assert len(complete) >= 3 and [as_utc(h) for h in _recorded_hours(built_store)] == complete
    assert _anatomy_by_hour(built_store, ANATOMY_HOURS) == _anatomy_by_hour(
        built_store, "tailwatch_agg_llm_anatomy"
    )
    # Four hours ending mid-minute after the LLM scenario's second hour: its hours are read whole.
    start, end = dt(at(-2 * HOUR + 17)), dt(at(2 * HOUR + 17))
    full = analyze(built_store, start, end, conventions=conv, use_summaries=False)
    assert full.llm_anatomy.height > 0
    assert_same_analysis(analyze(built_store, start, end, conventions=conv), full, "hours pre-merged")
    # A wrong row in a recorded hour of the window changes the figures: the hour is read.
    hour = dt(at(HOUR))
    built_store.command(
        f"INSERT INTO {ANATOMY_HOURS} (start, provider, model, measure, key, n) "
        "VALUES ({h:DateTime64(9)}, 'openai', 'gpt-4o', 'input', 2000, 100000)",
        {"h": hour},
    )
    assert (
        analyze(built_store, start, end, conventions=conv).llm_anatomy.to_dicts()
        != full.llm_anatomy.to_dicts()
    )
    # Without the hour's record (killed before it was written) the row is not read …
    built_store.command(f"DELETE FROM {HOURS} WHERE start = {{h:DateTime64(9)}}", {"h": hour})
    assert_same_analysis(analyze(built_store, start, end, conventions=conv), full, "an hour not recorded")
    # … and the next build merges the hour again, without it.
    build_summaries(built_store, until=UNTIL, conventions=conv)
    assert [as_utc(h) for h in _recorded_hours(built_store)] == complete
    assert _anatomy_by_hour(built_store, ANATOMY_HOURS) == _anatomy_by_hour(
        built_store, "tailwatch_agg_llm_anatomy"
    )
    assert_same_analysis(analyze(built_store, start, end, conventions=conv), full, "the hour merged again")
    # A late LLM call in the window: its minutes are summarised again, their hour merged again.
    _, call = _late_llm_call(dataset.spans)
    insert_spans(built_store, [call])
    assert build_summaries(built_store, until=UNTIL, conventions=conv).resummarised > 0
    assert [as_utc(h) for h in _recorded_hours(built_store)] == complete
    assert _anatomy_by_hour(built_store, ANATOMY_HOURS) == _anatomy_by_hour(
        built_store, "tailwatch_agg_llm_anatomy"
    )
    late_full = analyze(built_store, start, end, conventions=conv, use_summaries=False)
    assert late_full.llm_anatomy.to_dicts() != full.llm_anatomy.to_dicts()
    assert_same_analysis(analyze(built_store, start, end, conventions=conv), late_full, "after a late call")


# --- 2. rules, the API and the dashboards read the same numbers ----------------------------------


def test_rules_source_gives_the_analysis(
    built_store: Store, dataset: Dataset, window_analyses: WindowAnalyses
) -> None:
    conv = dataset.conventions
    expected = analyze(built_store, START, END, conventions=conv)
    source = AnalyticsSource(built_store, conv)
    got = source.analysis(START, END)
    assert_same_analysis(got, expected, "rules source")
    assert source.analyses_run == 1
    assert_same_analysis(got, window_analyses.full, "rules source against the full recompute")


def test_api_analyze_returns_the_analysis_json(
    built_store: Store, dataset: Dataset, tmp_path: Path, window_analyses: WindowAnalyses
) -> None:
    config = TailwatchConfig.model_validate(
        {
            "store": "chdb://" + str(tmp_path / "store"),
            "dashboards": {"out_dir": str(tmp_path / "dash")},
            "analysis": {"conventions": {"latency_budgets": dataset.budgets}},
        }
    )
    assert config.analysis.conventions_object() == dataset.conventions
    expected = analyze(built_store, START, END, conventions=dataset.conventions)
    client = TestClient(
        Starlette(routes=api_routes(ServiceApi(built_store, config))), base_url="http://127.0.0.1:4318"
    )
    response = client.get("/api/v1/analyze", params={"start": iso_z(START), "end": iso_z(END)})
    assert response.status_code == 200, response.text
    assert response.json() == json.loads(expected.to_json())
    assert response.text == expected.to_json()
    assert response.json() == json.loads(window_analyses.full.to_json())


def test_dashboards_export_uses_the_analysis(
    built_store: Store, dataset: Dataset, tmp_path: Path, window_analyses: WindowAnalyses
) -> None:
    conv = dataset.conventions
    expected = analyze(built_store, START, END, conventions=conv)
    report = export_dashboards(built_store, tmp_path / "dash", START, END, conventions=conv)
    assert report.computed and report.analysis_run_id
    assert (report.start, report.end) == (START, END)
    persisted = load_run(built_store, report.analysis_run_id)
    assert persisted is not None
    assert_same_analysis(persisted, expected, "the exported run")
    assert_same_analysis(persisted, window_analyses.full, "the exported run against the full recompute")


# --- the CDF frame's row order -------------------------------------------------------------------


def test_cold_path_cdf_rows_are_in_cdf_order(window_analyses: WindowAnalyses) -> None:
    """Within a window and queue the CDF's rows are in rank order, so that two analyses of the same
    jobs give the same frame row for row. Jobs with equal enqueue-to-ready times are where the
    order is lost: the frame is sorted on the time alone."""
    # Two queues, many jobs sharing each time, and a baseline, as any real queue has.
    n = 150
    jobs = pl.DataFrame(
        {
            "queue": ["emails"] * n + ["doc-summaries"] * n,
            "enqueue_to_ready_s": [1.0 + (i % 10) * 0.02 for i in range(n)]
            + [3.0 + ((i % 7) - 3) * 0.2 for i in range(n)],
        }
    )
    frames = {
        "pure": cold_path_cdf(jobs, 200, jobs),
        "summarised analysis": window_analyses.summarised.cold_path_cdf,
        "full analysis": window_analyses.full.cold_path_cdf,
    }
    unordered = []
    for label, frame in frames.items():
        for (window, queue), group in frame.group_by("window", "queue", maintain_order=True):
            if not group["cdf"].is_sorted():
                unordered.append(f"{label}: {window} {queue}")
    assert not unordered, (
        "cold_path_cdf rows with equal enqueue_to_ready_s are not in cdf order in: " + "; ".join(unordered)
    )
