"""The dashboards `tailwatch serve` renders: one shared plotly.js, run pages pruned by age and
rendered again on request, and the landing page from the latest scheduled analysis with the
alerts as they are now."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import httpx
import pytest

from dashboards import PLOTLY_JS, plotly_js_source
from tailwatch.api import RunPages
from tests.dashboards.browser import CHROMIUM, CHROMIUM_ARGS
from tests.tailwatch.test_alert_links import RUN_LINK, _config, _firing, _run, _service_with_regression
from tests.tailwatch.test_service import _wait

pytestmark = pytest.mark.slow


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _render_in_chromium(url: str) -> dict[str, object]:
    """``url`` in headless Chromium, only loopback requests allowed: what the page loaded and drew."""
    from playwright.sync_api import sync_playwright

    loaded: list[str] = []
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1400, "height": 900})

            def route(route: object) -> None:
                request_url = route.request.url  # type: ignore[attr-defined]
                if request_url.startswith("http://127.0.0.1:"):
                    loaded.append(request_url)
                    route.continue_()  # type: ignore[attr-defined]
                else:
                    route.abort()  # type: ignore[attr-defined]

            context.route("**/*", route)
            page = context.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url, wait_until="load")
            page.wait_for_function(
                "() => document.querySelector('.js-plotly-plot svg.main-svg')", timeout=20_000
            )
            bars = page.evaluate("() => document.querySelectorAll('.js-plotly-plot g.trace path').length")
        finally:
            browser.close()
    return {"loaded": loaded, "errors": errors, "bars": bars}


def test_run_pages_share_one_plotly_js_are_pruned_by_age_and_come_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path, dashboards='runs_max_age = "1h"\n')
    runs_dir = config.dashboards.out_dir / "runs"
    with _service_with_regression(config) as (service, api):
        assert service.api is not None
        _run(api, "evaluate")
        link = _firing(api)["annotations"]["dashboard"]
        matched = re.fullmatch(re.escape(api) + RUN_LINK, link)
        assert matched is not None, link
        run_id = matched[1]

        # The page loads the service's one plotly.js instead of carrying 4.8 MB.
        page = httpx.get(link, timeout=120)
        assert page.status_code == 200
        assert re.findall(r'<script[^>]+src="([^"]+)"', page.text) == [f"../../{PLOTLY_JS}"]
        assert len(page.content) < 500_000, len(page.content)
        script = httpx.get(f"{api}/dashboards/{PLOTLY_JS}", timeout=60)
        assert script.status_code == 200 and script.content == plotly_js_source().read_bytes()
        assert script.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert script.headers["content-type"].startswith("text/javascript")
        assert httpx.get(f"{api}/dashboards/plotly-0.0.0.min.js", timeout=60).status_code == 404
        every_view = [
            httpx.get(f"{link.rsplit('/', 1)[0]}/{v}.html", timeout=60) for v in ("hot_path", "alerts")
        ]
        assert all(r.status_code == 200 for r in every_view)
        run_size = _size(runs_dir / run_id)
        assert run_size < 2_000_000, run_size  # eight pages; inlined, one alone was 4.8 MB
        print(f"run pages: {run_size:,} bytes for 8 pages; attribution.html {len(page.content):,} bytes")

        # A real browser draws the page from the served script (and asks nothing else of anyone).
        drawn = _render_in_chromium(link)
        assert drawn["errors"] == [] and int(str(drawn["bars"])) > 0, drawn
        assert f"{api}/dashboards/{PLOTLY_JS}" in drawn["loaded"], drawn["loaded"]

        # Younger than runs_max_age: kept. Older: pruned, and the link renders it again.
        pages = service.api.pages
        assert pages.prune() == []
        assert (runs_dir / run_id / "attribution.html").is_file()
        assert pages.prune(now=time.time() + 3601) == [run_id]
        assert not (runs_dir / run_id).exists()
        assert [p.name for p in runs_dir.iterdir()] == []  # no staging left behind
        again = httpx.get(link, timeout=120)
        assert again.status_code == 200 and f"analysis run {run_id}" in again.text
        assert (runs_dir / run_id / "attribution.html").is_file()

        # In service the jobs prune: after a run, pages rendered more than runs_max_age ago go.
        monkeypatch.setattr(RunPages, "PRUNE_EVERY_S", 0.0)
        two_hours_ago = time.time() - 7200
        os.utime(runs_dir / run_id, (two_hours_ago, two_hours_ago))
        _run(api, "analyze")
        _wait(lambda: not (runs_dir / run_id).exists(), timeout=10, what="the aged run pages pruned")


def test_the_landing_page_shows_the_latest_scheduled_analysis_and_the_alerts_now(tmp_path: Path) -> None:
    config = _config(tmp_path)
    with _service_with_regression(config) as (service, api):
        # An alert before any scheduled analysis: listed at once, linking to its own analysis.
        _run(api, "evaluate")
        link = _firing(api)["annotations"]["dashboard"]
        alert_run = re.fullmatch(re.escape(api) + RUN_LINK, link)
        assert alert_run is not None
        landing = httpx.get(f"{api}/", timeout=60, follow_redirects=True)
        assert landing.status_code == 200 and landing.url.path == "/dashboards/"
        assert landing.headers["cache-control"] == "no-store"
        assert "Firing now (1)" in landing.text and "chat-p99-regression" in landing.text
        assert f'href="runs/{alert_run[1]}/attribution.html"' in landing.text
        assert "The newest persisted analysis is shown until this service&#x27;s first scheduled one" in (
            landing.text
        )
        # Nothing scheduled yet: the latest view leads back to the landing page.
        latest = httpx.get(f"{api}/dashboards/latest/hot_path.html", timeout=60)
        assert latest.status_code == 307 and latest.headers["location"] == "../"

        _run(api, "analyze")
        scheduled = service.scheduled.run_id
        assert scheduled is not None
        landing = httpx.get(f"{api}/dashboards/", timeout=60)
        assert landing.status_code == 200 and f"analysis run {scheduled}" in landing.text
        assert f'href="runs/{scheduled}/hot_path.html"' in landing.text
        assert "newest persisted analysis" not in landing.text
        latest = httpx.get(f"{api}/dashboards/latest/attribution.html", timeout=60)
        assert latest.status_code == 307
        assert latest.headers["location"] == f"../runs/{scheduled}/attribution.html"
        view = httpx.get(f"{api}/dashboards/latest/attribution.html", timeout=120, follow_redirects=True)
        assert view.status_code == 200 and f"analysis run {scheduled}" in view.text
        assert httpx.get(f"{api}/dashboards/latest/nope.html", timeout=60).status_code == 404
