from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import polars as pl
import pytest

from storage import Store, StoreError, default_store_dsn, open_store, parse_dsn
from tailwatch.config import resolve_dsn


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
    # Never "point --store at its HTTP API": the OTLP port is no ClickHouse.
    assert lines == [
        f"tailwatch: error: store {store_dsn} is in use by another process and no tailwatch service "
        "API is announced for it (tailwatch-service.json missing or stale); stop that process, or run "
        "`tailwatch serve` with OTLP/HTTP enabled so commands can go through its API"
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


def test_embedded_arrow_results_are_not_compressed(store: Store) -> None:
    # Results stay in the process: the session turns off Arrow's per-batch LZ4, and the frames read
    # back the same either way.
    assert store.query_value("SELECT getSetting('output_format_arrow_compression_method')") == "none"
    sql = "SELECT number AS n, toString(number) AS s FROM numbers(100000)"
    frame = store.query_polars(sql)
    packed = store.query_polars(sql, settings={"output_format_arrow_compression_method": "lz4_frame"})
    assert frame.equals(packed) and frame["n"].sum() == 4999950000


def test_key_set_holds_the_keys_for_in_and_is_dropped_after(store: Store) -> None:
    # Keys across the whole UInt64 range (64-bit hashes use the top bit), with a duplicate.
    keys = pl.Series([0, 1, 2**63, 2**64 - 1, 12345678901234567890, 1], dtype=pl.UInt64)
    probe = [0, 1, 2, 2**63, 2**63 + 1, 2**64 - 1, 12345678901234567890]
    with store.key_set(keys) as name:
        found = store.query_rows(
            f"SELECT x FROM (SELECT arrayJoin({{probe:Array(UInt64)}}) AS x) WHERE x IN {name} ORDER BY x",
            {"probe": probe},
        )
        assert [x for (x,) in found] == [0, 1, 2**63, 12345678901234567890, 2**64 - 1]
        assert store.query_value(f"EXISTS TEMPORARY TABLE {name}") == 1
    assert store.query_value(f"EXISTS TEMPORARY TABLE {name}") == 0
    # An empty set matches nothing, and an error inside the block still drops the table.
    names: list[str] = []

    def fail_inside() -> None:
        with store.key_set(pl.Series([], dtype=pl.UInt64)) as empty_name:
            names.append(empty_name)
            assert store.query_value(f"SELECT count() FROM numbers(10) WHERE number IN {empty_name}") == 0
            raise RuntimeError("inside the block")

    with pytest.raises(RuntimeError, match="inside the block"):
        fail_inside()
    assert store.query_value(f"EXISTS TEMPORARY TABLE {names[0]}") == 0
