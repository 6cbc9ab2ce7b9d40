"""Exported dashboards in a real headless Chromium, opened from disk with the network off."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import polars as pl
import pytest

from collectors import insert_spans
from dashboards import VIEWS, export_dashboards, write_dashboards
from dashboards.export import TRACE_END_SLACK
from dashboards.views.attribution import EXEMPLARS, SPANS_TITLE, SPLIT_TITLE
from dashboards.views.boundary import COLUMN_TITLES
from slo_rules import trace_link
from storage import Store
from tests.dashboards.browser import chromium, open_page, overlapping, text_boxes
from tests.dashboards.frames import (
    HOSTILE,
    HOSTILE_FLAG,
    HOSTILE_TEMPLATE,
    oncall_alerts,
    priced,
    sample_alerts,
    sample_analysis,
)
from tests.dashboards.traces import END, START, dashboard_spans

pytestmark = pytest.mark.slow

# Where each hostile string is drawn (as plain text) in the sample analysis.
EXPECTED_TEXT = {
    # Markup in a name stays literal text: "<b>bold</b>" is not drawn bold with its tags dropped.
    "hot_path": [HOSTILE, HOSTILE_TEMPLATE],
    "cold_path": [HOSTILE],
    "abandonment": [HOSTILE],
    "retries": [HOSTILE_FLAG],
    "attribution": [HOSTILE, HOSTILE_FLAG, HOSTILE_TEMPLATE],
    "llm": [HOSTILE, HOSTILE_TEMPLATE],
    "boundary": [HOSTILE, HOSTILE_TEMPLATE],
    "drift": [HOSTILE, HOSTILE_FLAG, HOSTILE_TEMPLATE],  # the function, the queue, a release
    "alerts": [HOSTILE, HOSTILE_FLAG],
}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dashboards")
    write_dashboards(sample_analysis(hostile=True), out, alerts=sample_alerts(hostile=True), run_id="run-1")
    return out


def test_every_page_renders_offline_with_hostile_names_as_text(
    exported: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    shots = tmp_path_factory.mktemp("screenshots")
    with chromium() as browser:
        for view in VIEWS:
            report = open_page(browser, exported / f"{view}.html", shots)
            assert report.console_errors == [], (view, report.console_errors)
            assert report.page_errors == [], (view, report.page_errors)
            assert report.blocked_requests == [], (view, report.blocked_requests)
            assert report.dialogs == [], (view, report.dialogs)
            dom = report.dom
            assert dom["xss"] is False, view
            assert dom["imgs"] == 0, view  # no <img> element was created from the data
            assert len(dom["plots"]) == 1, view
            plot = dom["plots"][0]
            assert plot["svgs"] >= 1 and plot["marks"] > 0, (view, plot)
            assert plot["width"] > 500 and plot["height"] > 300, (view, plot)
            for text in EXPECTED_TEXT[view]:
                assert text in dom["svgText"], (view, text)
            assert report.screenshot is not None and report.screenshot.stat().st_size > 10_000
        index = open_page(browser, exported / "index.html", shots)
        assert index.console_errors == [] and index.blocked_requests == [] and index.dialogs == []
        assert set(index.dom["links"]) >= {f"{v}.html" for v in VIEWS} | {"index.html"}
        assert "no alerts in this window" not in index.dom["bodyText"]


def test_attribution_titles_never_overlap_at_common_widths(tmp_path: Path) -> None:
    """Issue 38: the operation's headline ran into "top spans behind the change". At 1280 and 1920
    px, with hostile names and four alerts under one operation, no two texts of the figure share
    pixels (bounding boxes from the page), and the headline is above both column titles."""
    write_dashboards(sample_analysis(hostile=True), tmp_path, alerts=oncall_alerts(hostile=True))
    with chromium() as browser:
        for width in (1280, 1920):
            shot = tmp_path / f"attribution-{width}.png"
            boxes = text_boxes(browser, tmp_path / "attribution.html", width, screenshot=shot)
            assert overlapping(boxes) == [], width
            headline = next(b for b in boxes if b["text"].startswith(f"chat-api · {HOSTILE}: Δp99"))
            columns = [b for b in boxes if b["text"] in (SPLIT_TITLE, SPANS_TITLE)]
            assert len(columns) == 4, [b["text"] for b in boxes]
            assert headline["y"] + headline["height"] <= min(b["y"] for b in columns) + 1
            assert "alert: hot-path-p99-regression" in headline["text"]
            assert shot.stat().st_size > 10_000


@pytest.mark.parametrize("prices", [False, True], ids=["tokens", "prices"])
def test_boundary_titles_never_overlap_at_common_widths(tmp_path: Path, prices: bool) -> None:
    """Each operation's headline, its three column titles, the what-if panel's line labels and axis
    titles (with and without a price table): at 1280 and 1920 px no two texts of the figure share
    pixels, and each headline is above its row's column titles. The operation within budget has one
    latency bucket where nobody abandoned: its axes still get ticks that differ."""
    analysis = sample_analysis(hostile=True)
    one_bucket = pl.DataFrame(
        [("chat-api", HOSTILE_TEMPLATE, 0, 500, 40, 0, 0.0, 0.0, 0.09)],
        schema=analysis.abandonment.schema,
        orient="row",
    )
    analysis = replace(analysis, abandonment=pl.concat([analysis.abandonment, one_bucket]))
    write_dashboards(priced(analysis) if prices else analysis, tmp_path, alerts=oncall_alerts(hostile=True))
    with chromium() as browser:
        for width in (1280, 1920):
            shot = tmp_path / f"boundary-{width}.png"
            boxes = text_boxes(browser, tmp_path / "boundary.html", width, screenshot=shot)
            assert overlapping(boxes) == [], width
            texts = [b["text"] for b in boxes]
            for title in COLUMN_TITLES:
                assert texts.count(title) == analysis.boundary.height, (title, texts)
            headlines = [b for b in boxes if b["text"].startswith("chat-api · ")]
            assert len(headlines) == analysis.boundary.height, texts
            columns = sorted((b for b in boxes if b["text"] in COLUMN_TITLES), key=lambda b: b["y"])
            for i, headline in enumerate(sorted(headlines, key=lambda b: b["y"])):
                row = columns[3 * i : 3 * i + 3]
                assert headline["y"] + headline["height"] <= min(b["y"] for b in row) + 1, width
            axis = "extra cost (USD/day)" if prices else "extra tokens, share of the calls' (no price table)"
            [axis_title] = [t for t in texts if t.startswith(axis)]
            # With prices, the option whose model has none is named under the axis, not drawn.
            assert ("not drawn: cost unknown" in axis_title) is prices
            requests = analysis.what_if["requests"][0]
            assert "budget 2,000 ms" in texts and f"p99 now 2,100 ms, last {requests:,} requests" in texts
            assert shot.stat().st_size > 10_000


def test_landing_page_shows_what_is_firing_as_text(tmp_path: Path) -> None:
    """The on-call page in Chromium: firing alerts with hostile names, causes and queues drawn as text."""
    write_dashboards(sample_analysis(hostile=True), tmp_path, alerts=oncall_alerts(hostile=True))
    with chromium() as browser:
        page = open_page(browser, tmp_path / "index.html", tmp_path)
    assert page.console_errors == page.page_errors == page.dialogs == page.blocked_requests == []
    assert page.dom["xss"] is False and page.dom["imgs"] == 0
    text = page.dom["bodyText"]
    assert text.index("Firing now (4)") < text.index("Resolved in this window (3)") < text.index("Views")
    for literal in (
        f"queue {HOSTILE}",
        f"workflow {HOSTILE_FLAG}",
        f"chat-api · {HOSTILE}",
        HOSTILE_TEMPLATE,
    ):
        assert literal in text, literal
    assert "p99 1,300 ms → 2,100 ms (+800 ms)" in text
    evidence = set(page.dom["links"])
    assert {"attribution.html", "hot_path.html", "cold_path.html", "abandonment.html"} <= evidence
    assert {"retries.html", "boundary.html"} <= evidence


def test_pages_exported_from_a_store_render(store: Store, tmp_path: Path) -> None:
    """End to end: hostile span names in the store → analysis → export → Chromium."""
    insert_spans(store, dashboard_spans(requests=60))
    report = export_dashboards(store, tmp_path / "out", START, END)
    assert report.computed
    with chromium() as browser:
        for view in VIEWS:
            page = open_page(browser, tmp_path / "out" / f"{view}.html", tmp_path)
            assert page.console_errors == page.page_errors == page.dialogs == page.blocked_requests == []
            assert page.dom["xss"] is False and page.dom["imgs"] == 0
            plot = page.dom["plots"][0]
            assert plot["svgs"] >= 1 and plot["marks"] > 0, (view, plot)
            if view == "drift":
                # An hour of traffic shows no drift over 14 days, and says so.
                assert "no sign of drift in the 14 days before" in page.dom["svgText"]
            elif view == "llm":
                # The builders' model calls; the hostile operations call no model.
                assert "openai / gpt-4o" in page.dom["svgText"]
            elif view != "alerts":
                assert HOSTILE in page.dom["svgText"], view
        assert "no alerts in this window" in page.dom["svgText"]


def test_exemplar_ids_link_to_the_configured_trace_viewer(tmp_path: Path) -> None:
    # A Grafana Explore template: quotes and braces in the URL, the id and window filled in.
    template = (
        'http://grafana.local:3000/explore?left={{"queries":[{{"query":"{trace_id}"}}]}}'
        "&from={start}&to={end}"
    )
    analysis = sample_analysis()
    write_dashboards(analysis, tmp_path, trace_url=template)
    expected = {
        trace_id: trace_link(template, trace_id, start=analysis.start, end=analysis.end + TRACE_END_SLACK)
        for ids in analysis.attribution["exemplar_trace_ids"].to_list()
        for trace_id in ids[:EXEMPLARS]
    }
    with chromium() as browser:
        page = open_page(browser, tmp_path / "attribution.html", tmp_path)
    assert page.console_errors == page.page_errors == page.blocked_requests == []
    links = [link for link in page.dom["links"] if link and link.startswith("http://grafana.local")]
    # Every exemplar of the page's table opens its trace, the URL exactly as the template made it.
    assert sorted(links) == sorted(url for url in expected.values() if url)
