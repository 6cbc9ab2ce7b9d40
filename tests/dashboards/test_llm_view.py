"""The LLM view against the frames analytics computed: every mark read back from ``llm_anatomy``
and the attribution's llm cause, estimated figures marked with their interval, the words it says
when there is no price, no llm regression or no model call, and its layout in Chromium."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import polars as pl
import pytest

from analytics import Analysis, analyze
from collectors import insert_spans
from dashboards import build_figures, write_dashboards
from dashboards.landing import headline
from dashboards.style import esc, naive_utc
from dashboards.views.llm import (
    ANATOMY_PARTS,
    NO_CALLS_TEXT,
    NO_CURRENT_CALLS_TEXT,
    NO_LLM_REGRESSION_TEXT,
    NO_PRICES_TEXT,
    NO_SERIES_TEXT,
    NO_TTFT_SERIES_TEXT,
    PANELS,
    llm_figure,
    model_label,
)
from storage import Store
from tailwatch.config import load_config
from tests.dashboards.browser import chromium, overlapping, text_boxes
from tests.dashboards.frames import HOSTILE, HOSTILE_TEMPLATE, empty_like, oncall_alerts, sample_analysis
from tests.dashboards.llm_frames import with_sample_llm
from tests.dashboards.traces import END, START, dashboard_spans

PANEL_BY_TITLE = {p.title: p for row in PANELS for p in row}


@pytest.fixture(scope="module")
def analysis() -> Analysis:
    return sample_analysis(hostile=True)


def _marks(fig: go.Figure) -> dict[tuple[str, str, str], dict[str, Any]]:
    """(model label, panel title, side) → the mark drawn: x, symbol, and its error bar if any."""
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for trace in fig.data:
        if trace.type != "scatter" or trace.mode != "markers":
            continue
        err = trace.error_x
        for i, (label, title, side, *_) in enumerate(trace.customdata):
            key = (label, title, side)
            assert key not in out, key
            out[key] = {
                "x": trace.x[i],
                "symbol": trace.marker.symbol,
                "text": trace.customdata[i][3],
                "error": (err.arrayminus[i], err.array[i]) if err.array is not None else None,
            }
    return out


def _annotations(fig: go.Figure) -> list[str]:
    return [a.text for a in fig.layout.annotations]


def test_each_model_s_figures_are_drawn_baseline_beside_current(analysis: Analysis) -> None:
    anatomy = analysis.llm_anatomy
    # The sample holds one model whose first token every call recorded and one never streamed.
    assert sorted(anatomy["ttft_source"].to_list()) == ["attribute", "estimated"]
    marks = _marks(llm_figure(analysis))
    drawn = 0
    for row in anatomy.iter_rows(named=True):
        label = model_label(row["provider"], row["model"])
        for title, panel in PANEL_BY_TITLE.items():
            for side, prefix in (("current", ""), ("baseline", "baseline_")):
                value = row[prefix + panel.column]
                mark = marks.get((label, esc(title), side))
                if value is None:
                    assert mark is None, (label, title, side)
                    continue
                drawn += 1
                assert mark is not None and mark["x"] == pytest.approx(value), (label, title, side)
                estimated = panel.estimate is not None and row[prefix + "ttft_source"] == "estimated"
                if estimated:
                    assert panel.estimate is not None
                    lo, hi = (row[prefix + c] for c in panel.estimate)
                    # The 95% interval as asymmetric error bars, and the word in the hover.
                    assert mark["symbol"] == "diamond-open", (label, title)
                    assert mark["error"] == (pytest.approx(value - lo), pytest.approx(hi - value))
                    assert "estimated" in mark["text"] and "95% interval" in mark["text"]
                else:
                    assert mark["symbol"] == "circle" and mark["error"] is None, (label, title)
    # Both models in both windows (gpt-4o's cost only: the other has no price).
    assert drawn == len(marks) and drawn >= 2 * 2 * 7
    gpt = anatomy.filter(pl.col("model") == "gpt-4o").row(0, named=True)
    assert gpt["baseline_ttft_p50_ms"] == pytest.approx(400, rel=0.1)
    assert gpt["ttft_p50_ms"] == pytest.approx(1600, rel=0.1)
    other = anatomy.filter(pl.col("model") != "gpt-4o").row(0, named=True)
    assert other["cost_per_1k_calls"] is None and gpt["cost_per_1k_calls"] > 0


def test_every_model_string_is_escaped_and_no_mark_uses_the_llm_colour(analysis: Analysis) -> None:
    fig = llm_figure(analysis)
    labels = {m[0] for m in _marks(fig)}
    assert esc(f"anthropic / {HOSTILE_TEMPLATE}")[:20] in " ".join(labels)
    blob = str(fig.to_plotly_json())
    assert HOSTILE not in blob and "<b>bold</b>" not in blob
    assert not any("op %{x}" in (t.hovertemplate or "") for t in fig.data)


def test_the_anatomy_bar_is_the_attribution_s_breakdown_with_whose_change(analysis: Analysis) -> None:
    [row] = analysis.attribution.filter(pl.col("llm_cause").is_not_null()).iter_rows(named=True)
    assert row["llm_cause"] == "provider_first_token" and row["llm_cause_ours"] is False
    fig = llm_figure(analysis)
    bars = {t.name: t for t in fig.data if t.type == "bar"}
    assert set(bars) == {name for _, name, _ in ANATOMY_PARTS}
    for column, name, colour in ANATOMY_PARTS:
        assert bars[name].x[0] == pytest.approx(row[column] or 0.0), name
        assert bars[name].marker.color == colour
        assert bars[name].y[0] == model_label(row["llm_cause_provider"], row["llm_cause_model"])
    # The parts add up to the LLM delta on the tail's critical path.
    assert sum(b.x[0] for b in bars.values()) == pytest.approx(row["llm_delta_ms"], abs=0.5)
    [title] = [a for a in _annotations(fig) if a.startswith(f"chat-api · {esc(HOSTILE)}: LLM +720 ms")]
    assert "<b>the provider</b>" in title and esc(row["llm_cause_text"]) in title
    assert "time to first token" in row["llm_cause_text"]


def test_a_longer_prompt_is_said_to_be_our_change() -> None:
    analysis = with_sample_llm(sample_analysis(hostile=False), "claude-sonnet-4", cause="longer_prompts")
    [row] = analysis.attribution.filter(pl.col("llm_cause").is_not_null()).iter_rows(named=True)
    assert row["llm_cause"] == "longer_prompts" and row["llm_cause_ours"] is True
    fig = llm_figure(analysis)
    [title] = [a for a in _annotations(fig) if a.startswith("chat-api · POST /chat: LLM")]
    assert "<b>our change</b>" in title and "prompts" in title
    first = next(t for t in fig.data if t.type == "bar" and t.name == "first token")
    assert first.x[0] == pytest.approx(row["llm_first_token_ms"])
    line = headline("llm", analysis, None)
    assert line.startswith("2 models; 1 llm regression: chat-api · POST /chat longer prompts (our change)")


def test_without_prices_the_view_names_the_key_that_adds_them(tmp_path: Path) -> None:
    analysis = with_sample_llm(sample_analysis(hostile=False), "claude-sonnet-4", prices=())
    fig = llm_figure(analysis)
    assert NO_PRICES_TEXT in _annotations(fig)
    assert not any(m[1].startswith("cost") for m in _marks(fig))
    # The key the view names is the one the configuration reads.
    path = tmp_path / "tailwatch.toml"
    path.write_text(
        '[[analysis.prices]]\nprovider = "openai"\nmodel = "gpt-4o"\n'
        "input = 2.5\ncached_input = 1.25\noutput = 10.0\n"
    )
    conventions = load_config(path, env={}).analysis.conventions_object()
    assert conventions is not None and [p.model for p in conventions.llm_prices] == ["gpt-4o"]
    assert "[[analysis.prices]]" in NO_PRICES_TEXT
    for key in ("provider", "model", "input", "cached_input", "output"):
        assert key in NO_PRICES_TEXT


def test_a_model_without_a_price_is_named_under_the_cost_panels(analysis: Analysis) -> None:
    texts = _annotations(llm_figure(analysis))
    assert NO_PRICES_TEXT not in texts
    [note] = [t for t in texts if t.startswith("no price for ")]
    assert (
        note == f"no price for {model_label('anthropic', HOSTILE_TEMPLATE)}:<br>add it to [[analysis.prices]]"
    )


def test_no_llm_regression_is_said(analysis: Analysis) -> None:
    quiet = replace(
        analysis, attribution=analysis.attribution.with_columns(pl.lit(None, pl.String).alias("llm_cause"))
    )
    fig = llm_figure(quiet)
    assert not [t for t in fig.data if t.type == "bar"]
    assert NO_LLM_REGRESSION_TEXT in _annotations(fig)
    # A run stored before the cause columns existed has no anatomy bar either.
    old = replace(analysis, attribution=analysis.attribution.drop("llm_cause"))
    assert NO_LLM_REGRESSION_TEXT in _annotations(llm_figure(old))


def _series(fig: go.Figure, label: str, name: str) -> Any:
    found = [
        t for t in fig.data if t.name == name and t.customdata is not None and t.customdata[0][0] == label
    ]
    assert len(found) <= 1, (label, name)
    return found[0] if found else None


def _check_series(analysis: Analysis, fig: go.Figure) -> int:
    """Every model's lines over time against ``llm_anatomy_series``, its baseline p50s across."""
    drawn = 0
    for row in analysis.llm_anatomy.iter_rows(named=True):
        label = model_label(row["provider"], row["model"])
        mine = analysis.llm_anatomy_series.filter(
            (pl.col("provider") == row["provider"]) & (pl.col("model") == row["model"])
        ).sort("bucket_start")
        measured = mine["ttft_p50_ms"].drop_nulls().len() > 0
        for column, name, baseline in (
            ("ttft_p50_ms", "first token p50", "baseline_ttft_p50_ms"),
            ("ttft_p99_ms", "first token p99", None),
            ("ms_per_output_token_p50", "time per output token p50", "baseline_ms_per_output_token_p50"),
            ("input_tokens_p50", "input tokens p50", "baseline_input_tokens_p50"),
            ("output_tokens_p50", "output tokens p50", "baseline_output_tokens_p50"),
        ):
            trace = _series(fig, label, name)
            if column.startswith(("ttft", "ms_per")) and not measured:
                assert trace is None, (label, name)
                continue
            assert trace is not None, (label, name)
            assert list(trace.x) == [naive_utc(t) for t in mine["bucket_start"]]
            assert list(trace.y) == mine[column].to_list()
            drawn += 1
            line = _series(fig, label, f"baseline {name}")
            if baseline is None or row[baseline] is None:
                assert line is None, (label, name)
            else:
                assert line is not None and list(line.y) == [row[baseline]] * 2, (label, name)
    return drawn


def test_each_model_s_series_over_time_with_the_baseline_s_figure(analysis: Analysis) -> None:
    fig = llm_figure(analysis)
    assert _check_series(analysis, fig) == 5 + 2  # gpt-4o: all five; the never-streamed model: tokens
    # The never-streamed model's first token has no series (the estimate needs a window's calls).
    assert _annotations(fig).count(NO_TTFT_SERIES_TEXT) == 2
    gpt = analysis.llm_anatomy_series.filter(pl.col("model") == "gpt-4o")
    assert gpt["ttft_p50_ms"].median() == pytest.approx(1600, rel=0.15)
    # A model called in the baseline window only has no row over time, and says so.
    gone = analysis.llm_anatomy_series.filter(pl.col("model") != "gpt-4o")
    texts = _annotations(llm_figure(replace(analysis, llm_anatomy_series=gone)))
    assert f"<b>openai / gpt-4o</b>: {NO_CURRENT_CALLS_TEXT}" in texts
    # A run stored before the series existed says so instead of drawing nothing.
    old = llm_figure(replace(analysis, llm_anatomy_series=analysis.llm_anatomy_series.clear()))
    assert NO_SERIES_TEXT in _annotations(old)
    assert not [t for t in old.data if t.type == "scatter" and t.mode == "lines+markers"]


def test_no_model_call_is_said_in_words(analysis: Analysis) -> None:
    empty = empty_like(analysis)
    fig = build_figures(empty)["llm"]
    assert len(fig.data) == 0 and _annotations(fig) == [NO_CALLS_TEXT]
    assert headline("llm", empty, None) == NO_CALLS_TEXT


def test_the_landing_line_names_the_regression_and_whose_change(analysis: Analysis) -> None:
    line = headline("llm", analysis, None)
    assert line.startswith(
        f"2 models; 1 llm regression: chat-api · {HOSTILE} provider first token (the provider)"
    )
    quiet = replace(
        analysis, attribution=analysis.attribution.with_columns(pl.lit(None, pl.String).alias("llm_cause"))
    )
    line = headline("llm", quiet, None)
    assert "0 llm regressions: openai / gpt-4o first token " in line
    assert "(estimated)" in line  # the never-streamed model's figure says what it is


def test_figures_of_a_real_analysis_match_its_frames(store: Store) -> None:
    """Spans in the store → analyze → the view: gpt-4o's calls record no first token (estimated)."""
    insert_spans(store, dashboard_spans(requests=60))
    analysis = analyze(store, START, END)
    marks = _marks(llm_figure(analysis))
    assert analysis.llm_anatomy.height >= 1
    for row in analysis.llm_anatomy.iter_rows(named=True):
        label = model_label(row["provider"], row["model"])
        for title, panel in PANEL_BY_TITLE.items():
            for side, prefix in (("current", ""), ("baseline", "baseline_")):
                value = row[prefix + panel.column]
                mark = marks.get((label, esc(title), side))
                assert (mark is None) == (value is None), (label, title, side)
                if mark is not None:
                    assert mark["x"] == pytest.approx(value)
        assert (label, esc("cost per 1,000 calls"), "current") not in marks  # no price configured
    assert _check_series(analysis, llm_figure(analysis)) >= 2
    assert NO_PRICES_TEXT in _annotations(llm_figure(analysis))


@pytest.mark.slow
@pytest.mark.parametrize("prices", [True, False], ids=["prices", "no-prices"])
def test_llm_titles_never_overlap_at_common_widths(tmp_path: Path, prices: bool) -> None:
    """Section lines, panel titles, axis titles, model labels, the price note and the anatomy bar's
    two-line title: at 1280 and 1920 px no two texts of the figure share pixels."""
    analysis = sample_analysis(hostile=True)
    if not prices:
        analysis = with_sample_llm(analysis, HOSTILE_TEMPLATE, prices=())
    write_dashboards(analysis, tmp_path, alerts=oncall_alerts(hostile=True))
    with chromium() as browser:
        for width in (1280, 1920):
            shot = tmp_path / f"llm-{width}.png"
            boxes = text_boxes(browser, tmp_path / "llm.html", width, screenshot=shot)
            assert overlapping(boxes) == [], width
            texts = [b["text"] for b in boxes]
            for title in PANEL_BY_TITLE:
                if prices or not title.startswith("cost"):
                    assert title in texts, (title, width)
            assert any(t.startswith(f"chat-api · {HOSTILE}: LLM +720 ms") for t in texts), texts
            assert any("[[analysis.prices]]" in t for t in texts)
            assert shot.stat().st_size > 10_000
