from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_bad_dsn_is_one_line() -> None:
    result = CliRunner().invoke(main, ["schema", "apply", "--store", "mysql://x"])
    assert result.exit_code == 2
    assert result.output.strip().startswith("tailwatch: error: store DSN 'mysql://x' is not supported")


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
