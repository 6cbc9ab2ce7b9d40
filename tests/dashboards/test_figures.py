"""The figures are pure functions of the analysis frames: read every trace back and compare."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import plotly.graph_objects as go
import polars as pl
import pytest

from analytics import Analysis
from dashboards import NO_ALERTS_TEXT, VIEWS, build_figures
from dashboards.figures import MAX_PANELS, hot_path_figure
from dashboards.style import INTERNAL, LLM, esc, naive_utc
from tests.dashboards.frames import (
    HOSTILE,
    HOSTILE_FLAG,
    HOSTILE_TEMPLATE,
    START,
    empty_like,
    sample_alerts,
    sample_analysis,
)


@pytest.fixture(scope="module")
def analysis() -> Analysis:
    return sample_analysis(hostile=True)


@pytest.fixture(scope="module")
def figures(analysis: Analysis) -> dict[str, go.Figure]:
    return build_figures(analysis, sample_alerts(hostile=True))


def _traces(fig: go.Figure, name: str, **match: Any) -> list[Any]:
    """Traces with this (escaped) legend name whose first customdata row starts with ``match`` values."""
    found = []
    for trace in fig.data:
        if trace.name != name:
            continue
        if match:
            first = trace.customdata[0]
            if any(first[int(k[1:])] != v for k, v in match.items()):
                continue
        found.append(trace)
    return found


def _one(fig: go.Figure, name: str, **match: Any) -> Any:
    found = _traces(fig, name, **match)
    assert len(found) == 1, (name, match, [t.name for t in fig.data])
    return found[0]


def _naive(values: list[Any]) -> list[Any]:
    return [naive_utc(v) for v in values]


def test_build_figures_returns_every_view(figures: dict[str, go.Figure]) -> None:
    assert tuple(figures) == VIEWS
    assert all(isinstance(f, go.Figure) for f in figures.values())


def test_hot_path_traces_match_series_and_releases(analysis: Analysis, figures: dict[str, go.Figure]) -> None:
    fig = figures["hot_path"]
    for service, operation in analysis.hot_path.select("service", "operation").iter_rows():
        series = analysis.hot_path_series.filter(
            (pl.col("service") == service) & (pl.col("operation") == operation)
        ).sort("bucket_start")
        who = {"c0": esc(service), "c1": esc(operation)}
        for pct in ("p50", "p95", "p99"):
            trace = _one(fig, pct, **who)
            assert list(trace.x) == _naive(series["bucket_start"].to_list())
            assert list(trace.y) == series[f"{pct}_ms"].to_list()
        llm = _one(fig, "sync LLM calls / request", **who)
        assert list(llm.y) == series["sync_llm_calls_per_request"].to_list()
        assert llm.line.color == LLM
        assert llm.yaxis != _one(fig, "p99", **who).yaxis  # the second y axis
    markers = {t.customdata[0][0]: t for t in _traces(fig, "release")}
    llm_releases = analysis.releases.filter(pl.col("operation") == HOSTILE).sort("released_at")
    trace = markers["1.4.0"]
    assert list(trace.x) == _naive(llm_releases["released_at"].to_list())
    assert list(trace.y) == llm_releases["p99_after_ms"].to_list()
    assert [row[0] for row in trace.customdata] == [esc(v) for v in llm_releases["version"]]
    assert [row[3] for row in trace.customdata] == ["+15 ms", "+800 ms"]
    assert [row[4] for row in trace.customdata] == ["not significant", "significant"]
    # One dotted line per release (3 in the data), each labelled with its escaped version.
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert sorted(s.x0 for s in lines) == sorted(_naive(analysis.releases["released_at"].to_list()))
    labels = " ".join(a.text for a in fig.layout.annotations)
    assert esc(HOSTILE) + " +800 ms" in labels and "1.4.0" in labels and "2.0.1" in labels
    assert "p99 coupled to releases" in labels and "+800 ms/release" in labels


def test_cold_path_traces_match(analysis: Analysis, figures: dict[str, go.Figure]) -> None:
    fig = figures["cold_path"]
    for queue in analysis.cold_path["queue"]:
        name = esc(queue)
        series = analysis.cold_path_series.filter(pl.col("queue") == queue).sort("bucket_start")
        lines = [t for t in _traces(fig, name) if t.xaxis == "x"]
        by_dash = {t.line.dash: t for t in lines}
        assert list(by_dash["solid"].y) == series["p99_s"].to_list()
        assert list(by_dash["dash"].y) == series["p50_s"].to_list()
        cdf = analysis.cold_path_cdf.filter(pl.col("queue") == queue).sort("enqueue_to_ready_s")
        (cdf_trace,) = [t for t in _traces(fig, name) if t.xaxis == "x2"]
        assert list(cdf_trace.x) == cdf["enqueue_to_ready_s"].to_list()
        assert list(cdf_trace.y) == cdf["cdf"].to_list()
        (pending,) = [t for t in _traces(fig, name) if t.xaxis == "x4"]
        assert list(pending.y) == series["pending"].to_list()
    wait = _one(fig, "queue wait p99")
    processing = _one(fig, "processing p99")
    summary = analysis.cold_path.sort("jobs", descending=True)
    assert list(wait.x) == [esc(q) for q in summary["queue"]]
    assert list(wait.y) == summary["queue_wait_p99_s"].to_list()
    assert list(processing.y) == summary["processing_p99_s"].to_list()
    assert fig.layout.xaxis2.type == "log"
    notes = [a.text for a in fig.layout.annotations]
    assert "<b>STARVED · p99/p50 60×</b>" in notes and "p99/p50 2.0×" in notes


def test_abandonment_traces_match(analysis: Analysis, figures: dict[str, go.Figure]) -> None:
    fig = figures["abandonment"]
    buckets = analysis.abandonment.sort("lo_ms")
    rate = _one(fig, "abandonment rate (95% Wilson interval)")
    assert list(rate.x) == [(lo + hi) / 2 for lo, hi in zip(buckets["lo_ms"], buckets["hi_ms"], strict=True)]
    assert list(rate.y) == buckets["rate"].to_list()
    assert list(rate.width) == [500] * buckets.height
    upper = [r + e for r, e in zip(rate.y, rate.error_y.array, strict=True)]
    lower = [r - e for r, e in zip(rate.y, rate.error_y.arrayminus, strict=True)]
    assert upper == pytest.approx(buckets["rate_high"].to_list())
    assert lower == pytest.approx(buckets["rate_low"].to_list())
    requests = _one(fig, "requests per bucket")
    assert list(requests.y) == buckets["requests"].to_list()
    assert requests.yaxis == "y2"
    # The cliff (2000 ms) and the operation's p99 (2050 ms) on the same latency axis.
    assert sorted(s.x0 for s in fig.layout.shapes) == [2000, 2050.0]
    labels = [a.text for a in fig.layout.annotations]
    assert "<b>cliff ≥ 2,000 ms</b>" in labels and "p99 2,050 ms" in labels


def test_retry_traces_match(analysis: Analysis, figures: dict[str, go.Figure]) -> None:
    fig = figures["retries"]
    name = esc(HOSTILE_FLAG)
    hops = analysis.retry_hops.sort("hop_index")
    (per_hop,) = [t for t in _traces(fig, name) if t.type == "bar"]
    assert list(per_hop.y) == hops["retry_rate"].to_list()
    assert list(per_hop.x) == ["1. plan", f"2. {esc(HOSTILE_FLAG)}", "3. answer"]
    (model,) = [t for t in _traces(fig, name) if t.type == "scatter" and t.mode == "lines+markers"]
    assert list(model.y) == pytest.approx([1.0, 1.05, 1.05**2, 1.05**3])
    (observed,) = [t for t in _traces(fig, name) if t.type == "scatter" and t.mode == "markers"]
    assert list(observed.y) == [1.157]
    amp = analysis.retry_amplification
    assert list(_one(fig, "observed").y) == amp["attempt_amplification"].to_list()
    assert list(_one(fig, "model ∏(1+r)").y) == amp["modeled_amplification"].to_list()
    tokens = _one(fig, "token amplification")
    assert list(tokens.y) == amp["token_amplification"].to_list()
    assert list(tokens.text) == ["+16.2% tokens"]


def test_attribution_split_and_spans_match(analysis: Analysis, figures: dict[str, go.Figure]) -> None:
    fig = figures["attribution"]
    for a in analysis.attribution.iter_rows(named=True):
        who = {"c0": esc(a["service"]), "c1": esc(a["operation"])}
        llm = _one(fig, "LLM", **who, c2="LLM")
        internal = _one(fig, "internal", **who, c2="internal")
        assert list(llm.x) == [a["llm_delta_ms"]] and llm.marker.color == LLM
        assert list(internal.x) == [a["internal_delta_ms"]] and internal.marker.color == INTERNAL
        spans = analysis.attribution_spans.filter(pl.col("operation") == a["operation"])
        for cls, colour in (("llm", LLM), ("internal", INTERNAL)):
            expected = spans.filter(pl.col("class") == cls)
            (trace,) = [
                t
                for t in fig.data
                if t.type == "bar"
                and t.marker.color == colour
                and t.customdata[0][1] == who["c1"]
                and len(t.customdata[0]) == 4
                and t.customdata[0][2] != "LLM"
                and t.customdata[0][2] != "internal"
            ]
            assert dict(zip(trace.y, trace.x, strict=True)) == dict(
                zip([esc(s) for s in expected["span_name"]], expected["delta_ms"], strict=True)
            )
    tables = [t for t in fig.data if t.type == "table"]
    assert len(tables) == 2
    exemplars = tables[0].cells.values
    assert exemplars[2][0] == "a" * 32 + ", " + "b" * 32
    assert list(tables[1].cells.values[3]) == ["0.0% → 12.0%"]  # the 429 rate, baseline → current
    titles = " ".join(a.text for a in fig.layout.annotations)
    assert "verdict <b>llm</b>" in titles and "verdict <b>internal</b>" in titles
    assert "HotPathP99Regression (resolved, cause llm)" in titles


def test_boundary_bars_budget_and_slices_match(analysis: Analysis, figures: dict[str, go.Figure]) -> None:
    fig = figures["boundary"]
    bars = [t for t in fig.data if t.type == "bar"]
    assert len(bars) == analysis.boundary.height
    by_budget = {b["p99_ms"]: b for b in analysis.boundary.iter_rows(named=True)}
    for bar in bars:
        row = by_budget[bar.x[0]]
        # Now and without the sync model calls (not LLM/internal time: neither colour is used).
        assert list(bar.x) == [row["p99_ms"], row["p99_without_sync_llm_ms"]]
        assert LLM not in bar.marker.color and INTERNAL not in bar.marker.color
    headlines = " ".join(a.text for a in fig.layout.annotations)
    assert "move the model calls off the hot path" in headlines and "within budget" in headlines
    budget_lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert sorted({s.x0 for s in budget_lines}) == sorted(analysis.boundary["budget_ms"].to_list())
    [table] = [t for t in fig.data if t.type == "table"]
    variants = table.cells.values[2]
    assert variants[0].endswith("(control)") and len(variants) == analysis.slices.height
    assert table.cells.values[5][1].startswith("-2,075 ms (significant)")
    assert table.cells.values[8][1] == "10.7"  # the async variant's cold p99: what users wait for now


def test_alerts_timeline_matches_history(analysis: Analysis, figures: dict[str, go.Figure]) -> None:
    fig = figures["alerts"]
    alerts = sample_alerts(hostile=True)
    firing = _one(fig, "firing")
    resolved = _one(fig, "resolved")
    fired = alerts.filter(pl.col("status") == "firing").sort(["fingerprint", "at"])
    assert list(firing.x) == _naive(fired["at"].to_list())
    assert list(firing.text) == [esc(c) for c in fired["cause"]]
    assert list(resolved.x) == _naive(alerts.filter(pl.col("status") == "resolved")["at"].to_list())
    interval = _one(fig, "firing interval")
    # f1 fired then resolved; f2 is still firing at the end of the window.
    assert [x for x in interval.x if x is not None] == [
        _naive([alerts["at"][0]])[0],
        _naive([alerts["at"][1]])[0],
        _naive([alerts["at"][2]])[0],
        naive_utc(analysis.end),
    ]


@pytest.mark.parametrize("alerts", [None, "empty"])
def test_no_alerts_is_said_explicitly(analysis: Analysis, alerts: Any) -> None:
    frame = None if alerts is None else sample_alerts().clear()
    fig = build_figures(analysis, frame)["alerts"]
    assert [a.text for a in fig.layout.annotations] == [NO_ALERTS_TEXT]
    assert list(fig.layout.xaxis.range) == [naive_utc(analysis.start), naive_utc(analysis.end)]


def test_empty_window_draws_a_message_per_view(analysis: Analysis) -> None:
    figures = build_figures(empty_like(analysis), None)
    for view, fig in figures.items():
        assert len(fig.data) == 0, view
        assert len(fig.layout.annotations) == 1 and fig.layout.annotations[0].text, view


def _all_strings(obj: Any) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _all_strings(v)]
    if isinstance(obj, list | tuple):
        return [s for v in obj for s in _all_strings(v)]
    if hasattr(obj, "tolist"):
        return _all_strings(obj.tolist())
    return []


def test_every_span_string_is_escaped(figures: dict[str, go.Figure]) -> None:
    for view, fig in figures.items():
        strings = _all_strings(fig.to_plotly_json())
        blob = "\n".join(strings)
        for raw in (HOSTILE, HOSTILE_FLAG, "<b>bold</b>", "'quoted'"):
            assert raw not in blob, (view, raw)
        # A "%{x}" in a name never reaches a template, where plotly would substitute it.
        templates = [t.hovertemplate for t in fig.data if getattr(t, "hovertemplate", None)]
        assert not any("op %{x}" in t or esc(HOSTILE_TEMPLATE) in t for t in templates), view
    hot = "\n".join(_all_strings(figures["hot_path"].to_plotly_json()))
    assert esc(HOSTILE) in hot and esc(HOSTILE_TEMPLATE) in hot
    assert esc(HOSTILE) == "&lt;img src=x onerror=alert(1)&gt;"
    assert esc(HOSTILE_FLAG) == "&lt;img src=x onerror=&#34;window.__xss=1&#34;&gt;"


def test_llm_and_internal_colours_are_the_same_everywhere(figures: dict[str, go.Figure]) -> None:
    for fig in figures.values():
        for trace in fig.data:
            if trace.name in ("LLM", "internal"):
                assert trace.marker.color == (LLM if trace.name == "LLM" else INTERNAL)
            colours = json.dumps(trace.to_plotly_json(), default=str)
            if trace.name not in ("LLM", "internal", "sync LLM calls / request"):
                assert LLM not in colours and INTERNAL not in colours, trace.name


def test_busiest_operations_only_beyond_the_panel_limit(analysis: Analysis) -> None:
    many = analysis.hot_path_series.head(0)
    summaries = []
    for i in range(MAX_PANELS + 3):
        summaries.append(
            {
                "service": "svc",
                "operation": f"op{i:02d}",
                "requests": 1000 - i,
                "p50_ms": 1.0,
                "p95_ms": 2.0,
                "p99_ms": 3.0,
                "p999_ms": 4.0,
                "sync_llm_calls_per_request": 0.0,
            }
        )
        many = many.vstack(
            pl.DataFrame(
                [("svc", f"op{i:02d}", START, 10, 1.0, 2.0, 3.0, 0.0)], schema=many.schema, orient="row"
            )
        )
    variant = replace(
        analysis,
        hot_path=pl.DataFrame(summaries),
        hot_path_series=many,
        releases=analysis.releases.head(0),
    )
    fig = hot_path_figure(variant)
    shown = {t.customdata[0][1] for t in fig.data if t.name == "p99"}
    assert shown == {f"op{i:02d}" for i in range(MAX_PANELS)}
    assert f"busiest {MAX_PANELS} of {MAX_PANELS + 3} operations" in fig.layout.title.text
