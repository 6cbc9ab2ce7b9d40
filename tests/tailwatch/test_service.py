"""The service: in process with injected jobs, and as a `tailwatch serve` subprocess end to end."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from collectors.spans import SpanRow, new_span_id, new_trace_id
from storage import open_store
from tailwatch.config import Schedule, TailwatchConfig, load_config
from tailwatch.remote import SERVICE_FILE, find_service
from tailwatch.service import Job, JobContext, Service
from tests.tailwatch.otlp_send import export_rows

S = 1_000_000_000


def _wait(predicate: Callable[[], object], timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout}s")


def _simple_spans(n: int, service: str = "svc") -> list[SpanRow]:
    now = time.time_ns()
    return [
        SpanRow(
            trace_id=new_trace_id(),
            span_id=new_span_id(),
            name="GET /x",
            start_ns=now - 5 * S + i * 1000,
            duration_ns=1_000_000 + i,
            kind="Server",
            service=service,
        )
        for i in range(n)
    ]


def _config(tmp_path: Path, extra: str = "") -> TailwatchConfig:
    path = tmp_path / "tailwatch.toml"
    path.write_text(
        f'store = "chdb://{tmp_path / "store"}"\n'
        '[receiver]\notlp_http = "127.0.0.1:0"\notlp_grpc = "off"\n'
        '[ingest]\nflush_interval = "200ms"\n'
        '[dashboards]\nout_dir = "dash"\n' + extra
    )
    return load_config(path, env={})


def test_failing_job_never_stops_ingestion_or_later_runs(tmp_path: Path) -> None:
    calls = {"boom": 0, "count": 0}
    seen: list[int] = []

    def boom(ctx: JobContext) -> object:
        calls["boom"] += 1
        raise ValueError("analysis blew up")

    def count(ctx: JobContext) -> object:
        calls["count"] += 1
        seen.append(int(ctx.store.query_value("SELECT count() FROM otel_traces")))
        return seen[-1]

    every = Schedule("interval", seconds=0.3)
    service = Service(_config(tmp_path), jobs=[Job("boom", every, boom), Job("count", every, count)])
    service.start()
    try:
        assert service.api_url is not None
        _wait(lambda: calls["boom"] >= 2, what="two failed runs")
        assert export_rows(service.api_url, _simple_spans(300)) == 300
        _wait(lambda: calls["boom"] >= 5 and seen and seen[-1] == 300, what="later runs see the spans")
        assert export_rows(service.api_url, _simple_spans(200)) == 200
        _wait(lambda: seen[-1] == 500, what="ingest after more failures")

        # The discovery file points read commands at this API.
        endpoint = find_service("chdb://" + str(tmp_path / "store"))
        assert endpoint is not None and endpoint.api_url == service.api_url and endpoint.pid == os.getpid()

        runs = httpx.get(f"{service.api_url}/api/v1/jobs?limit=1000").json()["runs"]
        by_status = {(r["job"], r["status"]) for r in runs}
        assert ("boom", "error") in by_status and ("count", "ok") in by_status
        failed = [r for r in runs if r["job"] == "boom" and r["status"] == "error"]
        assert failed and all(r["error"] == "ValueError: analysis blew up" for r in failed)
        metrics = httpx.get(f"{service.api_url}/metrics").text
        assert 'tailwatch_job_runs_total{job="boom",status="error"}' in metrics
        assert 'tailwatch_job_duration_seconds_count{job="count"}' in metrics
        # The receivers' own series are on the same registry.
        assert "tailwatch_job_rows_read_total" in metrics

        ran = httpx.post(f"{service.api_url}/api/v1/jobs/count/run").json()
        assert ran["status"] == "ok" and ran["rows_read"] == 1
        assert httpx.post(f"{service.api_url}/api/v1/jobs/nope/run").status_code == 404
    finally:
        assert service.stop(timeout_s=20)
    assert not (tmp_path / "store" / SERVICE_FILE).exists()
    with open_store("chdb://" + str(tmp_path / "store")) as store:
        assert store.query_value("SELECT count() FROM otel_traces") == 500


def test_api_and_dashboards_require_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAILWATCH_INGEST_TOKEN", "s3cret")
    config = _config(tmp_path)
    (config.dashboards.out_dir).mkdir(parents=True)
    (config.dashboards.out_dir / "index.html").write_text("<html>views</html>")
    service = Service(config, jobs=[])
    service.start()
    try:
        api = service.api_url
        assert api is not None
        assert httpx.get(f"{api}/api/v1/jobs").status_code == 401
        assert httpx.get(f"{api}/api/v1/jobs", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{api}/api/v1/jobs", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        page = httpx.get(f"{api}/dashboards/")
        assert page.status_code == 401 and page.headers["www-authenticate"].startswith("Basic")
        basic = "Basic " + base64.b64encode(b"oncall:s3cret").decode()
        # The landing page is rendered on request; the export's copy stays at index.html.
        page = httpx.get(f"{api}/dashboards/", headers={"Authorization": basic})
        assert page.status_code == 200 and "tailwatch: what is firing" in page.text
        page = httpx.get(f"{api}/dashboards/index.html", headers={"Authorization": basic})
        assert page.status_code == 200 and page.text == "<html>views</html>"
        # The routes added for the served pages follow the same rules.
        from dashboards import PLOTLY_JS

        for path in (f"/dashboards/{PLOTLY_JS}", "/dashboards/latest/hot_path.html"):
            refused = httpx.get(f"{api}{path}")
            assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Basic"), (
                path
            )
            allowed = httpx.get(f"{api}{path}", headers={"Authorization": basic})
            assert allowed.status_code in (200, 307), path
        # Ingest honours the same token.
        assert export_rows(api, _simple_spans(3)) == 0
        assert export_rows(api, _simple_spans(3), token="s3cret") == 3
    finally:
        service.stop(timeout_s=10)


def _serve(tmp_path: Path, config: Path, *extra: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAILWATCH_")}
    return subprocess.Popen(
        [sys.executable, "-m", "tailwatch", "serve", "--config", str(config), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )


@contextmanager
def _serving(tmp_path: Path, config: Path, *extra: str) -> Iterator[subprocess.Popen[str]]:
    """``tailwatch serve`` for the body of a ``with``; killed if the body leaves it running."""
    proc = _serve(tmp_path, config, *extra)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _stop(proc: subprocess.Popen[str], sig: signal.Signals) -> str:
    """Send ``sig`` and wait for the exit; the process's stderr."""
    proc.send_signal(sig)
    return proc.communicate(timeout=60)[1]


def test_invalid_configuration_fails_at_start_naming_the_key(tmp_path: Path) -> None:
    path = tmp_path / "tw.toml"
    path.write_text('[schedule]\nevaluate = "every minute"\n')
    proc = _serve(tmp_path, path)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("tailwatch: error: invalid configuration: schedule.evaluate:")
    assert f"(file {path})" in lines[0]

    path.write_text('[receiver]\notlp_http = "127.0.0.1:0"\n[ingest]\nbatch_rows = 0\n')
    proc = _serve(tmp_path, path, "--otlp-grpc", "nowhere")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "receiver.otlp_grpc: expected HOST:PORT" in err and "(--otlp-grpc)" in err
    assert "ingest.batch_rows: Input should be greater than 0" in err


def test_broken_rule_file_fails_at_start_with_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("rules:\n  - name: x\n    kind: nope\n")
    path = tmp_path / "tw.toml"
    path.write_text(
        '[rules]\nfiles = ["bad.yaml"]\n[receiver]\notlp_http = "127.0.0.1:0"\notlp_grpc = "off"\n'
    )
    proc = _serve(tmp_path, path, "--store", f"chdb://{tmp_path / 'store'}")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"tailwatch: error: {tmp_path / 'bad.yaml'}:3: rules[0].kind"
    )
    # Nothing was left behind: the store was never announced.
    assert not (tmp_path / "store" / SERVICE_FILE).exists()


def test_schedule_disabled_runs_receivers_only(tmp_path: Path) -> None:
    service = Service(_config(tmp_path, "[schedule]\nenabled = false\n"))
    service.start()
    try:
        assert service.runner is None and service.api_url is not None
        assert export_rows(service.api_url, _simple_spans(10)) == 10
        answer = httpx.post(f"{service.api_url}/api/v1/jobs/analyze/run")
        assert answer.status_code == 409 and "scheduling is disabled" in answer.json()["error"]
    finally:
        assert service.stop(timeout_s=10)
    with open_store("chdb://" + str(tmp_path / "store")) as store:
        assert store.query_value("SELECT count() FROM otel_traces") == 10
        assert store.query_value("SELECT count() FROM tailwatch_job_runs") == 0


def test_sigint_stops_cleanly_with_plain_logs(tmp_path: Path) -> None:
    path = tmp_path / "tw.toml"
    path.write_text(
        f'store = "chdb://{tmp_path / "store"}"\n'
        '[receiver]\notlp_http = "127.0.0.1:0"\notlp_grpc = "127.0.0.1:0"\n'
        '[schedule]\nrollup = "off"\nanalyze = "off"\nevaluate = "off"\ndashboards = "off"\n'
    )
    with _serving(tmp_path, path) as proc:
        _wait(
            lambda: (tmp_path / "store" / SERVICE_FILE).exists() or proc.poll() is not None, what="listening"
        )
        api = json.loads((tmp_path / "store" / SERVICE_FILE).read_text())["api_url"]
        assert httpx.get(f"{api}/healthz").status_code == 200
        assert export_rows(api, _simple_spans(50)) == 50
        err = _stop(proc, signal.SIGINT)
    assert proc.returncode == 0, err
    assert "INFO    tailwatch.serve: SIGINT received: stopping" in err
    with open_store("chdb://" + str(tmp_path / "store")) as store:
        assert store.query_value("SELECT count() FROM otel_traces") == 50


def test_unset_webhook_secret_fails_the_start(tmp_path: Path) -> None:
    path = tmp_path / "tw.toml"
    path.write_text(
        '[receiver]\notlp_http = "127.0.0.1:0"\notlp_grpc = "off"\n'
        '[[notify.webhook]]\nurl = "http://127.0.0.1:9/hook"\nsecret_env = "TAILWATCH_WEBHOOK_SECRET"\n'
    )
    proc = _serve(tmp_path, path, "--store", f"chdb://{tmp_path / 'store'}")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip().splitlines() == [
        "tailwatch: error: invalid configuration: notify.webhook[0].secret_env: environment variable "
        f"TAILWATCH_WEBHOOK_SECRET is not set (file {path}); set it or remove the key"
    ]


def test_serve_spools_by_default(tmp_path: Path) -> None:
    # Regression: serve ran without a spool unless one was configured, so an export acknowledged
    # while the store could not insert was held in memory only.
    default = _config(tmp_path)
    assert default.spool_dir() == Path(str(tmp_path / "store") + ".spool")
    assert load_config(tmp_path / "tailwatch.toml", env={"TAILWATCH_SPOOL": "false"}).spool_dir() is None
    service = Service(_config(tmp_path, "[schedule]\nenabled = false\n"))
    service.start()
    try:
        assert service.pipeline is not None and service.pipeline.settings.spool_dir == default.spool_dir()
        assert service.api_url is not None and export_rows(service.api_url, _simple_spans(5)) == 5
    finally:
        assert service.stop(timeout_s=10)
    assert (tmp_path / "store.spool" / "LOCK").exists()


def test_serve_reads_the_byte_budgets(tmp_path: Path) -> None:
    _config(tmp_path)  # writes tailwatch.toml
    config = load_config(
        tmp_path / "tailwatch.toml",
        env={"TAILWATCH_MAX_QUEUE_BYTES": "33554432", "TAILWATCH_MAX_INFLIGHT_BYTES": "16777216"},
    )
    service = Service(config, jobs=[])
    service.start()
    try:
        assert service.pipeline is not None
        assert service.pipeline.settings.max_queue_bytes == 32 * 1024 * 1024
        assert service.pipeline.settings.max_inflight_bytes == 16 * 1024 * 1024
    finally:
        assert service.stop(timeout_s=10)


def test_readyz_fails_when_the_scheduler_dies(tmp_path: Path) -> None:
    # Regression: a dead job thread left /readyz at 200 while nothing was analysed or evaluated.
    every = Schedule("interval", seconds=60.0)
    service = Service(_config(tmp_path), jobs=[Job("count", every, lambda ctx: 0)])
    service.start()
    try:
        assert service.api_url is not None and service.runner is not None
        assert httpx.get(f"{service.api_url}/readyz").status_code == 200
        service.runner.scheduler.shutdown(wait=False)  # the scheduler thread ends, as if it had died
        _wait(lambda: not service.runner.alive, what="the scheduler to stop")  # type: ignore[union-attr]
        answer = httpx.get(f"{service.api_url}/readyz")
        assert answer.status_code == 503 and answer.text == "not ready\n"
        assert httpx.get(f"{service.api_url}/healthz").status_code == 200
    finally:
        service.stop(timeout_s=10)
