"""The on-call landing page (index.html): what is firing, where, since when, why, and the evidence."""

from __future__ import annotations

import html
import re
from dataclasses import replace
from pathlib import Path

import pytest

from dashboards import write_dashboards
from dashboards.landing import alert_entries, evidence_view, headline
from tests.dashboards.frames import (
    HOSTILE,
    HOSTILE_FLAG,
    HOSTILE_TEMPLATE,
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
    assert (
        "2 p99 regressions: chat-api · POST /chat 1,300 ms → 2,100 ms (llm); "
        "chat-api · GET /search 300 ms → 470 ms (internal)" in page
    )
    assert "1 with p99 coupled to releases: chat-api · POST /chat (+800 ms/release)" in page
    assert "p99 steps: 1.5.0 on chat-api · POST /chat 1,310 ms → 2,110 ms" in page
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
