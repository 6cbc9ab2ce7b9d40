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
from dashboards.figures import MAX_PANELS, boundary_figure, hot_path_figure
from dashboards.style import (
    CLIFF,
    INTERNAL,
    LLM,
    MODEBAR_PX,
    RELEASE_SIGNIFICANT,
    THIN_BUCKET,
    esc,
    naive_utc,
)
from dashboards.views._common import count_of, rows_of
from dashboards.views.abandonment import MIN_BUCKET_REQUESTS
from tests.dashboards.frames import (
    HOSTILE,
    HOSTILE_FLAG,
    HOSTILE_TEMPLATE,
    START,
    empty_like,
    priced,
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
    assert "p99 rises with releases" in labels and "+800 ms/release" in labels


def test_cold_path_traces_match(analysis: Analysis, figures: dict[str, go.Figure]) -> None:
    fig = figures["cold_path"]
    for queue in analysis.cold_path["queue"]:
        name = esc(queue)
        series = analysis.cold_path_series.filter(pl.col("queue") == queue).sort("bucket_start")
        lines = [t for t in _traces(fig, name) if t.xaxis == "x"]
        by_dash = {t.line.dash: t for t in lines}
        assert list(by_dash["solid"].y) == series["p99_s"].to_list()
        assert list(by_dash["dash"].y) == series["p50_s"].to_list()
        # The baseline window's p99 across the panel, dotted.
        row = analysis.cold_path.filter(pl.col("queue") == queue).row(0, named=True)
        assert list(by_dash["dot"].y) == [row["baseline_p99_s"]] * 2
        cdfs = {t.line.dash: t for t in _traces(fig, name) if t.xaxis == "x2"}
        assert set(cdfs) == {"solid", "dot"}
        for window, dash in (("current", "solid"), ("baseline", "dot")):
            cdf = analysis.cold_path_cdf.filter(
                (pl.col("queue") == queue) & (pl.col("window") == window)
            ).sort("enqueue_to_ready_s")
            assert list(cdfs[dash].x) == cdf["enqueue_to_ready_s"].to_list()
            assert list(cdfs[dash].y) == cdf["cdf"].to_list()
        (pending,) = [t for t in _traces(fig, name) if t.xaxis == "x4"]
        assert list(pending.y) == series["pending"].to_list()
    wait = _one(fig, "queue wait p99")
    processing = _one(fig, "processing p99")
    summary = analysis.cold_path.sort("jobs", descending=True)
    assert list(wait.x) == [esc(q) for q in summary["queue"]]
    assert list(wait.y) == summary["queue_wait_p99_s"].to_list()
    assert list(processing.y) == summary["processing_p99_s"].to_list()
    assert list(_one(fig, "queue wait p99, baseline").y) == summary["baseline_queue_wait_p99_s"].to_list()
    assert list(_one(fig, "processing p99, baseline").y) == summary["baseline_processing_p99_s"].to_list()
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
    baseline = _one(fig, "observed, baseline")
    assert list(baseline.y) == amp["baseline_attempt_amplification"].to_list()
    assert [row[1] for row in baseline.customdata] == amp["baseline_runs"].to_list()
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
    # Baseline → current: calls failed after their retries, failed attempts but 429s, 429 attempts.
    assert [list(tables[1].cells.values[i]) for i in (2, 3, 4)] == [
        ["1.0% → 2.0%"],
        ["0.3% → 0.4%"],
        ["0.0% → 12.0%"],
    ]
    assert list(tables[1].header.values[2:5]) == [
        "failed calls (after retries)",
        "failed attempts (5xx, timeout)",
        "429 attempts",
    ]
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
    budget_lines = [s for s in fig.layout.shapes if s.type == "line" and s.x0 == s.x1]
    assert sorted({s.x0 for s in budget_lines}) == sorted(analysis.boundary["budget_ms"].to_list())
    [table] = [t for t in fig.data if t.type == "table"]
    variants = table.cells.values[2]
    assert variants[0].endswith("(control)") and len(variants) == analysis.slices.height
    assert table.cells.values[5][1].startswith("-2,075 ms (significant)")
    assert table.cells.values[8][1] == "10.7"  # the async variant's cold p99: what users wait for now


def _options_panel(fig: go.Figure) -> tuple[Any, Any | None, list[Any], Any]:
    """The what-if panel of the figure's one operation with options: its points, its mark (or
    None), its horizontal lines (shapes across the panel) and its x axis."""
    [points] = [t for t in fig.data if t.name == "what-if options"]
    marks = [t for t in fig.data if t.name == "cheapest under budget"]
    assert len(marks) <= 1 and all(m.xaxis == points.xaxis for m in marks)
    lines = [s for s in fig.layout.shapes if s.yref == points.yaxis and s.xref == f"{points.xaxis} domain"]
    return points, marks[0] if marks else None, lines, fig.layout[points.xaxis.replace("x", "xaxis")]


def _expected_mark(
    options: pl.DataFrame, price: str, budget: float, recommended: str | None
) -> dict[str, Any]:
    """The option the panel must mark, from the frame: under the budget, the lowest price; on a tie
    the recommended one, then the fewest extra calls, then the lowest p99."""
    under = [r for r in options.iter_rows(named=True) if r[price] is not None and r["p99_ms"] < budget]
    return min(
        under,
        key=lambda r: (
            r[price],
            f"{r['option']} {r['parameter']}" != recommended,
            r["extra_calls_ratio"],
            r["p99_ms"],
        ),
    )


def test_boundary_options_without_prices_on_extra_tokens(
    analysis: Analysis, figures: dict[str, go.Figure]
) -> None:
    fig = figures["boundary"]
    points, mark, lines, xaxis = _options_panel(fig)
    options = analysis.what_if
    [op] = options.select("service", "operation").unique().iter_rows()
    b = rows_of(analysis.boundary, *op).row(0, named=True)
    # No price table (extra_cost_per_day all null): each option at its extra tokens, its p99 up.
    assert options["extra_cost_per_day"].null_count() == options.height
    assert list(points.x) == options["extra_tokens_ratio"].to_list()
    assert list(points.y) == options["p99_ms"].to_list()
    assert xaxis.title.text == "extra tokens, share of the calls' (no price table)"
    assert xaxis.tickformat == ".0%"
    # The p99 now (of the requests simulated) and the budget as lines across the panel.
    before = (options["p99_ms"] - options["p99_delta_ms"]).unique().to_list()
    assert sorted(s.y0 for s in lines) == sorted([*before, b["budget_ms"]])
    assert all(s.y0 == s.y1 and (s.x0, s.x1) == (0, 1) for s in lines)
    # The mark: the cheapest under the budget, computed here from the frame — several options tie at
    # no extra tokens, and the one the boundary recommends is the one marked.
    expected = _expected_mark(options, "extra_tokens_ratio", b["budget_ms"], b["cheapest_option"])
    assert mark is not None and (mark.x[0], mark.y[0]) == (expected["extra_tokens_ratio"], expected["p99_ms"])
    assert f"{expected['option']} {expected['parameter']}" == b["cheapest_option"]
    # Its hover says so, and only its.
    said = [i for i, t in enumerate(points.text) if t.startswith("<b>cheapest under budget</b>")]
    assert said == [options["p99_ms"].to_list().index(expected["p99_ms"])]
    # Hover: what the option is (escaped), p99 before → after, abandoned saved, tokens, no price.
    for text, data, r in zip(points.text, points.customdata, options.iter_rows(named=True), strict=True):
        assert esc(r["parameter"]) in text and esc(r["assumption"]) in text
        before_ms, saved, tokens, cost, calls = data
        assert before_ms == f"{r['p99_ms'] - r['p99_delta_ms']:,.0f}"
        assert saved == f"{r['abandoned_saved_per_day']:,.0f}"
        assert tokens == f"{r['extra_tokens_ratio']:+.1%} of the calls' tokens"
        assert cost == "no price table" and calls == f"{r['extra_calls_ratio']:+.1%}"
    assert any(esc(HOSTILE_TEMPLATE) in t for t in points.text)
    assert not any(HOSTILE_TEMPLATE in t for t in points.text)
    # Span strings only in text/customdata: none in the template, where %{x} would be substituted.
    assert "%{x}" not in points.hovertemplate and esc(HOSTILE_TEMPLATE) not in points.hovertemplate
    # The operation without a synchronous model call says so instead of an empty grid.
    notes = [a.text for a in fig.layout.annotations if a.text.startswith("no option simulated")]
    assert len(notes) == analysis.boundary.height - 1


def test_boundary_options_with_prices_on_extra_cost(analysis: Analysis) -> None:
    priced_analysis = priced(analysis)
    fig = boundary_figure(priced_analysis)
    points, mark, lines, xaxis = _options_panel(fig)
    options = priced_analysis.what_if
    [op] = options.select("service", "operation").unique().iter_rows()
    b = rows_of(priced_analysis.boundary, *op).row(0, named=True)
    known = options.filter(pl.col("extra_cost_per_day").is_not_null())
    assert 0 < known.height < options.height  # one model has no price
    assert list(points.x) == known["extra_cost_per_day"].to_list()
    assert list(points.y) == known["p99_ms"].to_list()
    assert xaxis.title.text == "extra cost (USD/day)<br><sup>1 option not drawn: cost unknown</sup>"
    assert xaxis.tickprefix == "$"
    expected = _expected_mark(options, "extra_cost_per_day", b["budget_ms"], b["cheapest_option"])
    assert mark is not None and (mark.x[0], mark.y[0]) == (expected["extra_cost_per_day"], expected["p99_ms"])
    # With prices the cheapest is in money: not the option that is cheapest in tokens.
    unpriced = _expected_mark(options, "extra_tokens_ratio", b["budget_ms"], b["cheapest_option"])
    assert (expected["option"], expected["parameter"]) != (unpriced["option"], unpriced["parameter"])
    for data, r in zip(points.customdata, known.iter_rows(named=True), strict=True):
        cost = r["extra_cost_per_day"]
        assert data[3] == f"{'-' if cost < 0 else ''}${abs(cost):,.2f}/day"
    assert len(lines) == 2


def test_boundary_options_axis_follows_the_columns_the_frame_has(analysis: Analysis) -> None:
    """A frame made before the cost column existed draws tokens; extra tokens a day, when the frame
    has them, come before the share; without a budget, no budget line and no mark."""
    without_cost = replace(analysis, what_if=analysis.what_if.drop("extra_cost_per_day"))
    points, _, _, xaxis = _options_panel(boundary_figure(without_cost))
    assert list(points.x) == analysis.what_if["extra_tokens_ratio"].to_list()
    assert "no price table" in xaxis.title.text and all(d[3] == "no price table" for d in points.customdata)

    per_day = analysis.what_if.with_columns(
        (pl.col("extra_tokens_ratio") * 4.0e6).alias("extra_tokens_per_day")
    )
    points, mark, _, xaxis = _options_panel(boundary_figure(replace(analysis, what_if=per_day)))
    assert list(points.x) == per_day["extra_tokens_per_day"].to_list()
    assert xaxis.title.text == "extra tokens/day (no price table)"
    assert [d[2] for d in points.customdata] == [
        f"{d:,.0f}/day ({s:+.1%} of the calls' tokens)"
        for d, s in zip(per_day["extra_tokens_per_day"], per_day["extra_tokens_ratio"], strict=True)
    ]
    assert mark is not None

    no_budget = replace(
        analysis,
        boundary=analysis.boundary.with_columns(pl.lit(None, pl.Float64).alias("budget_ms")),
        what_if=analysis.what_if.with_columns(pl.lit(None, pl.Float64).alias("budget_ms")),
    )
    points, mark, lines, _ = _options_panel(boundary_figure(no_budget))
    before = (analysis.what_if["p99_ms"] - analysis.what_if["p99_delta_ms"]).unique().to_list()
    assert mark is None and [s.y0 for s in lines] == before


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


def _axis(fig: go.Figure, ref: str) -> Any:
    return fig.layout[ref.replace("x", "xaxis").replace("y", "yaxis")]


def test_hot_path_draws_the_baseline_beside_the_window(analysis: Analysis) -> None:
    fig = hot_path_figure(analysis)
    start, end = naive_utc(analysis.start), naive_utc(analysis.end)
    # The axis opens on the baseline: a grey band left of the window start, labelled with its p99.
    lead = fig.layout.xaxis.range[0]
    assert lead < start and fig.layout.xaxis.range[1] == end
    bands = [s for s in fig.layout.shapes if s.type == "rect"]
    assert len(bands) == analysis.hot_path.height
    assert all(b.x0 == lead and b.x1 == start for b in bands)
    labels = [a.text for a in fig.layout.annotations]
    for a in analysis.attribution.iter_rows(named=True):
        who = {"c0": esc(a["service"]), "c1": esc(a["operation"])}
        baseline = _one(fig, "baseline p99", **who)
        # The baseline p99 of the attribution frame, across the band and the window.
        assert list(baseline.y) == [a["baseline_p99_ms"]] * 3
        assert list(baseline.x) == [lead, start, end]
        assert baseline.yaxis == _one(fig, "p99", **who).yaxis
        assert f"baseline p99 {a['baseline_p99_ms']:,.0f} ms" in labels
    # Each release draws its p99 step, before → after, at the release.
    steps = [t for t in fig.data if t.name == "p99 step at release (before → after)"]
    drawn = {(x, y0, y1) for t in steps for x, y0, y1 in zip(t.x[::3], t.y[::3], t.y[1::3], strict=True)}
    for r in analysis.releases.iter_rows(named=True):
        assert (naive_utc(r["released_at"]), r["p99_before_ms"], r["p99_after_ms"]) in drawn


def test_a_release_at_the_window_start_shows_its_step(analysis: Analysis) -> None:
    # A release at the very start and no attribution row: the baseline comes from its "before" p99.
    releases = analysis.releases.filter(pl.col("version") == "2.0.1").with_columns(
        pl.lit(analysis.start).alias("released_at"),
        pl.lit(189.0).alias("p99_before_ms"),
        pl.lit(1300.0).alias("p99_after_ms"),
        pl.lit(True).alias("significant"),
    )
    fig = hot_path_figure(replace(analysis, releases=releases, attribution=analysis.attribution.clear()))
    who = {"c0": esc("chat-api"), "c1": esc(HOSTILE_TEMPLATE)}
    baseline = _one(fig, "baseline p99", **who)
    assert list(baseline.y) == [189.0] * 3
    assert fig.layout.xaxis.range[0] < naive_utc(analysis.start)  # the release is not on the left edge
    (step,) = [t for t in fig.data if t.name.startswith("p99 step")]
    assert list(step.y) == [189.0, 1300.0, None] and step.line.color == RELEASE_SIGNIFICANT


def _no_change_variant(analysis: Analysis) -> Analysis:
    """The internal operation unchanged: −1 ms, p99 down a little, verdict none."""
    unchanged = pl.col("verdict") == "internal"
    values = {
        "llm_delta_ms": -1.0,
        "internal_delta_ms": 0.4,
        "delta_ms": -2.0,
        "llm_share": 0.0,
        "internal_share": 0.0,
        "verdict": "none",
    }
    attribution = analysis.attribution.with_columns(
        pl.when(unchanged).then(pl.lit(v)).otherwise(pl.col(k)).alias(k) for k, v in values.items()
    )
    return replace(analysis, attribution=attribution)


def test_attribution_bars_say_what_they_are_and_share_one_scale(analysis: Analysis) -> None:
    variant = _no_change_variant(analysis)
    fig = build_figures(variant)["attribution"]
    split = [t for t in fig.data if t.type == "bar" and t.customdata[0][2] in ("LLM", "internal")]
    axes = sorted({t.xaxis for t in split})
    assert len(axes) == variant.attribution.height
    titles = {_axis(fig, x).title.text for x in axes}
    assert titles == {"Δ mean critical-path time per tail trace, baseline → current"}
    assert "Δ p99 (ms)" not in json.dumps(fig.to_plotly_json(), default=str)
    # One range for every operation, wide enough for the largest split (720 + 80 ms).
    ranges = {tuple(_axis(fig, x).range) for x in axes}
    assert len(ranges) == 1
    (lo, hi) = ranges.pop()
    assert lo <= -1.0 and hi >= 800.0
    # The unchanged operation: bars a fraction of the axis, and the panel says so.
    unchanged = [t for t in split if t.customdata[0][1] == esc(HOSTILE_TEMPLATE)]
    assert all(abs(t.x[0]) / (hi - lo) < 0.01 for t in unchanged)
    assert "no change in the tail" in [a.text for a in fig.layout.annotations]
    # A p99 that did not rise is not split into shares: no "(0%)".
    assert {t.y[0] for t in unchanged} == {"LLM -1 ms per tail trace", "internal +0 ms per tail trace"}
    assert all(t.customdata[0][3] == "p99 did not rise" for t in unchanged)
    # The numbers are horizontal category labels, not text squeezed (and rotated) into the bars.
    assert all(t.text is None for t in split)
    regressed = {t.name: t.y[0] for t in split if t.customdata[0][1] == esc(HOSTILE)}
    assert regressed == {
        "LLM": "LLM +720 ms per tail trace<br>90% of the p99 rise",
        "internal": "internal +80 ms per tail trace<br>10% of the p99 rise",
    }
    assert "90% of the p99 rise" in [t.customdata[0][3] for t in split]
    # The headline names its number as the p99 change, apart from the bars' per-trace means.
    headlines = [a.text for a in fig.layout.annotations if "verdict" in a.text]
    assert any("Δp99 +800 ms (p99 1,300 ms → 2,100 ms)" in h for h in headlines), headlines


def test_the_legend_sits_below_the_modebar(figures: dict[str, go.Figure]) -> None:
    for view, fig in figures.items():
        legend = fig.layout.legend
        # The toolbar takes the top MODEBAR_PX pixels at the right; the legend starts below them.
        assert legend.yref == "container" and legend.yanchor == "top", view
        assert legend.y * fig.layout.height <= fig.layout.height - MODEBAR_PX, view
        assert fig.layout.margin.t >= MODEBAR_PX + 40, view  # and above the plots


def test_thin_abandonment_buckets_are_greyed(analysis: Analysis) -> None:
    thin = analysis.abandonment.with_columns(
        pl.when(pl.col("lo_ms") == 3500).then(2).otherwise(pl.col("requests")).alias("requests"),
        pl.when(pl.col("lo_ms") == 3500).then(2).otherwise(pl.col("abandoned")).alias("abandoned"),
        pl.when(pl.col("lo_ms") == 3500).then(1.0).otherwise(pl.col("rate")).alias("rate"),
    )
    fig = build_figures(replace(analysis, abandonment=thin))["abandonment"]
    bars = _one(fig, "abandonment rate (95% Wilson interval)")
    colours = list(bars.marker.color)
    assert colours[-1] == THIN_BUCKET and set(colours[:-1]) == {CLIFF}
    assert "only 2 requests: too few for a rate" in bars.customdata[-1][8]
    assert all(row[8] == "" for row in bars.customdata[:-1])
    assert MIN_BUCKET_REQUESTS > 2


def test_cold_path_log_axes_tick_at_powers_of_ten(figures: dict[str, go.Figure]) -> None:
    fig = figures["cold_path"]
    for axis in (fig.layout.xaxis2, fig.layout.yaxis):  # the CDF's x and the series' y
        assert axis.type == "log" and axis.dtick == 1 and axis.tickformat == "~g"


def test_counts_agree_with_their_nouns(analysis: Analysis) -> None:
    one = sample_alerts().filter(pl.col("fingerprint") == "f2")
    fig = build_figures(analysis, one)["alerts"]
    assert "1 alert, 1 firing and 0 resolved transitions" in fig.layout.title.text
    assert count_of(1, "queue") == "1 queue" and count_of(2, "workflow") == "2 workflows"


def test_a_first_or_unnamed_version_is_not_drawn_as_a_release(analysis: Analysis) -> None:
    # A service's first version has nothing before it to step from ("-" before), and an empty
    # version is no release either.
    first = analysis.releases.head(1).with_columns(
        pl.lit("0.9.0").alias("version"), pl.lit(0, dtype=pl.Int64).alias("requests_before")
    )
    unnamed = analysis.releases.head(1).with_columns(pl.lit("").alias("version"))
    more = replace(analysis, releases=pl.concat([analysis.releases, first, unnamed]))
    fig = hot_path_figure(more)
    drawn = {v for t in _traces(fig, "release") for v in (row[0] for row in t.customdata)}
    assert "0.9.0" not in drawn and "" not in drawn
    assert drawn == {esc(v) for v in analysis.releases["version"].to_list()}


def test_an_operation_without_baseline_requests_says_no_baseline_data(analysis: Analysis) -> None:
    attribution = analysis.attribution.with_columns(
        pl.lit(0, dtype=pl.Int64).alias("baseline_requests"),
        pl.lit(None, dtype=pl.Float64).alias("baseline_p99_ms"),
        pl.lit(None, dtype=pl.Float64).alias("delta_ms"),
        pl.lit(0.0).alias("llm_delta_ms"),
        pl.lit(0.0).alias("internal_delta_ms"),
        pl.lit("none").alias("verdict"),
    )
    fig = build_figures(replace(analysis, attribution=attribution))["attribution"]
    texts = [a.text for a in fig.layout.annotations]
    assert texts.count("no baseline data") == attribution.height
    assert "no change in the tail" not in texts
    assert any("no baseline data (0 requests in the baseline window)" in t for t in texts)
    assert not any("Δp99" in t for t in texts)
