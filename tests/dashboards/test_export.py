"""export_dashboards against a real embedded store, the files it writes, PNG and the CLI."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from analytics import load_run
from collectors import insert_spans
from dashboards import (
    PLOTLY_JS,
    VIEWS,
    DashboardError,
    PngExportError,
    build_figures,
    export_dashboards,
    plotly_js_source,
    write_dashboards,
)
from dashboards.export import write_pngs
from storage import Store, ensure_schema, open_store
from tailwatch.cli import main
from tests.analytics.builders import scenario_internal_regression
from tests.dashboards.frames import HOSTILE, sample_analysis
from tests.dashboards.traces import END, START, dashboard_spans

HTML_FILES = [f"{v}.html" for v in VIEWS] + ["index.html"]


@pytest.fixture
def filled(store: Store) -> Store:
    insert_spans(store, dashboard_spans(requests=100))
    return store


def test_export_analyses_each_window_afresh_and_without_one_shows_the_latest_run(
    filled: Store, tmp_path: Path
) -> None:
    first = export_dashboards(filled, tmp_path / "a", START, END)
    assert first.computed and first.analysis_run_id
    assert (first.start, first.end) == (START, END)
    assert sorted(p.name for p in first.files) == sorted(HTML_FILES)
    assert all(p.parent == tmp_path / "a" and p.stat().st_size > 0 for p in first.files)
    # The same window again is analysed again (spans may have arrived since): a new run, the
    # same figures.
    again = export_dashboards(filled, tmp_path / "b", START, END)
    assert again.computed and again.analysis_run_id not in (None, first.analysis_run_id)
    assert (
        load_run(filled, again.analysis_run_id).to_dict() == load_run(filled, first.analysis_run_id).to_dict()
    )
    latest = export_dashboards(filled, tmp_path / "c")  # no window: the latest persisted run
    assert not latest.computed and latest.analysis_run_id == again.analysis_run_id
    assert (latest.start, latest.end) == (START, END)
    # Alerting has run nowhere: the timeline says so rather than drawing nothing.
    assert first.alerts == 0
    assert "no alerts in this window" in (tmp_path / "a" / "alerts.html").read_text(encoding="utf-8")


def test_pages_are_self_contained_and_escaped(tmp_path: Path) -> None:
    files = write_dashboards(sample_analysis(hostile=True), tmp_path, run_id="r<1>")
    assert [p.name for p in files] == HTML_FILES
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"<script[^>]+src=", text), path.name  # nothing fetched: plotly.js is inline
        assert "<link" not in text and "@import" not in text, path.name
        assert HOSTILE not in text, path.name  # neither in the page nor in the figure JSON
        assert "r&lt;1&gt;" in text and "r<1>" not in text, path.name
        if path.name != "index.html":
            assert len(text) > 3_000_000 and "plotly.js v" in text, path.name  # the library itself
            assert text.count("Plotly.newPlot(") == 1, path.name
    index = (tmp_path / "index.html").read_text(encoding="utf-8")
    for view in VIEWS:
        assert f'href="{view}.html"' in index
    assert "2 operations; 1 release in the window stepped p99 up or added sync LLM calls" in index
    assert "2 queues, 1 starved" in index


def test_pages_written_together_can_share_one_plotly_js(tmp_path: Path) -> None:
    """``shared``: one copy beside the pages, each page ~1% of an inlined one; a served URL: no copy."""
    inline = write_dashboards(sample_analysis(hostile=False), tmp_path / "inline")
    shared = write_dashboards(sample_analysis(hostile=False), tmp_path / "shared", plotly_js="shared")
    assert [p.name for p in shared] == [PLOTLY_JS, *HTML_FILES]
    assert (tmp_path / "shared" / PLOTLY_JS).read_bytes() == plotly_js_source().read_bytes()
    sizes = {p.name: p.stat().st_size for p in inline}
    for path in shared[1:-1]:
        text = path.read_text(encoding="utf-8")
        assert re.findall(r'<script[^>]+src="([^"]+)"', text) == [PLOTLY_JS], path.name
        assert "plotly.js v" not in text and text.count("Plotly.newPlot(") == 1, path.name
        assert path.stat().st_size < sizes[path.name] / 20, path.name
    served = write_dashboards(
        sample_analysis(hostile=False), tmp_path / "served", plotly_js=f"../../{PLOTLY_JS}"
    )
    assert [p.name for p in served] == HTML_FILES  # nothing but the pages
    attribution = (tmp_path / "served" / "attribution.html").read_text(encoding="utf-8")
    assert re.findall(r'<script[^>]+src="([^"]+)"', attribution) == [f"../../{PLOTLY_JS}"]
    with pytest.raises(
        DashboardError, match=r"plotly_js: expected 'inline', 'shared' or a URL ending in \.js"
    ):
        write_dashboards(sample_analysis(hostile=False), tmp_path / "bad", plotly_js='x.js" onload="y')


def test_unknown_format_lists_the_allowed_ones(tmp_path: Path) -> None:
    with pytest.raises(DashboardError, match=r"unknown dashboard format 'pdf'; allowed: html, png"):
        write_dashboards(sample_analysis(), tmp_path, formats=("pdf",))  # type: ignore[arg-type]


def test_png_without_a_browser_is_one_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-chromium"))
    missing = r"BROWSER_PATH=.*no-such-chromium.* is not an executable browser"
    with pytest.raises(PngExportError, match=missing):
        write_pngs(build_figures(sample_analysis()), tmp_path)
    # A browser that cannot be launched (here: a program that exits at once) is one sentence too.
    monkeypatch.setenv("BROWSER_PATH", "/bin/true")
    failed = r"^PNG export through kaleido with /bin/true failed: \w+"
    with pytest.raises(PngExportError, match=failed) as info:
        write_pngs({"alerts": build_figures(sample_analysis())["alerts"]}, tmp_path)
    assert "\n" not in str(info.value)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tailwatch", "dashboard", "export", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.slow
def test_cli_export_html_and_png(store_dsn: str, tmp_path: Path) -> None:
    with open_store(store_dsn) as store:  # closed before the CLI opens the same embedded store
        ensure_schema(store)
        insert_spans(store, dashboard_spans(requests=60))
    out = tmp_path / "out"
    result = _cli(
        "--store", store_dsn, "--out", str(out), "--start", "2026-11-02T09:00:00Z",
        "--end", "2026-11-02T10:00:00Z", "--format", "html", "--format", "png",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    written = sorted(Path(line).name for line in result.stdout.splitlines())
    assert written == sorted(HTML_FILES + [f"{v}.png" for v in VIEWS])
    assert "window 2026-11-02T09:00:00Z → 2026-11-02T10:00:00Z · analysed now" in result.stderr
    # The seconds in headless Chromium are announced before the wait, not after it.
    assert result.stderr.index("rendering the views as PNG") < result.stderr.index("files in")
    index = (out / "index.html").read_text(encoding="utf-8")
    assert 'href="attribution.png"' in index and 'href="attribution.html"' in index
    for view in VIEWS:  # real images, 1400 px wide (kaleido and the system Chromium)
        data = (out / f"{view}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, view
        assert int.from_bytes(data[16:20], "big") == 1400, view


def test_cli_errors_are_one_line(store_dsn: str, tmp_path: Path) -> None:
    def run(*args: str) -> Result:
        argv = ["dashboard", "export", "--store", store_dsn, "--out", str(tmp_path), *args]
        return CliRunner().invoke(main, argv)

    bad_format = run("--format", "pdf")
    assert bad_format.exit_code == 2 and "'pdf' is not one of 'html', 'png'" in bad_format.output
    bad_time = run("--start", "yesterday")
    assert bad_time.exit_code == 2 and "'yesterday' is not an ISO 8601 time" in bad_time.output
    empty = run("--start", "2026-11-02T10:00:00Z", "--end", "2026-11-02T09:00:00+00:00")
    assert empty.exit_code == 2
    assert empty.output.strip().splitlines()[-1].startswith("tailwatch: error: dashboard window is empty")


def test_default_window_is_the_last_24_hours_when_nothing_is_persisted(store: Store, tmp_path: Path) -> None:
    before = datetime.now(UTC)
    report = export_dashboards(store, tmp_path)
    assert report.computed and report.start is not None and report.end is not None
    assert before <= report.end <= datetime.now(UTC)
    assert report.end - report.start == timedelta(hours=24)
    only_end = export_dashboards(store, tmp_path / "e", end=END)
    assert (only_end.start, only_end.end) == (END - timedelta(hours=24), END)


def test_alerts_fired_at_the_window_end_are_on_the_timeline(store: Store, tmp_path: Path) -> None:
    from slo_rules import evaluate, load_rules

    scenario = scenario_internal_regression(requests=400)
    insert_spans(store, scenario.spans)
    # The default pack compares the last hour with the hour before; rules run at the window end.
    evaluate(store, load_rules(), scenario.end)
    report = export_dashboards(store, tmp_path, scenario.start, scenario.end)
    assert report.alerts >= 1
    page = (tmp_path / "alerts.html").read_text(encoding="utf-8")
    assert "hot-path-p99-regression" in page and "no alerts in this window" not in page
    attribution = (tmp_path / "attribution.html").read_text(encoding="utf-8")
    assert "hot-path-p99-regression (firing, cause internal)" in attribution


def test_figures_of_a_real_analysis_match_its_frames(filled: Store) -> None:
    """The same read-back as test_figures, on frames computed by analytics from stored spans."""
    import polars as pl

    from analytics import analyze
    from dashboards.style import esc, naive_utc

    analysis = analyze(filled, START, END)
    figures = build_figures(analysis)
    hot = figures["hot_path"]
    for service, operation in analysis.hot_path.select("service", "operation").iter_rows():
        series = analysis.hot_path_series.filter(
            (pl.col("service") == service) & (pl.col("operation") == operation)
        ).sort("bucket_start")
        (p99,) = [t for t in hot.data if t.name == "p99" and t.customdata[0][1] == esc(operation)]
        assert list(p99.x) == [naive_utc(v) for v in series["bucket_start"]]
        assert list(p99.y) == series["p99_ms"].to_list()
    cold = figures["cold_path"]
    waits = next(t for t in cold.data if t.name == "queue wait p99")
    summary = analysis.cold_path.sort(["jobs", "queue"], descending=[True, False])
    assert list(waits.x) == [esc(q) for q in summary["queue"]]
    assert list(waits.y) == summary["queue_wait_p99_s"].to_list()
    rates = [t for t in figures["abandonment"].data if t.type == "bar"]
    assert sorted(v for t in rates for v in t.y) == sorted(analysis.abandonment["rate"].to_list())
    observed = next(t for t in figures["retries"].data if t.name == "observed")
    assert list(observed.y) == analysis.retry_amplification["attempt_amplification"].to_list()
    split = {
        (t.customdata[0][1], t.name): t.x[0]
        for t in figures["attribution"].data
        if t.type == "bar" and t.customdata[0][2] in ("LLM", "internal")
    }
    for row in analysis.attribution.iter_rows(named=True):
        assert split[(esc(row["operation"]), "LLM")] == row["llm_delta_ms"]
        assert split[(esc(row["operation"]), "internal")] == row["internal_delta_ms"]
    assert split[(esc("POST /chat"), "LLM")] > 1000  # the builders' LLM regression: +1200 ms in the tail
