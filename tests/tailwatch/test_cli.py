from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tailwatch import __version__
from tailwatch.cli import main


def _all_commands(group, prefix=()):  # type: ignore[no-untyped-def]
    import click

    for name, cmd in group.commands.items():
        path = (*prefix, name)
        yield path
        if isinstance(cmd, click.Group):
            yield from _all_commands(cmd, path)


def test_version_and_help_on_every_command() -> None:
    runner = CliRunner()
    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output
    for path in _all_commands(main):
        result = runner.invoke(main, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage:" in result.output


def test_schema_apply_then_print(tmp_path: Path) -> None:
    dsn = "chdb://" + str(tmp_path / "s")
    cmd = [sys.executable, "-m", "tailwatch", "schema", "apply", "--store", dsn]
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "applied  collectors v1 otel_traces" in first.stdout
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0 and second.stdout.startswith("0 applied")
    printed = CliRunner().invoke(main, ["schema", "print", "--cluster", "c1"])
    assert printed.exit_code == 0
    assert "ON CLUSTER `c1`" in printed.output and "Distributed(" in printed.output


def test_bad_dsn_is_one_line_naming_where_it_came_from() -> None:
    result = CliRunner().invoke(main, ["schema", "apply", "--store", "mysql://x"])
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert line.startswith(
        "tailwatch: error: invalid configuration: store: store DSN 'mysql://x' is not supported"
    )
    assert line.endswith("(--store)")
    from_env = CliRunner().invoke(main, ["schema", "apply"], env={"TAILWATCH_STORE": "mysql://y"})
    assert from_env.exit_code == 2
    assert from_env.output.strip().endswith("(environment TAILWATCH_STORE)"), from_env.output


def test_read_commands_do_not_create_a_store_where_none_is(tmp_path: Path) -> None:
    # Regression: `analyze --store chdb:///nonexistent/dir/store` created that directory and
    # reported an empty analysis; the alert list and the dashboard export did the same.
    missing = tmp_path / "nonexistent" / "dir" / "store"
    window = ["--start", "2026-12-01T00:00:00Z", "--end", "2026-12-02T00:00:00Z"]
    for args in (
        ["analyze", *window],
        ["alerts", "list"],
        ["dashboard", "export", "--out", str(tmp_path / "out"), *window],
    ):
        result = CliRunner().invoke(main, [*args, "--store", f"chdb://{missing}"])
        assert result.exit_code == 2, (args, result.output)
        assert f"no store at chdb://{missing}" in result.output and "tailwatch ingest" in result.output
    assert not (tmp_path / "nonexistent").exists()


def test_an_empty_window_says_what_the_store_holds(tmp_path: Path) -> None:
    from collectors.spans import SpanRow, insert_spans, new_span_id, new_trace_id
    from storage import ensure_schema, open_store

    dsn = f"chdb://{tmp_path / 'store'}"
    with open_store(dsn) as store:
        ensure_schema(store)
        spans = [
            SpanRow(
                trace_id=new_trace_id(),
                span_id=new_span_id(),
                name="GET /",
                start_ns=1_764_547_200_000_000_000 + i * 60_000_000_000,  # 2025-12-01 00:00 UTC on
                duration_ns=1_000_000,
                kind="Server",
                service="api",
            )
            for i in range(3)
        ]
        insert_spans(store, spans)
    window = ["--start", "2026-12-01T00:00:00Z", "--end", "2026-12-02T00:00:00Z"]
    result = CliRunner().invoke(main, ["analyze", "--store", dsn, *window, "--format", "table"])
    assert result.exit_code == 0, result.output
    assert (
        "no requests, jobs or model calls in 2026-12-01 00:00 .. 2026-12-02 00:00 UTC; "
        "the store holds 3 spans from 2025-12-01 00:00 to 2025-12-01 00:02 UTC"
    ) in result.output


def test_evaluate_at_far_in_the_future_is_refused_unless_forced(tmp_path: Path) -> None:
    """an --at hours ahead would resolve real alerts and notify the resolutions."""
    from datetime import timedelta

    from storage import utc_now

    dsn = "chdb://" + str(tmp_path / "s")
    ahead = (utc_now() + timedelta(hours=2, minutes=30)).isoformat()
    result = CliRunner().invoke(main, ["alerts", "evaluate", "--store", dsn, "--at", ahead])
    assert result.exit_code == 2
    [line] = result.output.strip().splitlines()
    assert line.startswith("tailwatch: error: --at ") and "2.5 h in the future" in line
    assert "resolve every alert" in line and "--force" in line
    assert not (tmp_path / "s").exists()  # refused before touching the store
    assert CliRunner().invoke(main, ["schema", "apply", "--store", dsn]).exit_code == 0
    near = (utc_now() + timedelta(minutes=2)).isoformat()
    assert CliRunner().invoke(main, ["alerts", "evaluate", "--store", dsn, "--at", near]).exit_code == 0
    forced = CliRunner().invoke(main, ["alerts", "evaluate", "--store", dsn, "--at", ahead, "--force"])
    assert forced.exit_code == 0, forced.output
    assert "evaluated " in forced.output


def test_deliver_without_the_notifier_says_it_is_not_configured(tmp_path: Path) -> None:
    """rows queued for the webhook, drained without --webhook: no "attempts=0 retry at"."""
    from slo_rules import WebhookConfig
    from slo_rules.outbox import enqueue
    from storage import ensure_schema, open_store
    from tests.slo_rules.test_delivery import _notification

    dsn = "chdb://" + str(tmp_path / "s")
    store = open_store(dsn)
    try:
        ensure_schema(store)
        webhook = WebhookConfig("http://127.0.0.1:9/hook", name="webhook")
        enqueue(store, [(webhook, _notification(1)), (webhook, _notification(2))])
    finally:
        store.close()
    result = CliRunner().invoke(main, ["alerts", "deliver", "--store", dsn])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("delivery: 0 attempted") and "2 for notifiers not configured here" in lines[0]
    assert lines[1] == (
        "no webhook notifier named 'webhook' is configured for 2 pending notifications: pass --webhook "
        "URL (or set TAILWATCH_WEBHOOK_URL); they stay queued until then"
    )
    assert all("not attempted: no webhook notifier named 'webhook' is configured" in x for x in lines[2:])
    assert len(lines) == 4 and "attempts=0" not in result.output and "retry at" not in result.output


def test_schema_apply_ttl_days_sets_the_ttl_of_existing_span_tables(tmp_path: Path) -> None:
    """on an existing store --ttl-days changed nothing ("0 applied, 13 already present")."""
    from storage import open_store

    dsn = "chdb://" + str(tmp_path / "s")
    assert CliRunner().invoke(main, ["schema", "apply", "--store", dsn]).exit_code == 0
    result = CliRunner().invoke(main, ["schema", "apply", "--store", dsn, "--ttl-days", "7"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[:2] == [
        "ttl      otel_traces: rows older than 7 days are dropped "
        "(TTL toDateTime(Timestamp) + toIntervalDay(7))",
        "ttl      otel_traces_trace_id_ts: rows older than 7 days are dropped "
        "(TTL toDateTime(Start) + toIntervalDay(7))",
    ]
    assert lines[2].startswith("0 applied, ")
    store = open_store(dsn)
    try:
        ddl = dict(
            store.query_rows(
                "SELECT name, create_table_query FROM system.tables WHERE database = currentDatabase() "
                "AND name IN ('otel_traces', 'otel_traces_trace_id_ts')"
            )
        )
    finally:
        store.close()
    assert "TTL toDateTime(Timestamp) + toIntervalDay(7)" in ddl["otel_traces"]
    assert "TTL toDateTime(Start) + toIntervalDay(7)" in ddl["otel_traces_trace_id_ts"]


def test_serve_logs_a_final_stopped_line(tmp_path: Path) -> None:
    """The last line `serve` logs on SIGTERM says it stopped."""
    import json
    import signal
    import time

    store = tmp_path / "s"
    cmd = [sys.executable, "-m", "tailwatch", "serve", "--store", f"chdb://{store}"]
    cmd += ["--otlp-http", "127.0.0.1:0", "--otlp-grpc", "off", "--log-format", "json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (store / "tailwatch-service.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, (
                proc.stderr.read() if proc.stderr else ""
            )
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    messages = [json.loads(line)["message"] for line in err.splitlines() if line.strip()]
    assert messages[-2:] == ["SIGTERM received: stopping", "stopped"]


def test_read_commands_use_the_config_file_store_and_create_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Read commands once ignored tailwatch.toml's `store` and created $PWD/.tailwatch/store.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TAILWATCH_STORE", raising=False)
    monkeypatch.delenv("TAILWATCH_CONFIG", raising=False)
    wanted = tmp_path / "from-config" / "store"
    (tmp_path / "tailwatch.toml").write_text(f'store = "chdb://{wanted}"\n')
    window = ["--start", "2026-11-01T00:00:00Z", "--end", "2026-11-01T01:00:00Z"]
    for command in (["analyze", *window], ["alerts", "list"]):
        result = CliRunner().invoke(main, command)
        assert result.exit_code == 2, result.output
        assert f"no store at chdb://{wanted}" in result.output
    assert not (tmp_path / ".tailwatch").exists() and not wanted.exists()


def test_an_unreachable_server_is_one_line_naming_the_cause() -> None:
    # Once: a stray "Unexpected Http Driver Exception" line and a urllib3 report with the cause
    # ("Connection refused") buried inside.
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tailwatch",
            "analyze",
            "--store",
            "http://127.0.0.1:9/default",
            "--start",
            "2026-11-01T00:00:00Z",
            "--end",
            "2026-11-01T01:00:00Z",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "tailwatch: error: store http://default@127.0.0.1:9/default could not be reached: connection "
        "refused (is ClickHouse listening on 127.0.0.1:9?)"
    ]
