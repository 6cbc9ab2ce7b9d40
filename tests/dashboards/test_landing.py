"""The on-call landing page (index.html): what is firing, where, since when, why, and the evidence."""

from __future__ import annotations

import html
import json
import re
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import polars as pl
import pytest

from dashboards import write_dashboards
from dashboards.landing import alert_entries, current_entries, evidence_view, headline, live_index_body
from tests.dashboards.frames import (
    HOSTILE,
    HOSTILE_FLAG,
    HOSTILE_TEMPLATE,
    START,
    oncall_alerts,
    sample_alerts,
    sample_analysis,
)


def _index(tmp_path: Path, hostile: bool = True, **kwargs: object) -> str:
    write_dashboards(sample_analysis(hostile=hostile), tmp_path, **kwargs)  # type: ignore[arg-type]
    return (tmp_path / "index.html").read_text(encoding="utf-8")


def _rows(page: str, cls: str) -> list[str]:
    return re.findall(rf'<tr class="{cls}">(.*?)</tr>', page, flags=re.S)


def test_firing_alerts_come_first_with_where_since_cause_and_evidence(tmp_path: Path) -> None:
    page = _index(tmp_path, hostile=False, alerts=oncall_alerts(hostile=False))
    body = page[page.index("<body>") :]
    # Firing first, then resolved, then the views.
    assert body.index("Firing now (4)") < body.index("Resolved in this window (3)") < body.index("<h2>Views")
    firing = _rows(page, "alert-firing")
    assert len(firing) == 4
    # The page before the tickets; among tickets the most recent first.
    assert "hot-path-p99-regression" in firing[0] and "page" in firing[0]
    expected = {
        "hot-path-p99-regression": (
            "chat-api · POST /chat",
            "2026-12-01 14:10 UTC (for 1h 50m)",  # the first firing row, not the re-notification
            "<b>llm</b> — chat-api: p99 1,300 ms → 2,100 ms (+800 ms); 90% LLM",
            'href="attribution.html"',
        ),
        "hot-path-abandonment": (
            "chat-api · POST /chat",
            "2026-12-01 14:30 UTC",
            "12.0% of requests abandoned (limit 10.0%)",
            'href="abandonment.html"',
        ),
        "hot-path-release-coupling": (
            "chat-api · POST /chat",
            "2026-12-01 14:00 UTC",
            "release 1.5.0 added 1.0 synchronous LLM calls per request",
            'href="hot_path.html"',
        ),
        "cold-path-starvation": (
            "queue doc-summaries",
            "2026-12-01 13:00 UTC (for 3h)",
            "p50 3.0 s, p99 180.0 s",
            'href="cold_path.html"',
        ),
    }
    for row in firing:
        name = re.search(r"<b>(.*?)</b>", row)
        assert name is not None
        for part in expected[name.group(1)]:
            assert part in row, (name.group(1), part, row)
    resolved = _rows(page, "alert-resolved")
    assert len(resolved) == 3  # the most recently resolved first
    assert "flag-slice-regression" in resolved[0] and 'href="boundary.html"' in resolved[0]
    assert "2026-12-01 12:10 UTC → 2026-12-01 15:20 UTC" in resolved[0]
    assert "variant async of flag f is worse than control sync" in resolved[0]
    assert "workflow-retry-amplification" in resolved[1] and 'href="retries.html"' in resolved[1]
    assert "workflow claims-triage" in resolved[1]
    # Fired before the window, resolved in it.
    assert "before the window → 2026-12-01 12:20 UTC" in resolved[2]
    assert "chat-api · GET /search" in resolved[2]


def test_views_name_what_and_where_not_bare_verdicts(tmp_path: Path) -> None:
    page = _index(tmp_path, hostile=False, alerts=sample_alerts(hostile=False))
    assert not re.search(r"regressions \((llm|internal|mixed|none)(, (llm|internal|mixed|none))*\)", page)
    # Each figure says what it is: the p99 change (Δp99) beside the p99s it is the change of.
    assert (
        "2 p99 regressions: chat-api · POST /chat Δp99 +800 ms (p99 1,300 ms → 2,100 ms, llm); "
        "chat-api · GET /search Δp99 +170 ms (p99 300 ms → 470 ms, internal)" in page
    )
    # The releases the release_coupling rule fires on, then (named apart) the trend.
    assert (
        "2 operations; 1 release in the window stepped p99 up or added sync LLM calls: "
        "1.5.0 on chat-api · POST /chat: p99 1,310 ms → 2,110 ms, sync LLM calls 1.0 → 2.0 per request; "
        "1 operation whose p99 rises with releases: chat-api · POST /chat (+800 ms/release)" in page
    )
    assert "coupled" not in page
    assert "2 queues, 1 starved: doc-summaries (p50 3.0 s, p99 180.0 s)" in page
    assert "1 operation, 1 with a cliff: chat-api · POST /chat at 2,000 ms" in page
    assert "1 workflow: claims-triage ×1.16 attempts observed" in page
    assert "1 over budget: chat-api · POST /chat p99 2,100 ms vs budget 2,000 ms" in page
    assert "2 alerts: 1 firing, 1 resolved" in page


def test_nothing_firing_is_said_plainly(tmp_path: Path) -> None:
    page = _index(tmp_path, hostile=False)
    assert "Firing now: nothing" in page
    assert "No alert is firing at the end of the window (2026-12-01 16:00 UTC)" in page
    assert "Resolved in this window" not in page and "no alerts in this window" in page


def test_landing_page_escapes_every_alert_string(tmp_path: Path) -> None:
    alerts = oncall_alerts(hostile=True)
    page = _index(tmp_path, hostile=True, alerts=alerts)
    for raw in (HOSTILE, HOSTILE_FLAG, "<b>bold</b>"):
        assert raw not in page, raw
    assert html.escape(HOSTILE) in page  # the queue, the operation: shown as text
    assert f"queue {html.escape(HOSTILE)}" in page
    assert f"workflow {html.escape(HOSTILE_FLAG)}" in page
    assert f"<b>{html.escape(HOSTILE_TEMPLATE)}</b>" in page  # a cause with markup and %{x}


@pytest.mark.parametrize(
    ("row", "view"),
    [
        ({"queue": "q"}, "cold_path"),
        ({"path": "cold"}, "cold_path"),
        ({"workflow": "w"}, "retries"),
        ({"service": "s", "operation": "o", "summary": "s: p99 1 s → 2 s (+1 s); 90% LLM"}, "attribution"),
        ({"service": "s", "operation": "o", "summary": "s o: stepped p99 up 1 s → 2 s"}, "hot_path"),
        ({"service": "s", "summary": "s o: p99 rises with releases (Spearman ρ 0.9)"}, "hot_path"),
        ({"service": "s", "summary": "s o: p99 2 s is past the abandonment cliff at 1 s"}, "abandonment"),
        ({"summary": "s o: variant b of flag f is worse than control a on p99"}, "boundary"),
        ({"summary": "error budget burning 14.4× over 1h"}, "attribution"),
        # The alert's own link wins when the history carries it.
        ({"queue": "q", "annotations": '{"dashboard": "http://h/dashboards/retries.html"}'}, "retries"),
        ({"dashboard": "/dashboards/run/abc/boundary.html#x"}, "boundary"),
        ({"annotations": "not json", "workflow": "w"}, "retries"),
    ],
)
def test_each_alert_kind_links_to_its_evidence(row: dict[str, str], view: str) -> None:
    assert evidence_view(row) == view


def test_alert_entries_state_at_the_window_end() -> None:
    entries = {e.fingerprint: e for e in alert_entries(oncall_alerts(hostile=False))}
    assert {k for k, e in entries.items() if e.firing} == {"p99", "cold", "rel", "ab"}
    assert entries["slice"].firing is False and entries["slice"].since is not None
    assert entries["old"].since is None and entries["old"].resolved_at is not None
    assert alert_entries(None) == [] and alert_entries(oncall_alerts().clear()) == []


def test_headline_plurals() -> None:
    analysis = sample_analysis(hostile=False)
    single = replace(analysis, cold_path=analysis.cold_path.head(1))
    assert headline("cold_path", single, None).startswith("1 queue, 1 starved")
    assert headline("retries", analysis, None).startswith("1 workflow:")
    assert "1 queues" not in headline("cold_path", single, None)


def test_a_release_the_rule_fires_on_is_counted_without_a_coupled_trend() -> None:
    """Issue 39: "0 with p99 coupled to releases" beside a firing hot-path-release-coupling. A
    release that only added a sync LLM call (its step not significant) and no rising trend is still
    what the rule fires on, and the line says so; one that changed neither is not counted."""
    analysis = sample_analysis(hostile=False)
    releases = analysis.releases.with_columns(
        pl.lit(False).alias("significant"),
        pl.when(pl.col("version") == "1.5.0")
        .then(pl.lit(0.0))
        .otherwise(pl.col("sync_llm_calls_per_request_before"))
        .alias("sync_llm_calls_per_request_before"),
    )
    variant = replace(
        analysis,
        releases=releases,
        release_coupling=analysis.release_coupling.with_columns(pl.lit(False).alias("coupled")),
    )
    line = headline("hot_path", variant, None)
    assert line == (
        "2 operations; 1 release in the window stepped p99 up or added sync LLM calls: "
        "1.5.0 on chat-api · POST /chat: sync LLM calls 0.0 → 2.0 per request; "
        "0 operations whose p99 rises with releases"
    )
    # A release before the window is not this window's finding.
    early = replace(
        variant, releases=releases.with_columns(pl.lit(START - timedelta(hours=1)).alias("released_at"))
    )
    assert headline("hot_path", early, None).startswith("2 operations; 0 releases in the window")


def test_no_baseline_data_is_not_no_regression() -> None:
    analysis = sample_analysis(hostile=False)
    empty_baseline = analysis.attribution.with_columns(
        pl.lit(0, dtype=pl.Int64).alias("baseline_requests"),
        pl.lit(None, dtype=pl.Float64).alias("baseline_p99_ms"),
        pl.lit(None, dtype=pl.Float64).alias("delta_ms"),
        pl.lit("none").alias("verdict"),
    )
    line = headline("attribution", replace(analysis, attribution=empty_baseline), None)
    assert line == "no baseline data: the baseline window held no request of any operation"
    assert "no p99 regression" not in line
    # One operation without a baseline beside one without a regression: both said.
    mixed = empty_baseline.with_columns(
        pl.when(pl.col("operation") == "GET /search")
        .then(pl.lit(400, dtype=pl.Int64))
        .otherwise(pl.col("baseline_requests"))
        .alias("baseline_requests")
    )
    assert headline("attribution", replace(analysis, attribution=mixed), None) == (
        "no p99 regression against the baseline; no baseline data for 1 operation: chat-api · POST /chat"
    )


def _states(**columns: list[object]) -> pl.DataFrame:
    n = len(next(iter(columns.values())))
    base: dict[str, list[object]] = {
        k: [""] * n
        for k in (
            "fingerprint",
            "alertname",
            "severity",
            "state",
            "service",
            "operation",
            "queue",
            "workflow",
        )
    }
    base.update({k: [""] * n for k in ("path", "cause", "summary", "labels", "annotations")})
    base.update({"starts_at": [START] * n, "ends_at": [None] * n})
    base.update(columns)
    return pl.DataFrame(base, schema_overrides={"ends_at": pl.Datetime("us", "UTC")})


def test_the_live_page_lists_the_alerts_as_they_are_now_with_their_own_run_pages() -> None:
    run = "ab" * 16
    states = _states(
        fingerprint=["a", "b", "c"],
        alertname=["hot-path-p99-regression", "cold-path-starvation", "still-pending"],
        severity=["page", "ticket", "page"],
        state=["firing", "resolved", "pending"],
        service=["chat-api", "", "chat-api"],
        operation=["POST /chat", "", "POST /chat"],
        queue=["", "doc-summaries", ""],
        cause=["llm", "", ""],
        summary=["chat-api POST /chat: p99 1.3 s → 2.1 s", "p50 3 s, p99 180 s", ""],
        annotations=[
            json.dumps({"dashboard": f"https://tw.example/dashboards/runs/{run}/attribution.html"}),
            "",
            "",
        ],
        starts_at=[START, START - timedelta(hours=2), START],
        ends_at=[None, START - timedelta(hours=1), None],
    )
    entries = current_entries(states)
    assert [(e.alertname, e.firing) for e in entries] == [
        ("hot-path-p99-regression", True),
        ("cold-path-starvation", False),
    ]
    assert entries[0].link == f"runs/{run}/attribution.html"
    now = START + timedelta(minutes=30)
    analysis = sample_analysis(hostile=False)
    page = live_index_body(analysis, states, now=now, head="<h1>x</h1>", views_base="runs/" + "cd" * 16 + "/")
    assert "Firing now (1) at 2026-12-01 12:30 UTC" in page
    assert "2026-12-01 12:00 UTC (for 30m)" in page
    assert f'href="runs/{run}/attribution.html"' in page  # the alert's own analysis
    assert 'href="runs/' + "cd" * 16 + '/cold_path.html"' in page  # no link of its own: the latest run
    assert 'href="runs/' + "cd" * 16 + '/hot_path.html"' in page
    assert "still-pending" not in page
    waiting = live_index_body(None, states.clear(), now=now, head="", views_base="", waiting="no spans yet")
    assert "Firing now: nothing" in waiting and "No alert is firing now (2026-12-01 12:30 UTC)" in waiting
    assert "Waiting for the first analysis" in waiting and "no spans yet" in waiting
    hostile = live_index_body(None, states, now=now, head="", views_base="", waiting=HOSTILE)
    assert HOSTILE not in hostile and html.escape(HOSTILE) in hostile
