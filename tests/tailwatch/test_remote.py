"""Read commands on an embedded store owned by a running service go through its API."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from tailwatch.cli import main
from tailwatch.config import load_config
from tailwatch.remote import SERVICE_FILE, find_service
from tailwatch.service import Service
from tests.analytics.builders import scenario_llm_regression
from tests.tailwatch.otlp_send import export_rows


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[str]:
    """Another process holding the embedded store, with no service API."""
    dsn = f"chdb://{tmp_path / 'store'}"
    code = (
        "import sys, time\nfrom storage import open_store\n"
        f"s = open_store({dsn!r})\nprint('ready', flush=True)\nsys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield dsn
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)


def test_store_in_use_without_a_service_is_one_line(holder: str, tmp_path: Path) -> None:
    args = ["analyze", "--store", holder, "--start", "2026-11-02T08:00:00Z", "--end", "2026-11-02T09:00:00Z"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert "is in use by another process and no tailwatch service API is announced" in lines[0]

    # A service file left by a dead process is stale: the same answer.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (tmp_path / "store" / SERVICE_FILE).write_text(
        json.dumps({"api_url": "http://127.0.0.1:9", "pid": int(dead.stdout)})
    )
    assert find_service(holder) is None
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 2 and "no tailwatch service API is announced" in again.output


def _without_exemplars(body: dict[str, object]) -> dict[str, object]:
    rows = body["attribution"]
    assert isinstance(rows, list)
    for row in rows:
        row.pop("exemplar_trace_ids")
    return body


def test_analyze_goes_through_the_running_service(tmp_path: Path) -> None:
    scenario = scenario_llm_regression()
    path = tmp_path / "tw.toml"
    path.write_text(
        f'store = "chdb://{tmp_path / "store"}"\n[receiver]\notlp_http = "127.0.0.1:0"\notlp_grpc = "off"\n'
        '[ingest]\nflush_interval = "100ms"\n'
    )
    service = Service(load_config(path, env={}), jobs=[])
    service.start()
    try:
        assert service.api_url is not None
        assert export_rows(service.api_url, scenario.spans) == len(scenario.spans)
        # serve spools: an export is acknowledged before its insert; wait for the inserts.
        assert service.pipeline is not None and service.pipeline.flush(30)
        window = ["--start", scenario.start.isoformat(), "--end", scenario.end.isoformat()]
        baseline = ["--baseline-start", scenario.baseline_start.isoformat()]
        baseline += ["--baseline-end", scenario.baseline_end.isoformat()]
        dsn = f"chdb://{tmp_path / 'store'}"
        # This very process serves the store; the command still cannot open it and uses the API.
        result = CliRunner().invoke(main, ["analyze", "--store", dsn, *window, *baseline, "--format", "json"])
        assert result.exit_code == 0, result.output
        params = {
            "start": scenario.start.isoformat(),
            "end": scenario.end.isoformat(),
            "baseline_start": scenario.baseline_start.isoformat(),
            "baseline_end": scenario.baseline_end.isoformat(),
        }
        direct = httpx.get(f"{service.api_url}/api/v1/analyze", params=params, timeout=120)
        assert direct.status_code == 200
        # The same object as the API's (exemplar choice among equally slow traces may differ per run).
        assert _without_exemplars(json.loads(result.output)) == _without_exemplars(direct.json())
        [row] = [a for a in json.loads(result.output)["attribution"] if a["operation"] == scenario.operation]
        assert row["verdict"] == "llm"
        table = CliRunner().invoke(main, ["analyze", "--store", dsn, *window, "--format", "table"])
        assert table.exit_code == 0 and "verdict=llm" in table.output

        bad = httpx.get(f"{service.api_url}/api/v1/analyze", params={"start": "yesterday", "end": "now"})
        assert bad.status_code == 400 and "is not an ISO 8601 time" in bad.json()["error"]
        # Regression: a window beyond what a span can carry was a 500; now it says what is allowed.
        wide = httpx.get(
            f"{service.api_url}/api/v1/analyze", params={"start": "0001-01-01", "end": "9999-12-31"}
        )
        assert wide.status_code == 422 and "outside the times spans can have" in wide.json()["error"]
        assert httpx.get(f"{service.api_url}/healthz").status_code == 200
    finally:
        service.stop(timeout_s=20)
    assert os.path.exists(tmp_path / "store") and not (tmp_path / "store" / SERVICE_FILE).exists()


def _otlp_json(request: Any) -> dict[str, Any]:
    """OTLP/JSON as the Collector's file exporter writes it: ids in hex, not protobuf's base64."""
    from google.protobuf import json_format

    body = json_format.MessageToDict(request)
    for resource in body["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return body


def test_write_commands_go_through_the_running_service(tmp_path: Path) -> None:
    """ingest, alerts evaluate|deliver and schema apply while `serve` owns the store."""
    from tests.collectors.otlp_samples import make_request

    store_path = tmp_path / "store"
    path = tmp_path / "tw.toml"
    path.write_text(
        f'store = "chdb://{store_path}"\n[receiver]\notlp_http = "127.0.0.1:0"\notlp_grpc = "off"\n'
        '[ingest]\nflush_interval = "100ms"\n'
        '[schedule]\nrollup = "off"\nanalyze = "off"\nevaluate = "1h"\ndashboards = "off"\n'
    )
    first, expected = make_request(20, seed=5)
    second, more = make_request(5, seed=6)
    second.resource_spans[0].scope_spans[0].spans[0].span_id = b"\x00" * 8  # rejected: all-zero id
    lines = tmp_path / "spans.jsonl"
    lines.write_text("".join(json.dumps(_otlp_json(r)) + "\n" for r in (first, second)))
    dsn = f"chdb://{store_path}"
    service = Service(load_config(path, env={}))
    service.start()
    try:
        assert service.api_url is not None and service.store is not None
        runner = CliRunner()
        ingested = runner.invoke(main, ["ingest", "--store", dsn, str(lines), str(tmp_path / "missing.pb")])
        assert ingested.exit_code == 1, ingested.output  # the missing file is reported and skipped
        assert (
            f"ingested 24 spans (1 rejected) from 2 files through the tailwatch service at {service.api_url}"
            in (ingested.output)
        )
        assert f"{lines}: otlp-json-lines, 24 accepted, 1 rejected" in ingested.output
        assert "missing.pb: cannot read" in ingested.output
        assert service.pipeline is not None and service.pipeline.flush(30)
        stored = service.store.query_value("SELECT count() FROM otel_traces")
        assert stored == 24 == len(expected) + len(more) - 1

        evaluated = runner.invoke(main, ["alerts", "evaluate", "--store", dsn])
        assert evaluated.exit_code == 0, evaluated.output
        assert "ran its evaluate job now" in evaluated.output
        assert "with its configured rules and notifiers" in evaluated.output
        runs = httpx.get(f"{service.api_url}/api/v1/jobs", timeout=30).json()["runs"]
        assert [r["status"] for r in runs if r["job"] == "evaluate"] == ["ok"]

        refused = runner.invoke(
            main, ["alerts", "evaluate", "--store", dsn, "--rules", "x.yaml", "--at", "2026-11-02T08:00:00Z"]
        )
        assert refused.exit_code == 2
        [line] = refused.output.strip().splitlines()
        assert line.startswith(f"tailwatch: error: store {dsn} is owned by the running tailwatch service")
        assert "--at, --rules cannot apply there" in line or "--rules, --at cannot apply there" in line

        delivered = runner.invoke(main, ["alerts", "deliver", "--store", dsn])
        assert delivered.exit_code == 0, delivered.output
        assert "delivered the outbox" in delivered.output
        with_webhook = runner.invoke(
            main, ["alerts", "deliver", "--store", dsn, "--webhook", "http://127.0.0.1:9"]
        )
        assert with_webhook.exit_code == 2 and "--webhook cannot apply there" in with_webhook.output

        applied = runner.invoke(main, ["schema", "apply", "--store", dsn])
        assert applied.exit_code == 0, applied.output
        assert "applied the schema of store" in applied.output and "when it started" in applied.output
        ttl = runner.invoke(main, ["schema", "apply", "--store", dsn, "--ttl-days", "7"])
        assert ttl.exit_code == 2 and "--ttl-days change existing tables: stop the service" in ttl.output
        collect = runner.invoke(
            main, ["collect", "--store", dsn, "--otlp-http", "127.0.0.1:0", "--otlp-grpc", "off"]
        )
        assert collect.exit_code == 2
        assert f"already receives spans for it: export to {service.api_url}/v1/traces" in collect.output
        # No message of any of these points --store at the service's OTLP port.
        for result in (ingested, evaluated, refused, delivered, with_webhook, applied, ttl, collect):
            assert "--store http" not in result.output and "HTTP API" not in result.output
    finally:
        service.stop(timeout_s=20)
