"""The tail metrics on ``/metrics``: the gauges themselves, the collector, and a real Prometheus
scraping ``tailwatch serve``."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import polars as pl
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from analytics import FRAME_SCHEMAS, Analysis, analyze, persist_analysis
from collectors.spans import insert_spans
from storage import Store
from tailwatch.config import Schedule
from tailwatch.metrics import TailMetrics, alert_families, analysis_families
from tailwatch.remote import SERVICE_FILE
from tailwatch.service import Job, JobContext, Service
from tests.tailwatch.otlp_send import export_rows
from tests.tailwatch.prometheus import running_prometheus
from tests.tailwatch.test_serve_e2e import RULES, _regression_now, _service_file
from tests.tailwatch.test_service import S, _config, _serving, _stop, _wait

START = datetime(2026, 11, 2, 9, tzinfo=UTC)
END = START + timedelta(hours=1)
HOURLY = Schedule("interval", seconds=3600.0)
P99 = 'tailwatch_hot_path_latency_seconds{service="chat-api",operation="POST /chat",quantile="0.99"}'
# The same series as prometheus_client writes it (labels sorted by name).
P99_LINE = 'tailwatch_hot_path_latency_seconds{operation="POST /chat",quantile="0.99",service="chat-api"}'


def _analysis(**frames: list[dict[str, Any]]) -> Analysis:
    """An analysis of [START, END) whose named frames hold ``rows`` (the others empty)."""
    empty = Analysis.from_frame_bytes(
        {"start": START, "end": END, "baseline_start": START - timedelta(hours=1), "baseline_end": START},
        {},
        run_id="r1",
    )
    filled = {name: pl.DataFrame(rows, schema=FRAME_SCHEMAS[name]) for name, rows in frames.items()}
    return dataclasses.replace(empty, **filled)


def _row(frame: str, **values: Any) -> dict[str, Any]:
    return {column: values.get(column) for column in FRAME_SCHEMAS[frame]}


def _exposed(registry: CollectorRegistry) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    """Every sample of ``/metrics`` text, parsed back: name → {labels: value}."""
    out: dict[str, dict[frozenset[tuple[str, str]], float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return out


def _families(
    analysis: Analysis, max_series: int = 2000
) -> dict[str, dict[frozenset[tuple[str, str]], float]]:
    metrics, _ = analysis_families(analysis, max_series=max_series)
    registry = CollectorRegistry()

    class _Fixed:
        def collect(self) -> list[Any]:
            return metrics

    registry.register(_Fixed())
    return _exposed(registry)


def _labels(**labels: str) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())


# ---------------------------------------------------------------------------------------------
# The gauges (pure)
# ---------------------------------------------------------------------------------------------


def test_gauges_are_in_base_units_with_the_span_data_labels() -> None:
    service = 'chat "api"\nv2\\x'  # quotes, a newline and a backslash survive the exposition
    analysis = _analysis(
        hot_path=[
            _row(
                "hot_path",
                service=service,
                operation="POST /chat",
                requests=400,
                p50_ms=268.7361005,
                p95_ms=341.19,
                p99_ms=2055.0,
                p999_ms=None,  # too few requests: no sample, not NaN
                sync_llm_calls_per_request=1.25,
            )
        ],
        releases=[
            _row(
                "releases",
                service=service,
                operation="POST /chat",
                version="2.0.0",
                released_at=START + timedelta(minutes=5),
                requests_after=300,
                p99_after_ms=2100.0,
                p99_delta_ms=1200.0,
                significant=True,
                sync_llm_calls_per_request_after=1.5,
            )
        ],
        cold_path=[
            _row(
                "cold_path",
                queue="emails",
                jobs=50,
                pending=3,
                p50_s=1.5,
                p95_s=4.0,
                p99_s=9.5,
                p999_s=12.0,
                starved=True,
            )
        ],
        abandonment=[
            _row("abandonment", service="s", operation="o", lo_ms=0, hi_ms=500, rate=0.01),
            _row("abandonment", service="s", operation="o", lo_ms=2500, hi_ms=3000, rate=0.4),
        ],
        abandonment_summary=[
            _row("abandonment_summary", service="s", operation="o", requests=9, rate=0.05, cliff_ms=2500)
        ],
        retry_amplification=[
            _row(
                "retry_amplification",
                workflow="triage",
                runs=20,
                attempt_amplification=1.8,
                token_amplification=2.5,
            )
        ],
        attribution=[
            _row(
                "attribution",
                service="s",
                operation="o",
                delta_ms=1200.0,
                llm_share=0.75,
                internal_share=0.25,
                verdict="llm",
                current_requests=9,
            )
        ],
        llm_calls=[
            _row(
                "llm_calls",
                provider="openai",
                model="gpt-4o",
                calls=100,
                error_rate=0.02,
                failed_attempt_rate=0.03,
                throttle_rate=0.01,
                retry_rate=0.1,
                cold_share=float("nan"),  # a ratio over nothing: no sample
                tokens=70000,
            )
        ],
        llm_costs=[
            _row(
                "llm_costs",
                service=service,
                operation="POST /chat",
                version="",
                window="current",
                requests=400,
                sync_llm_calls_per_request=1.25,
                llm_tokens_per_request=1500.0,
                llm_cost_per_request=0.002,
            ),
            # A version's own row and the baseline's are not the window's figure.
            _row(
                "llm_costs",
                service=service,
                operation="POST /chat",
                version="2.0.0",
                window="current",
                requests=200,
                sync_llm_calls_per_request=1.0,
                llm_tokens_per_request=900.0,
            ),
            _row(
                "llm_costs",
                service=service,
                operation="POST /chat",
                version="",
                window="baseline",
                requests=300,
                sync_llm_calls_per_request=1.0,
                llm_tokens_per_request=700.0,
            ),
        ],
    )
    got = _families(analysis)
    hot = got["tailwatch_hot_path_latency_seconds"]
    op = {"service": service, "operation": "POST /chat"}
    assert hot == {
        _labels(**op, quantile="0.5"): 268.7361005 / 1000,
        _labels(**op, quantile="0.95"): 341.19 / 1000,
        _labels(**op, quantile="0.99"): 2.055,
    }
    assert got["tailwatch_hot_path_requests"] == {_labels(**op): 400}
    assert got["tailwatch_hot_path_sync_llm_calls_per_request"] == {_labels(**op): 1.25}
    assert got["tailwatch_hot_path_llm_tokens_per_request"] == {_labels(**op): 1500.0}
    assert got["tailwatch_hot_path_llm_cost_usd_per_request"] == {_labels(**op): 0.002}
    version = {**op, "version": "2.0.0"}
    assert got["tailwatch_release_latency_seconds"] == {_labels(**version, quantile="0.99"): 2.1}
    assert got["tailwatch_release_p99_delta_seconds"] == {_labels(**version): 1.2}
    assert got["tailwatch_release_p99_change_significant"] == {_labels(**version): 1}
    assert got["tailwatch_release_timestamp_seconds"] == {
        _labels(**version): (START + timedelta(minutes=5)).timestamp()
    }
    assert got["tailwatch_cold_path_enqueue_to_ready_seconds"] == {
        _labels(queue="emails", quantile="0.5"): 1.5,
        _labels(queue="emails", quantile="0.95"): 4.0,
        _labels(queue="emails", quantile="0.99"): 9.5,
        _labels(queue="emails", quantile="0.999"): 12.0,
    }
    assert got["tailwatch_cold_path_pending_jobs"] == {_labels(queue="emails"): 3}
    assert got["tailwatch_cold_path_starved"] == {_labels(queue="emails"): 1}
    assert got["tailwatch_abandonment_bucket_ratio"] == {
        _labels(service="s", operation="o", lower_seconds="0", upper_seconds="0.5"): 0.01,
        _labels(service="s", operation="o", lower_seconds="2.5", upper_seconds="3"): 0.4,
    }
    assert got["tailwatch_abandonment_ratio"] == {_labels(service="s", operation="o"): 0.05}
    assert got["tailwatch_abandonment_cliff_seconds"] == {_labels(service="s", operation="o"): 2.5}
    assert got["tailwatch_retry_attempt_amplification_ratio"] == {_labels(workflow="triage"): 1.8}
    assert got["tailwatch_retry_token_amplification_ratio"] == {_labels(workflow="triage"): 2.5}
    assert got["tailwatch_attribution_share_ratio"] == {
        _labels(service="s", operation="o", **{"class": "llm"}): 0.75,
        _labels(service="s", operation="o", **{"class": "internal"}): 0.25,
    }
    assert got["tailwatch_attribution_verdict"] == {
        _labels(service="s", operation="o", verdict=v): float(v == "llm")
        for v in ("llm", "internal", "mixed", "none")
    }
    provider = {"provider": "openai", "model": "gpt-4o"}
    assert got["tailwatch_llm_call_error_ratio"] == {_labels(**provider): 0.02}
    assert got["tailwatch_llm_call_failed_attempt_ratio"] == {_labels(**provider): 0.03}
    assert got["tailwatch_llm_call_throttle_ratio"] == {_labels(**provider): 0.01}
    assert got["tailwatch_llm_call_retry_ratio"] == {_labels(**provider): 0.1}
    assert "tailwatch_llm_call_cold_ratio" not in got
    assert got["tailwatch_analysis_window_end_timestamp_seconds"] == {frozenset(): END.timestamp()}
    # Nothing but finite numbers reaches the exposition.
    assert all(math.isfinite(v) for family in got.values() for v in family.values())


def test_each_family_is_capped_keeping_the_busiest_rows() -> None:
    rows = [
        _row(
            "hot_path",
            service="s",
            operation=f"GET /item/{i}",
            requests=i,
            p50_ms=1.0,
            p95_ms=2.0,
            p99_ms=3.0,
            p999_ms=4.0,
        )
        for i in range(1, 8)
    ]
    metrics, dropped = analysis_families(_analysis(hot_path=rows), max_series=10)
    hot = next(m for m in metrics if m.name == "tailwatch_hot_path_latency_seconds")
    # Rows are kept whole (four quantiles each): the two busiest operations fit in 10 series.
    assert {s.labels["operation"] for s in hot.samples} == {"GET /item/7", "GET /item/6"}
    assert len(hot.samples) == 8 and dropped["tailwatch_hot_path_latency_seconds"] == 20
    requests = next(m for m in metrics if m.name == "tailwatch_hot_path_requests")
    assert len(requests.samples) == 7 and dropped["tailwatch_hot_path_requests"] == 0
    with pytest.raises(ValueError, match="max_series must be at least 1"):
        analysis_families(_analysis(), max_series=0)


def _alerts(*rows: dict[str, Any]) -> pl.DataFrame:
    columns = ["fingerprint", "alertname", "severity", "state", "service", "operation", "queue", "workflow"]
    columns += ["path", "cause", "summary", "labels", "annotations"]
    return pl.DataFrame(
        [{c: row.get(c, "") for c in columns} for row in rows], schema=dict.fromkeys(columns, pl.String)
    )


def test_alert_series_carry_the_labels_state_and_cause_like_prometheus_alerts() -> None:
    firing = {
        "alertname": "chat-p99-regression",
        "severity": "page",
        "service": "chat-api",
        "operation": "POST /chat",
        "path": "hot",
        "team": "ai",
        "dashboard.url": "x",  # not a Prometheus label name: underscores
        "__meta": "y",  # reserved by Prometheus: left out
    }
    metric, dropped = alert_families(
        _alerts(
            {"state": "firing", "cause": "llm", "labels": json.dumps(firing)},
            {"state": "firing", "cause": "llm", "labels": json.dumps(firing)},  # same identity: once
            {"state": "pending", "alertname": "emails-starved", "queue": "emails", "labels": "{}"},
            {"state": "resolved", "alertname": "old", "labels": "{}"},
        )
    )
    assert dropped == 0
    assert [s.labels for s in metric.samples] == [
        {
            "alertname": "chat-p99-regression",
            "severity": "page",
            "service": "chat-api",
            "operation": "POST /chat",
            "path": "hot",
            "team": "ai",
            "dashboard_url": "x",
            "alertstate": "firing",
            "cause": "llm",
        },
        {"alertname": "emails-starved", "queue": "emails", "alertstate": "pending"},
    ]
    assert all(s.value == 1 for s in metric.samples)
    assert alert_families(_alerts(), max_series=1)[0].samples == []


# ---------------------------------------------------------------------------------------------
# The collector
# ---------------------------------------------------------------------------------------------


class _BrokenStore:
    """A store whose every read fails (a server that went away)."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: object, **kwargs: object) -> Any:
            raise ConnectionError("store unreachable")

        return fail


def test_collector_reads_the_latest_run_and_never_the_store_on_a_scrape(store: Store) -> None:
    from tests.analytics.builders import scenario_llm_regression

    registry = CollectorRegistry()
    tail = TailMetrics(store, registry=registry, refresh_after_s=3600)
    # No analysis yet: nothing but the collector's own series, and no alert series.
    assert tail.refresh()
    exposed = _exposed(registry)
    assert not any(name.startswith(("tailwatch_hot_path", "tailwatch_analysis")) for name in exposed)
    assert "tailwatch_alerts" not in exposed
    assert exposed["tailwatch_tail_metrics_refresh_errors_total"] == {frozenset(): 0}

    scenario = scenario_llm_regression(requests=200)
    insert_spans(store, scenario.spans)
    analysis = analyze(store, scenario.start, scenario.end, scenario.baseline_start, scenario.baseline_end)
    persist_analysis(store, analysis)
    # A scrape hands out the snapshot: the new run appears after a refresh, not before.
    assert "tailwatch_hot_path_latency_seconds" not in _exposed(registry)
    assert tail.refresh()
    [p99] = analysis.hot_path["p99_ms"].to_list()
    exposed = _exposed(registry)
    assert (
        exposed["tailwatch_hot_path_latency_seconds"][
            _labels(service="chat-api", operation="POST /chat", quantile="0.99")
        ]
        == p99 / 1000
    )
    assert exposed["tailwatch_analysis_window_end_timestamp_seconds"] == {
        frozenset(): scenario.end.timestamp()
    }
    assert (
        exposed["tailwatch_analysis_age_seconds"][frozenset()] >= time.time() - scenario.end.timestamp() - 1
    )

    # The store goes away. A scrape does not notice (it reads no store); a refresh fails and is
    # counted, and scrapes keep answering with the last snapshot.
    tail.store = _BrokenStore()  # type: ignore[assignment]
    assert _exposed(registry)["tailwatch_tail_metrics_refresh_errors_total"] == {frozenset(): 0}
    assert not tail.refresh()
    exposed = _exposed(registry)
    assert exposed["tailwatch_tail_metrics_refresh_errors_total"] == {frozenset(): 1}
    assert (
        exposed["tailwatch_hot_path_latency_seconds"][
            _labels(service="chat-api", operation="POST /chat", quantile="0.99")
        ]
        == p99 / 1000
    )
    tail.stop()
    assert "tailwatch_tail_metrics_refresh_errors_total" not in _exposed(registry)


def test_a_stale_scrape_wakes_the_background_reader(store: Store) -> None:
    registry = CollectorRegistry()
    tail = TailMetrics(store, registry=registry, refresh_after_s=0.2)
    tail.start()
    try:
        _wait(
            lambda: (
                tail.errors == 0
                and "tailwatch_tail_metrics_last_refresh_timestamp_seconds" in _exposed(registry)
            )
        )
        first = _exposed(registry)["tailwatch_tail_metrics_last_refresh_timestamp_seconds"][frozenset()]
        time.sleep(0.3)
        _exposed(registry)  # stale: asks for a read, answers at once
        _wait(
            lambda: (
                _exposed(registry)["tailwatch_tail_metrics_last_refresh_timestamp_seconds"][frozenset()]
                > first
            ),
            timeout=10,
            what="a refresh after a stale scrape",
        )
    finally:
        tail.stop()
    with pytest.raises(ValueError, match="refresh_after_s must be positive"):
        TailMetrics(store, refresh_after_s=0)


def test_metrics_require_the_token_when_one_is_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAILWATCH_INGEST_TOKEN", "s3cret")
    every = Job("noop", HOURLY, lambda ctx: None)
    service = Service(_config(tmp_path), jobs=[every])
    service.start()
    try:
        api = service.api_url
        assert api is not None
        refused = httpx.get(f"{api}/metrics")
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{api}/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        answer = httpx.get(f"{api}/metrics", headers={"Authorization": "Bearer s3cret"})
        assert answer.status_code == 200 and "tailwatch_ingest_spans_received_total" in answer.text
        assert "tailwatch_tail_metrics_refresh_errors_total" in answer.text
        # Probes stay open.
        assert httpx.get(f"{api}/healthz").status_code == 200
    finally:
        assert service.stop(timeout_s=10)


def test_a_receivers_only_instance_serves_no_tail_metrics(tmp_path: Path) -> None:
    service = Service(_config(tmp_path, "[schedule]\nenabled = false\n"))
    service.start()
    try:
        assert service.tail_metrics is None
        text = httpx.get(f"{service.api_url}/metrics").text
        assert "tailwatch_ingest_spans_received_total" in text and "tailwatch_tail_metrics" not in text
    finally:
        assert service.stop(timeout_s=10)


def test_a_job_run_refreshes_the_gauges(tmp_path: Path) -> None:
    runs: list[str] = []

    def persist(ctx: JobContext) -> object:
        from tests.analytics.builders import scenario_llm_regression

        scenario = scenario_llm_regression(requests=100)
        insert_spans(ctx.store, scenario.spans)
        analysis = analyze(ctx.store, scenario.start, scenario.end)
        runs.append(persist_analysis(ctx.store, analysis))
        return runs[-1]

    service = Service(_config(tmp_path), jobs=[Job("analyze", HOURLY, persist)])
    service.start()
    try:
        assert service.api_url is not None and service.tail_metrics is not None
        service.tail_metrics.refresh_after_s = 3600  # only the job's own refresh can show the run
        assert httpx.post(f"{service.api_url}/api/v1/jobs/analyze/run").json()["status"] == "ok"
        _wait(
            lambda: P99_LINE in httpx.get(f"{service.api_url}/metrics").text,
            timeout=20,
            what="the hot path gauges after the job run",
        )
    finally:
        assert service.stop(timeout_s=10)


# ---------------------------------------------------------------------------------------------
# A real Prometheus scraping `tailwatch serve`
# ---------------------------------------------------------------------------------------------

TOKEN_ENV = "TW_PROMETHEUS_TEST_TOKEN"  # not TAILWATCH_*: the serve helper passes it through


def _tails_now() -> list[Any]:
    """The analytics' ground truths of a starved queue with pending jobs, an abandonment cliff and
    retried workflow hops, moved so their hour starts 59 minutes ago: with the LLM regression, a
    series for every panel of the Grafana dashboard."""
    from tests.analytics.builders import (
        T0,
        scenario_abandonment_cliff,
        scenario_cold_queues,
        scenario_retries,
    )

    shift = time.time_ns() - 3540 * S - T0
    rows = []
    for scenario in (scenario_cold_queues(), scenario_abandonment_cliff(), scenario_retries()):
        rows += [dataclasses.replace(r, start_ns=r.start_ns + shift) for r in scenario.spans]
    return rows


def _all_selected(expr: str) -> str:
    """A Grafana query as Grafana sends it with "All" selected in every template variable."""
    for name in ("service", "operation", "queue"):
        expr = expr.replace(f"${name}", ".*")
    return expr


def _value(samples: list[dict[str, Any]]) -> float:
    [sample] = samples
    return float(sample["value"][1])


@pytest.mark.slow
def test_prometheus_scrapes_the_tail_metrics_of_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "prometheus-test-token"
    monkeypatch.setenv(TOKEN_ENV, token)
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    auth = {"Authorization": f"Bearer {token}"}
    store_dir = tmp_path / "store"
    dsn = f"chdb://{store_dir}"
    (tmp_path / "rules.yaml").write_text(RULES)
    config = tmp_path / "tailwatch.toml"
    # Jobs run when the test asks (POST /api/v1/jobs/<job>/run), never on their own meanwhile.
    config.write_text(
        f'store = "{dsn}"\n'
        '[receiver]\notlp_http = "127.0.0.1:0"\notlp_grpc = "off"\n'
        '[ingest]\nflush_interval = "200ms"\n'
        f'[auth]\ntoken_env = "{TOKEN_ENV}"\n'
        '[schedule]\nrollup = "off"\nanalyze = "1h"\nevaluate = "1h"\ndashboards = "off"\n'
        '[analysis]\nwindow = "1h"\n'
        '[rules]\nfiles = ["rules.yaml"]\n'
    )
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    with _serving(tmp_path, config) as proc:
        api = str(_service_file(store_dir, proc)["api_url"])
        timings["serve ready"] = time.monotonic() - t0
        target = api.removeprefix("http://")
        with running_prometheus(tmp_path, [target], bearer_token_file=token_file) as prom:
            timings["prometheus ready"] = time.monotonic() - t0
            # Before any analysis: the target is up, the collector answers, and there is no alert series.
            prom.wait_for('up{job="tailwatch"} == 1')
            prom.wait_for("tailwatch_tail_metrics_refresh_errors_total == 0")
            assert prom.query("tailwatch_alerts") == []
            assert prom.query("tailwatch_hot_path_latency_seconds") == []
            assert httpx.get(f"{api}/metrics").status_code == 401

            rows = _regression_now() + _tails_now()
            assert export_rows(api, rows, token=token) == len(rows)
            _wait(
                lambda: (
                    f"tailwatch_ingest_spans_inserted_total {len(rows)}.0"
                    in httpx.get(f"{api}/metrics", headers=auth).text
                ),
                timeout=30,
                what="every span in the store",
            )
            timings["spans stored"] = time.monotonic() - t0

            run = httpx.post(f"{api}/api/v1/jobs/analyze/run", headers=auth, timeout=120).json()
            assert run["status"] == "ok", run
            end = datetime.fromisoformat(run["started_at"])
            timings["analyze job"] = time.monotonic() - t0
            scraped_p99 = _value(prom.wait_for(P99))
            timings["p99 in prometheus"] = time.monotonic() - t0
            # The ingest series come with the same scrape.
            prom.wait_for(f"tailwatch_ingest_spans_inserted_total == {len(rows)}")
            window_end = _value(prom.query("tailwatch_analysis_window_end_timestamp_seconds"))
            assert abs(window_end - end.timestamp()) < 1e-5
            assert 0 <= _value(prom.query("tailwatch_analysis_age_seconds")) < 60

            # `tailwatch analyze` over the same window (through the service's API, which owns the store).
            cli = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "tailwatch",
                    "analyze",
                    "--store",
                    dsn,
                    "--start",
                    (end - timedelta(hours=1)).isoformat(),
                    "--end",
                    end.isoformat(),
                    "--format",
                    "json",
                ],
                capture_output=True,
                text=True,
                timeout=120,
                env={k: v for k, v in os.environ.items() if not k.startswith("TAILWATCH_")},
            )
            assert cli.returncode == 0, cli.stderr
            [hot] = [h for h in json.loads(cli.stdout)["hot_path"] if h["service"] == "chat-api"]
            timings["tailwatch analyze"] = time.monotonic() - t0
            # Exactly the same float: seconds are the analysis's milliseconds / 1000, and both the
            # exposition and Prometheus's API write shortest round-trip decimals.
            assert scraped_p99 == hot["p99_ms"] / 1000, (scraped_p99, hot["p99_ms"])

            run = httpx.post(f"{api}/api/v1/jobs/evaluate/run", headers=auth, timeout=120).json()
            assert run["status"] == "ok", run
            [alert] = prom.wait_for('tailwatch_alerts{alertname="chat-p99-regression"}')
            timings["alert in prometheus"] = time.monotonic() - t0
            assert alert["metric"] == {
                "__name__": "tailwatch_alerts",
                "alertname": "chat-p99-regression",
                "alertstate": "firing",
                "severity": "page",
                "service": "chat-api",
                "operation": "POST /chat",
                "path": "hot",
                "cause": "llm",
                "instance": target,
                "job": "tailwatch",
            }
            assert float(alert["value"][1]) == 1
            # The PromQL of docs/service.md: the operations whose p99 regression is blamed on the LLM.
            blamed = prom.query(
                'tailwatch_attribution_share_ratio{class="llm"} > 0.5 '
                'and on (service, operation) tailwatch_attribution_verdict{verdict="llm"} == 1'
            )
            assert [(s["metric"]["service"], s["metric"]["operation"]) for s in blamed] == [
                ("chat-api", "POST /chat")
            ]
            _check_the_grafana_dashboard(prom, api, auth, hot["p99_ms"] / 1000)
            timings["grafana queries"] = time.monotonic() - t0
        err = _stop(proc, signal.SIGTERM)
    assert proc.returncode == 0, err
    assert not (store_dir / SERVICE_FILE).exists()
    print("timings (s since start):", {k: round(v, 2) for k, v in timings.items()})


def _check_the_grafana_dashboard(prom: Any, api: str, auth: dict[str, str], p99_s: float) -> None:
    """Issue 38: every query of `tailwatch grafana dashboard` through Prometheus's query API returns
    series; the hot-path p99 panel shows `tailwatch analyze`'s p99; the variables list what the
    data holds; the release annotation marks the versions; each panel's link opens its page."""
    from tailwatch.commands.grafana import RELEASE_ANNOTATION_EXPR, VARIABLES

    done = subprocess.run(
        [sys.executable, "-m", "tailwatch", "grafana", "dashboard", "--dashboards-url", f"{api}/dashboards"],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("TAILWATCH_")},
    )
    assert done.returncode == 0, done.stderr
    board = json.loads(done.stdout)
    for panel in board["panels"]:
        for target in panel["targets"]:
            assert prom.query(_all_selected(target["expr"])), (panel["title"], target["expr"])
    [hot_panel] = [p for p in board["panels"] if p["title"] == "Hot-path p50 and p99 per operation"]
    [p99_target] = [t for t in hot_panel["targets"] if 'quantile="0.99"' in t["expr"]]
    [p99] = [
        s
        for s in prom.query(_all_selected(p99_target["expr"]))
        if (s["metric"]["service"], s["metric"]["operation"]) == ("chat-api", "POST /chat")
    ]
    assert float(p99["value"][1]) == p99_s
    # Grafana's label_values(metric, label) is Prometheus's label API with a match[] selector.
    listed = {}
    for name, (metric, label) in VARIABLES.items():
        answer = httpx.get(
            f"{prom.url}/api/v1/label/{label}/values", params={"match[]": _all_selected(metric)}, timeout=10
        ).json()
        listed[name] = set(answer["data"])
    assert {"chat-api", "web"} <= listed["service"]
    assert {"POST /chat", "GET /answer"} <= listed["operation"]
    assert {"doc-summaries", "emails"} <= listed["queue"]
    released = {
        s["metric"]["version"]: float(s["value"][1])
        for s in prom.query("tailwatch_release_timestamp_seconds")
    }
    marks = prom.query(_all_selected(RELEASE_ANNOTATION_EXPR))
    # The annotation's query is in milliseconds: back in seconds, to the float's last digit or so.
    assert marks and {s["metric"]["version"]: float(s["value"][1]) / 1000 for s in marks} == pytest.approx(
        released, rel=1e-15
    )
    # Each panel's link opens the matching tailwatch page (of the latest scheduled analysis).
    [base] = [v["query"] for v in board["templating"]["list"] if v["name"] == "tailwatch_url"]
    for url in sorted(
        {link["url"].replace("${tailwatch_url}", base) for p in board["panels"] for link in p["links"]}
    ):
        page = httpx.get(url, headers=auth, timeout=120, follow_redirects=True)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), url


def test_the_model_call_anatomy_is_exposed_with_its_source_and_no_cost_without_a_price() -> None:
    rows = [
        _row(
            "llm_anatomy",
            provider="openai",
            model="gpt-4o",
            calls=100,
            ttft_p50_ms=410.0,
            ttft_p99_ms=1600.0,
            ttft_source="attribute",
            ms_per_output_token_p50=20.0,
            cached_input_ratio=0.25,
            cost_per_day=12.5,
        ),
        _row(
            "llm_anatomy",
            provider="anthropic",
            model="claude-sonnet-4",
            calls=50,
            ttft_p50_ms=700.0,
            ttft_source="estimated",
            ms_per_output_token_p50=15.0,
        ),
    ]
    exposed = _families(_analysis(llm_anatomy=rows))
    ttft = exposed["tailwatch_llm_time_to_first_token_seconds"]
    gpt = {("provider", "openai"), ("model", "gpt-4o"), ("source", "attribute")}
    assert ttft[frozenset(gpt | {("quantile", "0.5")})] == 0.41
    assert ttft[frozenset(gpt | {("quantile", "0.99")})] == 1.6
    claude = {("provider", "anthropic"), ("model", "claude-sonnet-4"), ("source", "estimated")}
    # An estimate has a median fixed part only.
    assert set(ttft) == {frozenset(gpt | {("quantile", q)}) for q in ("0.5", "0.99")} | {
        frozenset(claude | {("quantile", "0.5")})
    }
    per_token = exposed["tailwatch_llm_seconds_per_output_token"]
    assert per_token[frozenset({("provider", "anthropic"), ("model", "claude-sonnet-4")})] == 0.015
    cost = exposed["tailwatch_llm_cost_usd_per_day"]
    assert cost == {frozenset({("provider", "openai"), ("model", "gpt-4o")}): 12.5}
