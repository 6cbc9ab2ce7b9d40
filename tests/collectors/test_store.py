from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from collectors.errors import StoreError
from collectors.store import Store, default_store_dsn, open_store, parse_dsn, resolve_dsn


def test_parameters_are_bound_server_side(store: Store) -> None:
    hostile = "x'); DROP TABLE otel_traces; --\"\\"
    assert store.query_value("SELECT {v:String}", {"v": hostile}) == hostile
    store.command(
        "CREATE TABLE tailwatch_probe (v String) ENGINE = MergeTree ORDER BY v",
    )
    store.command("INSERT INTO tailwatch_probe VALUES ({v:String})", {"v": hostile})
    assert store.query_rows("SELECT v FROM tailwatch_probe WHERE v = {v:String}", {"v": hostile}) == [
        (hostile,)
    ]
    assert store.table_exists("otel_traces")


def test_dsn_forms() -> None:
    loc = parse_dsn("https://alice:s%40cret@ch.example.com:8443/traces")
    assert (loc.host, loc.port, loc.username, loc.password, loc.database) == (
        "ch.example.com",
        8443,
        "alice",
        "s@cret",
        "traces",
    )
    assert "s@cret" not in loc.redacted()
    assert parse_dsn("http://localhost").port == 8123
    assert parse_dsn("chdb:///var/lib/tw").path == "/var/lib/tw"
    with pytest.raises(StoreError, match="absolute path"):
        parse_dsn("chdb://relative/path")
    with pytest.raises(StoreError, match="not supported"):
        parse_dsn("postgres://x")


def test_resolution_order(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    assert resolve_dsn(None) == default_store_dsn() == "chdb://" + str(tmp_path / ".tailwatch/store")
    monkeypatch.setenv("TAILWATCH_STORE", "chdb:///from/env")
    assert resolve_dsn(None) == "chdb:///from/env"
    assert resolve_dsn("chdb:///from/arg") == "chdb:///from/arg"


def test_second_process_gets_one_clear_line(store: Store, store_dsn: str) -> None:
    script = textwrap.dedent(
        f"""
        from tailwatch.cli import main
        main(["schema", "apply", "--store", {store_dsn!r}])
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines == [
        f"tailwatch: error: store {store_dsn} is in use by another process; stop that process "
        "(e.g. `tailwatch serve`) or point this command at its HTTP API or a ClickHouse server with --store"
    ]
    assert "Traceback" not in proc.stderr


def test_unreachable_server_is_a_clear_error() -> None:
    with pytest.raises(StoreError, match="could not be reached"):
        open_store("http://127.0.0.1:9/default", connect_timeout=1)


def test_closed_store_refuses_queries(store_dsn: str) -> None:
    s = open_store(store_dsn)
    s.close()
    with pytest.raises(StoreError, match="closed"):
        s.query_value("SELECT 1")
