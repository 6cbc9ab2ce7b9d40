"""The Drift view: per finding of the drift report, the per-day series it rests on, its then/now edges
and ``since`` marked, titled with the finding's sentence; in words when there is none. Figures are
read back against the report they came from (hand-built, then one the analytics read from generated
spans with a known truth), and the export reads the report kept for the hour rather than again."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import plotly.graph_objects as go
import pytest
from click.testing import CliRunner

from analytics import DriftReport
from analytics.schema import DRIFT_REPORTS_TABLE
from collectors.spans import insert_spans
from dashboards import build_figures, export_dashboards
from dashboards.landing import evidence_view, headline
from dashboards.style import esc, naive_utc
from dashboards.views.drift import DRIFT_SERIES, NO_DRIFT_REPORT_TEXT, drift_figure
from slo_rules import drift_symptom
from storage import ensure_schema, open_store
from tests.analytics.builders import scenario_drift
from tests.dashboards.frames import (
    DRIFT_EDGE_DAYS,
    HOSTILE,
    HOSTILE_FLAG,
    empty_like,
    sample_analysis,
    sample_drift,
)


def _rows(fig: go.Figure) -> dict[str, list[go.Scatter | go.Bar]]:
    """Traces per x axis (one per finding's row)."""
    out: dict[str, list[go.Scatter | go.Bar]] = {}
    for trace in fig.data:
        out.setdefault(trace.xaxis or "x", []).append(trace)
    return out


def _check_panels(fig: go.Figure, report: DriftReport) -> None:
    """Every finding's row draws its by_day series, its bands, its edges and its since line."""
    findings = sorted(report.findings, key=lambda f: f.severity != "critical")
    rows = _rows(fig)
    assert len(rows) == len(findings)
    titles = [a.text for a in fig.layout.annotations if a.yref == "paper"]
    ordered = sorted(rows.items(), key=lambda kv: int(kv[0][1:] or 1))
    for (axis, traces), finding in zip(ordered, findings, strict=True):
        spec = DRIFT_SERIES[finding.kind]
        days = [naive_utc(r["day"]) for r in finding.by_day]
        measure = next(t for t in traces if t.name == spec.measure_title)
        assert list(measure.x) == days
        assert list(measure.y) == [r[spec.measure] for r in finding.by_day]
        for key, name in spec.volumes:
            volume = next(t for t in traces if t.name == name)
            assert list(volume.y) == [r[key] for r in finding.by_day]
        # The title is the finding's sentence (escaped), wrapped.
        sentence = esc(drift_symptom(finding))
        assert any(t.replace("<br>", " ").endswith(sentence) for t in titles), sentence
        # The then and now bands cover the first and last edge days; the since line and the then/now
        # values drawn across their bands.
        xref = axis.replace("axis", "")
        shapes = [s for s in fig.layout.shapes if s.xref == xref]
        bands = sorted((s.x0, s.x1) for s in shapes if s.type == "rect")
        half = timedelta(hours=12)
        assert bands == [
            (days[0] - half, days[DRIFT_EDGE_DAYS - 1] + half),
            (days[-DRIFT_EDGE_DAYS] - half, days[-1] + half),
        ]
        since_label = next(
            a.text for a in fig.layout.annotations if a.xref == xref and a.text.startswith("since")
        )
        release = f" · {esc(finding.since_release)}" if finding.since_release else ""
        assert since_label == f"since {finding.since:%Y-%m-%d}{release}"
        lines = [s for s in shapes if s.type == "line"]
        assert naive_utc(finding.since) - half in [s.x0 for s in lines if s.yref.endswith("domain")]
        edges = {s.y0 for s in lines if not s.yref.endswith("domain")}
        want = {finding.evidence[k] for k in (spec.then_key, spec.now_key) if k}
        assert edges == want


def test_each_finding_draws_its_series_with_its_edges_from_the_report() -> None:
    analysis = sample_analysis(hostile=True)
    assert analysis.drift is not None
    fig = build_figures(analysis)["drift"]
    _check_panels(fig, analysis.drift)
    # Critical findings first; the subtitle counts them all.
    assert "3 findings" in fig.layout.title.text
    first = next(a.text for a in fig.layout.annotations if a.yref == "paper")
    assert first.startswith("[critical] shared_operation: ")
    # Span strings are escaped in the titles; nothing raw.
    blob = fig.to_json()
    assert HOSTILE not in blob and HOSTILE_FLAG not in blob
    assert esc(HOSTILE) in str([a.text for a in fig.layout.annotations])


def test_no_report_and_no_finding_are_said_in_words() -> None:
    analysis = sample_analysis(hostile=False)
    none_read = drift_figure(analysis.with_drift(None))
    assert [a.text for a in none_read.layout.annotations] == [NO_DRIFT_REPORT_TEXT]
    report = sample_drift(hostile=False)
    quiet = DriftReport((), report.end, report.days, report.edge_days)
    fig = drift_figure(analysis.with_drift(quiet))
    assert len(fig.data) == 0
    assert [a.text for a in fig.layout.annotations] == [
        "no sign of drift in the 14 days before 2026-12-01 16:00 UTC"
    ]
    assert list(fig.layout.xaxis.range) == [naive_utc(report.start), naive_utc(report.end)]
    assert headline("drift", analysis.with_drift(quiet), None) == fig.layout.annotations[0].text
    assert headline("drift", empty_like(analysis), None) == NO_DRIFT_REPORT_TEXT


def test_the_landing_page_names_the_findings_and_drift_alerts_link_to_the_view() -> None:
    analysis = sample_analysis(hostile=False)
    line = headline("drift", analysis, None)
    assert line == (
        "3 findings, 2 critical: shared_operation summary-api · summarise_document (summaries.summarise) "
        "since 2026-11-26; no_latency_target summary-api · POST /summaries/now since 2026-11-26; "
        "queue_unbounded doc-index since 2026-11-27"
    )
    finding = analysis.drift.findings[1] if analysis.drift else None
    assert finding is not None and finding.kind == "queue_unbounded"
    summary = f"{drift_symptom(finding)}; say it is an online service now: set a p99 budget"
    # A queue's drift alert names its queue: the drift view holds its evidence, not the cold path.
    assert evidence_view({"queue": finding.queue, "summary": summary}) == "drift"


def test_export_draws_the_report_analyze_kept_without_reading_the_spans_again(tmp_path: Path) -> None:
    """`tailwatch analyze` reads the drift report once for the hour and keeps it; the export of the
    same hour draws that report (no second read of 14 days of spans), whose series are the ones
    the analytics checked against the generated spans (tests/analytics/test_drift.py)."""
    from tailwatch.cli import main

    scenario = scenario_drift()
    dsn = f"chdb://{tmp_path / 'store'}"
    with open_store(dsn) as store:
        ensure_schema(store)
        insert_spans(store, scenario.spans)
    end = scenario.end
    window = ["--store", dsn, "--start", (end - timedelta(hours=1)).isoformat(), "--end", end.isoformat()]
    analyzed = CliRunner().invoke(main, ["analyze", *window, "--format", "json", "--no-summaries"])
    assert analyzed.exit_code == 0, analyzed.output
    out = tmp_path / "out"
    exported = CliRunner().invoke(main, ["dashboard", "export", *window, "--out", str(out)])
    assert exported.exit_code == 0, exported.output
    assert (out / "drift.html").is_file()
    assert 'href="drift.html"' in (out / "index.html").read_text(encoding="utf-8")
    with open_store(dsn) as store:
        assert store.query_value(f"SELECT count() FROM {store.table(DRIFT_REPORTS_TABLE)}") == 1
        report = DriftReport.read(store, end)
        assert store.query_value(f"SELECT count() FROM {store.table(DRIFT_REPORTS_TABLE)}") == 1
        again = export_dashboards(store, tmp_path / "again", end - timedelta(hours=1), end)
        assert store.query_value(f"SELECT count() FROM {store.table(DRIFT_REPORTS_TABLE)}") == 1
    assert {(f.kind, f.service, f.operation, f.queue) for f in report.findings} == set(scenario.expected)
    assert any(p.name == "drift.html" for p in again.files)
    analysis = sample_analysis(hostile=False).with_drift(report)
    _check_panels(drift_figure(analysis), report)
    shared = next(f for f in report.findings if f.kind == "shared_operation")
    # The summariser's hot-path share by day: none before day 10, 60 of 60 + 96 calls after.
    assert [r["hot_share"] for r in shared.by_day] == pytest.approx(
        [0.0] * 10 + [60 / 156] * 4, abs=1e-6
    )  # kept to 6 digits
