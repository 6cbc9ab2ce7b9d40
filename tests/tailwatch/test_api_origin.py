"""Browser-borne requests: a page on another site cannot make the API run jobs or read dashboards."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from storage import Store
from tailwatch.api import API_CONCURRENCY, ServiceApi, api_routes
from tailwatch.config import TailwatchConfig


def _client(
    store: Store, tmp_path: Path, token: str | None = None, public_url: str | None = None
) -> TestClient:
    dashboards: dict[str, object] = {"out_dir": str(tmp_path / "dash")}
    if public_url:
        dashboards["public_url"] = public_url
    config = TailwatchConfig.model_validate(
        {"store": "chdb://" + str(tmp_path / "store"), "dashboards": dashboards}
    )
    ran: list[str] = []

    def run_job(name: str) -> object:
        ran.append(name)
        raise KeyError(name)

    app = Starlette(routes=api_routes(ServiceApi(store, config, token=token, run_job=run_job)))
    client = TestClient(app, base_url="http://127.0.0.1:4318")
    client.ran = ran  # type: ignore[attr-defined]
    return client


def test_cross_site_form_post_does_not_run_a_job(store: Store, tmp_path: Path) -> None:
    # Regression: with no token, a form on any web page could POST /api/v1/jobs/…/run.
    client = _client(store, tmp_path)
    evil = client.post(
        "/api/v1/jobs/analyze/run",
        headers={"Origin": "https://evil.example", "Content-Type": "application/x-www-form-urlencoded"},
        content=b"x=1",
    )
    assert evil.status_code == 403 and "cross-origin" in evil.json()["error"]
    assert client.ran == []  # type: ignore[attr-defined]
    # The CLI and scripts send no Origin: the job route is reached (404: no such job here).
    assert client.post("/api/v1/jobs/analyze/run").status_code == 404
    assert client.ran == ["analyze"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("path", ["/api/v1/jobs", "/dashboards/index.html"])
def test_a_rebound_dns_name_is_refused_without_a_token(store: Store, tmp_path: Path, path: str) -> None:
    client = _client(store, tmp_path, public_url="https://tailwatch.internal.example/dashboards")
    assert client.get(path, headers={"Host": "attacker.example:4318"}).status_code == 403
    # IP literals, localhost and the configured public host are served.
    for host in ("127.0.0.1:4318", "[::1]:4318", "localhost:4318", "tailwatch.internal.example"):
        assert client.get(path, headers={"Host": host}).status_code in (200, 404), host


def test_with_a_token_other_names_are_served(store: Store, tmp_path: Path) -> None:
    client = _client(store, tmp_path, token="t0ken")
    response = client.get(
        "/api/v1/jobs", headers={"Host": "tailwatch.example:4318", "Authorization": "Bearer t0ken"}
    )
    assert response.status_code == 200


def test_api_work_is_bounded_and_the_rest_is_told_to_retry(store: Store, tmp_path: Path) -> None:
    # Regression: 45 concurrent dashboard exports occupied the thread pool ingest decodes in, and an
    # export waited 50 s. API work now runs at most API_CONCURRENCY at a time; the rest get a 503.
    running, peak, lock = [0], [0], threading.Lock()
    release = threading.Event()

    def slow_job(name: str) -> object:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        release.wait(10)
        with lock:
            running[0] -= 1
        raise KeyError(name)

    config = TailwatchConfig.model_validate(
        {"store": "chdb://" + str(tmp_path / "store"), "dashboards": {"out_dir": str(tmp_path / "dash")}}
    )
    app = Starlette(routes=api_routes(ServiceApi(store, config, run_job=slow_job)))
    with TestClient(app, base_url="http://127.0.0.1:4318") as client, ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(client.post, "/api/v1/jobs/export/run") for _ in range(12)]
        deadline = time.monotonic() + 10
        while sum(f.done() for f in futures) < 12 - API_CONCURRENCY and time.monotonic() < deadline:
            time.sleep(0.02)
        release.set()
        answers = [f.result(timeout=20) for f in futures]
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [404] * API_CONCURRENCY + [503] * (12 - API_CONCURRENCY)
    assert peak[0] == API_CONCURRENCY
    busy = next(a for a in answers if a.status_code == 503)
    assert busy.headers["retry-after"] == "2" and "retry shortly" in busy.json()["error"]
