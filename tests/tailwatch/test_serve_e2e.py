"""`tailwatch serve` as a subprocess: an LLM-caused regression in, the alert out, clean shutdown."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from collectors.spans import SpanRow
from storage import open_store
from tailwatch.remote import SERVICE_FILE
from tests.tailwatch.otlp_send import export_rows, webhook_sink
from tests.tailwatch.test_service import S, _serving, _simple_spans, _stop, _wait

RULES = """\
rules:
  - name: chat-p99-regression
    kind: p99_regression
    service: chat-api
    operation: "POST /chat"
    window: 1h
    baseline: previous
    min_increase: {relative: 0.2, absolute_ms: 100}
    min_requests: 200
    severity: page
"""
EVALUATE_S = 3.0


def _regression_now() -> list[SpanRow]:
    """The analytics ground truth of an LLM-caused regression, moved so its current hour ends now."""
    import dataclasses

    from tests.analytics.builders import T0, scenario_llm_regression

    # The current hour's first request lands 60 s inside the rule's window [t - 1h, t) for any
    # evaluation time t in the next minute, and its baseline hour inside the hour before.
    shift = time.time_ns() - 3540 * S - (T0 + 3600 * S)
    return [dataclasses.replace(r, start_ns=r.start_ns + shift) for r in scenario_llm_regression().spans]


def _service_file(store_dir: Path, proc: subprocess.Popen[str]) -> dict[str, object]:
    path = store_dir / SERVICE_FILE

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"serve exited early: {proc.communicate()[1]}")
        return path.exists()

    _wait(ready, timeout=60, what="the service file")
    body = json.loads(path.read_text())
    assert isinstance(body, dict)
    return body


@pytest.mark.slow
def test_serve_end_to_end_llm_regression_alert(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    dsn = f"chdb://{store_dir}"
    (tmp_path / "rules.yaml").write_text(RULES)
    with webhook_sink() as sink:
        config = tmp_path / "tailwatch.toml"
        config.write_text(
            f'store = "{dsn}"\n'
            '[receiver]\notlp_http = "127.0.0.1:0"\notlp_grpc = "127.0.0.1:0"\n'
            '[ingest]\nflush_interval = "200ms"\n'
            f'[schedule]\nrollup = "3s"\nanalyze = "5s"\nevaluate = "{EVALUATE_S:g}s"\ndashboards = "5s"\n'
            '[analysis]\nwindow = "1h"\n'
            '[dashboards]\nout_dir = "dash"\n'
            '[rules]\nfiles = ["rules.yaml"]\n'
            f'[[notify.webhook]]\nurl = "{sink.url}"\n'
        )
        with _serving(tmp_path, config, "--log-format", "json") as proc:
            api = str(_service_file(store_dir, proc)["api_url"])
            rows = _regression_now()
            acknowledged = export_rows(api, rows)
            assert acknowledged == len(rows)
            t_ack = time.monotonic()

            def firing() -> dict[str, object] | None:
                for body in sink.bodies():
                    for alert in body.get("alerts", []):
                        if (
                            alert["labels"].get("alertname") == "chat-p99-regression"
                            and alert["status"] == "firing"
                        ):
                            return alert
                return None

            _wait(firing, timeout=60, what="the alert at the webhook")
            arrived = next(t for t, body, _ in sink.received if body.get("status") == "firing")
            alert = firing()
            assert alert is not None
            assert alert["annotations"]["cause"] == "llm"
            assert alert["labels"]["service"] == "chat-api"
            assert str(alert["annotations"].get("dashboard", "")).startswith(f"{api}/dashboards")
            # Within two evaluation intervals of the spans being acknowledged.
            assert arrived - t_ack <= 2 * EVALUATE_S, arrived - t_ack

            # Read commands reach the store through the service while it owns it.
            env = {k: v for k, v in os.environ.items() if not k.startswith("TAILWATCH_")}
            start = datetime.fromtimestamp((time.time_ns() - 3600 * S) / S, UTC).isoformat()
            end = datetime.now(UTC).isoformat()
            cli = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tailwatch",
                    "analyze",
                    "--store",
                    dsn,
                    "--start",
                    start,
                    "--end",
                    end,
                    "--format",
                    "json",
                ],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
            assert cli.returncode == 0, cli.stderr
            [attribution] = [a for a in json.loads(cli.stdout)["attribution"] if a["service"] == "chat-api"]
            assert attribution["verdict"] == "llm"
            listed = subprocess.run(
                [sys.executable, "-m", "tailwatch", "alerts", "list", "--store", dsn],
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
            assert listed.returncode == 0, listed.stderr
            assert "chat-p99-regression" in listed.stdout and "llm" in listed.stdout

            exported = subprocess.run(
                [sys.executable, "-m", "tailwatch", "dashboard", "export", "--store", dsn, "--out", "out"],
                capture_output=True,
                text=True,
                timeout=180,
                env=env,
                cwd=tmp_path,
            )
            assert exported.returncode == 0, exported.stderr
            assert (tmp_path / "out" / "index.html").is_file() and (
                tmp_path / "out" / "attribution.html"
            ).is_file()

            # The scheduled export is served under /dashboards/.
            _wait(
                lambda: httpx.get(f"{api}/dashboards/index.html").status_code == 200,
                timeout=60,
                what="the exported dashboards",
            )
            runs = httpx.get(f"{api}/api/v1/jobs?limit=1000").json()["runs"]
            ok = {r["job"] for r in runs if r["status"] == "ok"}
            assert {"rollup", "analyze", "evaluate", "dashboards"} <= ok, runs
            assert max(r["rows_read"] for r in runs if r["job"] == "analyze") > 0
            assert 'tailwatch_job_runs_total{job="evaluate",status="ok"}' in httpx.get(f"{api}/metrics").text

            # Spans acknowledged right before SIGTERM are stored too.
            late = _simple_spans(700, service="late")
            assert export_rows(api, late) == 700
            err = _stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, err
    logs = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert any(rec["message"].startswith("SIGTERM received") for rec in logs)
    assert not (store_dir / SERVICE_FILE).exists()
    with open_store(dsn) as store:
        assert store.query_value("SELECT count() FROM otel_traces") == acknowledged + 700
        statuses = dict(
            store.query_rows("SELECT job, countIf(status = 'ok') FROM tailwatch_job_runs GROUP BY job")
        )
        assert all(statuses.get(job, 0) >= 1 for job in ("rollup", "analyze", "evaluate", "dashboards"))


@pytest.mark.slow
def test_the_landing_page_answers_from_the_first_minute(tmp_path: Path) -> None:
    """Issue 38: `/` on a fresh `serve` is 200 before any data (saying it waits for spans), after
    the first spans (saying which it holds and when the first analysis runs), and after the first
    evaluation (the firing alert, linking to its own analysis), never a 404."""
    store_dir = tmp_path / "store"
    (tmp_path / "rules.yaml").write_text(RULES)
    config = tmp_path / "tailwatch.toml"
    config.write_text(
        f'store = "chdb://{store_dir}"\n'
        '[receiver]\notlp_http = "127.0.0.1:0"\notlp_grpc = "off"\n'
        '[ingest]\nflush_interval = "200ms"\n'
        '[schedule]\nrollup = "off"\nanalyze = "5m"\nevaluate = "1h"\ndashboards = "1h"\n'
        '[dashboards]\nout_dir = "dash"\n'
        '[rules]\nfiles = ["rules.yaml"]\n'
    )
    with _serving(tmp_path, config) as proc:
        api = str(_service_file(store_dir, proc)["api_url"])

        def landing() -> str:
            page = httpx.get(f"{api}/", timeout=60, follow_redirects=True)
            assert page.status_code == 200, (page.status_code, page.text[:300])
            assert page.headers["content-type"].startswith("text/html")
            return page.text

        first = landing()
        assert "Firing now: nothing" in first and "Waiting for the first analysis" in first
        assert "No spans received yet" in first
        due = re.search(r"First analysis at (\d\d:\d\d:\d\d) UTC", first)
        assert due is not None, first
        assert not (tmp_path / "dash" / "index.html").exists()  # no export yet, and no 404 either

        rows = _regression_now()
        assert export_rows(api, rows) == len(rows)
        span_times = sorted(r.start_ns for r in rows)

        def spans_stated() -> bool:
            return f"{len(rows):,} spans received, from" in landing()

        _wait(spans_stated, timeout=30, what="the spans on the landing page")
        page = landing()
        first_span = datetime.fromtimestamp(span_times[0] / S, UTC).strftime("%Y-%m-%d %H:%M:%S")
        assert f"from {first_span}" in page and f"First analysis at {due[1]} UTC" in page

        run = httpx.post(f"{api}/api/v1/jobs/evaluate/run", timeout=120).json()
        assert run["status"] == "ok", run
        page = landing()
        assert "Firing now (1)" in page and "chat-p99-regression" in page and "<b>llm</b>" in page
        assert re.search(r'href="runs/[0-9a-f]{32}/attribution\.html"', page), page
        err = _stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, err
