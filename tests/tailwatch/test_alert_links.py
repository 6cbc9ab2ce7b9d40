"""The alert → dashboard path: every alert links to the analysis that raised it, served by the
service on request; ``/dashboards/`` shows the scheduled analysis only; no link where no dashboard
can exist; ``/`` leads to the dashboards."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from analytics import load_analysis, runs
from dashboards import VIEWS
from slo_rules.annotate import fmt_ms
from storage import parse_time
from tailwatch.config import TailwatchConfig, load_config
from tailwatch.remote import EXPORT_REPORT_HEADER
from tailwatch.service import Service
from tests.tailwatch.otlp_send import export_rows
from tests.tailwatch.test_serve_e2e import RULES, _regression_now
from tests.tailwatch.test_service import _wait

RUN_LINK = r"/dashboards/runs/([0-9a-f]{32})/attribution\.html"


def _config(tmp_path: Path, schedule: str = "", dashboards: str = "") -> TailwatchConfig:
    """Jobs an hour apart: each run in these tests is asked for through the API."""
    (tmp_path / "rules.yaml").write_text(RULES)
    path = tmp_path / "tailwatch.toml"
    path.write_text(
        f'store = "chdb://{tmp_path / "store"}"\n'
        '[receiver]\notlp_http = "127.0.0.1:0"\notlp_grpc = "off"\n'
        '[ingest]\nflush_interval = "200ms"\n'
        '[schedule]\nrollup = "off"\nanalyze = "1h"\nevaluate = "1h"\n'
        + (schedule or 'dashboards = "1h"\n')
        + '[analysis]\nwindow = "1h"\n'
        '[dashboards]\nout_dir = "dash"\n' + dashboards + '[rules]\nfiles = ["rules.yaml"]\n'
    )
    return load_config(path, env={})


@contextmanager
def _service_with_regression(config: TailwatchConfig) -> Iterator[tuple[Service, str]]:
    """The service, an LLM-caused regression of chat-api acknowledged and stored."""
    service = Service(config)
    service.start()
    try:
        api = service.api_url
        assert api is not None and service.store is not None
        rows = _regression_now()
        assert export_rows(api, rows) == len(rows)
        store = service.store
        _wait(
            lambda: store.query_value("SELECT count() FROM otel_traces") == len(rows),
            what="the spans in the store",
        )
        yield service, api
    finally:
        assert service.stop(timeout_s=30)


def _run(api: str, job: str) -> None:
    ran = httpx.post(f"{api}/api/v1/jobs/{job}/run", timeout=120).json()
    assert ran["status"] == "ok", ran


def _firing(api: str) -> dict[str, Any]:
    """The firing alert as the API lists it, its annotations as a dict."""
    alerts = httpx.get(f"{api}/api/v1/alerts", timeout=60).json()["alerts"]
    [alert] = [a for a in alerts if a["alertname"] == "chat-p99-regression" and a["state"] == "firing"]
    notes = alert["annotations"]
    if isinstance(notes, str):  # stored as a JSON object
        notes = json.loads(notes)
    return {**alert, "annotations": notes}


def test_the_alert_link_opens_its_own_analysis_before_any_dashboards_job(tmp_path: Path) -> None:
    config = _config(tmp_path)
    with _service_with_regression(config) as (service, api):
        # Only an evaluation: neither the analyze job nor the dashboards job has run.
        _run(api, "evaluate")
        alert = _firing(api)
        annotations = alert["annotations"]
        assert annotations["cause"] == "llm"
        link = annotations["dashboard"]
        matched = re.fullmatch(re.escape(api) + RUN_LINK, link)
        assert matched is not None, link
        assert not (config.dashboards.out_dir / "index.html").exists()

        page = httpx.get(link, timeout=120)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")

        # The run is the alert's own analysis: its window ends at the evaluation that fired it
        # and spans the rule's hour, and the page says so.
        assert service.store is not None
        [run] = [r for r in runs(service.store).to_dicts() if r["run_id"] == matched[1]]
        assert run["end"] - run["start"] == timedelta(hours=1)
        assert abs(run["end"] - parse_time(str(alert["starts_at"]))) < timedelta(milliseconds=1)
        analysis = load_analysis(service.store, run["start"], run["end"])
        assert analysis is not None and analysis.run_id == matched[1]
        text = _unescaped(page.text)
        assert f"analysis run {matched[1]}" in text
        # The page names the alert's window and shows the alert's numbers.
        for instant in (run["start"], run["end"]):
            assert instant.strftime("%Y-%m-%d %H:%M") in text
        [row] = analysis.attribution.filter(analysis.attribution["service"] == "chat-api").to_dicts()
        assert row["verdict"] == "llm" and annotations["cause"] == "llm"
        before, after = row["baseline_p99_ms"], row["current_p99_ms"]
        assert f"{fmt_ms(before)} → {fmt_ms(after)}" in annotations["summary"]
        assert float(annotations["delta_ms"]) == pytest.approx(after - before, abs=0.5)
        assert _mentions(text, before) and _mentions(text, after), "the page lacks the alert's p99s"
        assert "verdict <b>llm</b>" in text or "(llm)" in text

        # Rendered once, kept on disk, served again (also the run's index and other views).
        cached = config.dashboards.out_dir / "runs" / matched[1] / "attribution.html"
        assert cached.is_file()
        assert httpx.get(link, timeout=60).text == page.text
        base = link.rsplit("/", 1)[0]
        assert httpx.get(f"{base}/", timeout=60).status_code == 200
        for view in VIEWS:
            assert httpx.get(f"{base}/{view}.html", timeout=60).status_code == 200
        bare = httpx.get(base, timeout=60)
        assert bare.status_code == 307 and bare.headers["location"].endswith(f"{matched[1]}/")

        # Nothing else answers under /dashboards/runs/.
        assert httpx.get(f"{base}/nope.html", timeout=60).status_code == 404
        assert httpx.get(f"{api}/dashboards/runs/{'0' * 32}/attribution.html", timeout=60).status_code == 404
        assert (
            httpx.get(f"{api}/dashboards/runs/..%2F..%2Fetc/attribution.html", timeout=60).status_code == 404
        )


def _unescaped(html: str) -> str:
    """The page with the figure JSON's ``\\uXXXX`` escapes decoded (plotly writes the data inline)."""
    return re.sub(r"\\u([0-9a-fA-F]{4})", lambda m: chr(int(m[1], 16)), html)


def _mentions(text: str, ms: float) -> bool:
    """``text`` shows the duration ``ms`` as the alert does (``2.1 s``) or in whole milliseconds."""
    return any(form in text for form in (fmt_ms(ms), f"{ms:,.0f} ms", f"{ms:.0f} ms"))


def test_an_ad_hoc_export_never_replaces_the_scheduled_dashboards(tmp_path: Path) -> None:
    config = _config(tmp_path)
    index = config.dashboards.out_dir / "index.html"
    with _service_with_regression(config) as (service, api):
        _run(api, "analyze")
        scheduled = service.scheduled.run_id
        assert scheduled is not None
        # The first scheduled analysis publishes the dashboards at once, not an hour later.
        _wait(lambda: index.is_file(), what="the first scheduled dashboards")
        _run(api, "dashboards")
        served = httpx.get(f"{api}/dashboards/index.html", timeout=60)
        assert served.status_code == 200 and f"analysis run {scheduled}" in served.text
        published = index.read_bytes()

        # A post-mortem export of another window, through the API (as `dashboard export` does).
        assert service.scheduled.start is not None
        start = service.scheduled.start - timedelta(hours=2)
        response = httpx.post(
            f"{api}/api/v1/dashboards/export",
            json={"start": start.isoformat(), "end": (start + timedelta(minutes=30)).isoformat()},
            timeout=180,
        )
        assert response.status_code == 200
        ad_hoc = json.loads(response.headers[EXPORT_REPORT_HEADER])["analysis_run_id"]
        assert ad_hoc and ad_hoc != scheduled
        assert index.read_bytes() == published
        assert httpx.get(f"{api}/dashboards/index.html", timeout=60).content == published

        # The next scheduled export still shows the scheduled analysis, not the newer ad-hoc run;
        # an alert's own analysis (persisted by the evaluation) does not take its place either.
        _run(api, "evaluate")
        _run(api, "dashboards")
        page = httpx.get(f"{api}/dashboards/index.html", timeout=60).text
        assert f"analysis run {scheduled}" in page and ad_hoc not in page

        # An export without a window is what /dashboards/ shows.
        plain = httpx.post(f"{api}/api/v1/dashboards/export", json={}, timeout=180)
        assert json.loads(plain.headers[EXPORT_REPORT_HEADER])["analysis_run_id"] == scheduled


@pytest.mark.parametrize(
    ("schedule", "dashboards", "linked"),
    [
        ('dashboards = "off"\n', "", False),
        ('dashboards = "off"\n', 'public_url = "https://tailwatch.example/dashboards"\n', True),
    ],
    ids=["off", "off-with-public-url"],
)
def test_no_link_where_no_dashboard_can_exist(
    tmp_path: Path, schedule: str, dashboards: str, linked: bool
) -> None:
    config = _config(tmp_path, schedule=schedule, dashboards=dashboards)
    with _service_with_regression(config) as (_, api):
        _run(api, "evaluate")
        annotations = _firing(api)["annotations"]
        assert annotations["cause"] == "llm"
        if linked:
            assert re.fullmatch(
                re.escape("https://tailwatch.example") + RUN_LINK, annotations["dashboard"]
            ), annotations["dashboard"]
        else:
            assert "dashboard" not in annotations, annotations


def test_the_root_leads_to_the_dashboards(tmp_path: Path) -> None:
    service = Service(_config(tmp_path), jobs=[])
    service.start()
    try:
        root = httpx.get(f"{service.api_url}/", timeout=30)
        assert root.status_code == 307 and root.headers["location"] == "/dashboards/"
    finally:
        assert service.stop(timeout_s=10)


def test_the_api_explains_each_rule_without_changing_anything(tmp_path: Path) -> None:
    """`GET /api/v1/alerts/explain`: the service's rules evaluated as a dry run — the alert that
    would fire with its numbers, nothing written or sent; then the real evaluation fires it."""
    config = _config(tmp_path)
    with _service_with_regression(config) as (_, api):
        explained = httpx.get(f"{api}/api/v1/alerts/explain", timeout=120).json()
        assert explained["dry_run"] is True and explained["would_fire"] == ["chat-p99-regression"]
        (rule,) = [e for e in explained["explanations"] if e["rule"] == "chat-p99-regression"]
        assert rule["verdict"] == "fired" and rule["target"] == "chat-api POST /chat"
        assert rule["reason"].startswith("p99 ") and "vs the previous 1h" in rule["reason"]
        assert httpx.get(f"{api}/api/v1/alerts", timeout=60).json()["alerts"] == []
        _run(api, "evaluate")
        assert _firing(api)["annotations"]["cause"] == "llm"
        again = httpx.get(f"{api}/api/v1/alerts/explain", timeout=120).json()
        assert again["would_fire"] == [] and again["firing"] == ["chat-p99-regression"]
        bad = httpx.get(f"{api}/api/v1/alerts/explain", params={"at": "yesterday"}, timeout=60)
        assert bad.status_code == 400
