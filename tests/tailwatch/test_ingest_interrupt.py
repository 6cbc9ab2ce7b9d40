"""Ctrl-C during `tailwatch ingest FILE...` (issue 39): once "Aborted!" and nothing else; now what is
committed, what is left and that re-running is safe, exit 130 — checked against the store."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from storage import open_store
from tailwatch.cli import main

BASE_NS = 1_764_547_200_000_000_000  # 2025-12-01 00:00 UTC
SPANS_PER_LINE = 100


def _write_jsonl(path: Path, lines: int, first: int) -> int:
    """OTLP/JSON lines, ``SPANS_PER_LINE`` server spans a line (one trace each), ids from ``first``."""
    with path.open("w", encoding="utf-8") as out:
        n = first
        for _ in range(lines):
            spans = []
            for _ in range(SPANS_PER_LINE):
                start = BASE_NS + n * 1_000_000
                spans.append(
                    {
                        "traceId": f"{n:032x}",
                        "spanId": f"{n:016x}",
                        "name": "GET /chat",
                        "kind": 2,
                        "startTimeUnixNano": str(start),
                        "endTimeUnixNano": str(start + 50_000_000),
                    }
                )
                n += 1
            resource = {"attributes": [{"key": "service.name", "value": {"stringValue": "api"}}]}
            body = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": spans}]}]}
            out.write(json.dumps(body) + "\n")
    return lines * SPANS_PER_LINE


def _counts(dsn: str) -> tuple[int, int]:
    """Rows in otel_traces, and distinct (TraceId, SpanId)."""
    with open_store(dsn) as store:
        [(rows, unique)] = store.query_rows("SELECT count(), uniqExact(TraceId, SpanId) FROM otel_traces")
    return int(rows), int(unique)


def test_ctrl_c_reports_what_is_committed_and_a_rerun_counts_each_span_once(tmp_path: Path) -> None:
    first, big, last = tmp_path / "first.jsonl", tmp_path / "big.jsonl", tmp_path / "last.jsonl"
    total = _write_jsonl(first, 10, 1)
    total += _write_jsonl(big, 300, 10_000)
    total += _write_jsonl(last, 10, 100_000)
    dsn = f"chdb://{tmp_path / 'store'}"
    args = ["ingest", "--store", dsn, "--batch-rows", "2000", str(first), str(big), str(last)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "tailwatch", *args, "--progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=tmp_path,
    )
    try:
        # Ctrl-C once the progress bar (bytes of all three files) has passed a fifth: inside big.jsonl.
        assert proc.stderr is not None
        seen = b""
        deadline = time.monotonic() + 60
        while not any(int(p) >= 20 for p in re.findall(rb"(\d+)%\|", seen)):
            chunk = os.read(proc.stderr.fileno(), 4096)
            assert chunk and time.monotonic() < deadline, seen.decode(errors="replace")
            seen += chunk
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = (seen + err).decode()
    assert proc.returncode == 130, stderr
    assert "Aborted!" not in stderr and out == b""
    lines = [
        line.removeprefix("tailwatch: ") for line in stderr.splitlines() if line.startswith("tailwatch: ")
    ]
    said = re.fullmatch(
        rf"interrupted: ([\d,]+) spans committed to the store {re.escape(dsn)}: "
        rf"{re.escape(str(first))} whole \(1,000 spans\), "
        rf"{re.escape(str(big))} in part \(its first ([\d,]+) spans\)",
        lines[-3],
    )
    assert said is not None, stderr
    committed, of_big = (int(g.replace(",", "")) for g in said.groups())
    assert committed == 1_000 + of_big and 0 < of_big < 30_000
    assert lines[-2] == f"not ingested whole: {big} {last}"
    assert lines[-1] == (
        "re-running the same command is safe: a span inserted again is a duplicate row of the same "
        "(TraceId, SpanId), which every analysis counts once; to insert fewer duplicate rows, run it "
        f"with only the files not ingested whole: {big} {last}"
    )
    # What it said is what the store holds.
    assert _counts(dsn) == (committed, committed)

    again = CliRunner().invoke(main, [*args, "--no-progress"])
    assert again.exit_code == 0, again.output
    assert f"ingested {total} spans (0 rejected) from 3 files" in again.output
    assert _counts(dsn) == (total + committed, total)
    window = ["--start", "2025-12-01T00:00:00Z", "--end", "2025-12-01T00:05:00Z"]
    analysed = CliRunner().invoke(main, ["analyze", "--store", dsn, *window])
    assert analysed.exit_code == 0, analysed.output
    [hot] = json.loads(analysed.stdout)["hot_path"]
    assert hot["requests"] == total  # every span once, the duplicates of the re-run included


def test_an_insert_cut_short_is_said_to_be_uncertain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second Ctrl-C (here: a KeyboardInterrupt inside the second insert) stops at once."""
    from collectors.writer import StoreSpanWriter

    path = tmp_path / "spans.jsonl"
    total = _write_jsonl(path, 50, 1)
    write = StoreSpanWriter.write
    calls: list[int] = []

    def interrupted_second(self: StoreSpanWriter, table: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return write(self, table)

    monkeypatch.setattr(StoreSpanWriter, "write", interrupted_second)
    dsn = f"chdb://{tmp_path / 'store'}"
    result = CliRunner().invoke(main, ["ingest", "--store", dsn, "--batch-rows", "1000", str(path)])
    assert result.exit_code == 130, result.output
    assert (
        f"interrupted: 1,000 spans committed to the store {dsn}: {path} in part (its first 1,000 spans)"
        in (result.output)
    )
    assert "1,000 more spans were being inserted when it stopped: they may or may not be in the store" in (
        result.output
    )
    assert f"not ingested whole: {path}" in result.output
    assert _counts(dsn) == (1_000, 1_000) and total == 5_000


def test_ctrl_c_through_the_running_service_counts_what_it_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While `serve` owns the store, what is committed is what its receiver acknowledged (spooled)."""
    from tailwatch.config import load_config
    from tailwatch.remote import RemoteService
    from tailwatch.service import Service

    store_path = tmp_path / "store"
    config = tmp_path / "tw.toml"
    config.write_text(
        f'store = "chdb://{store_path}"\n[receiver]\notlp_http = "127.0.0.1:0"\notlp_grpc = "off"\n'
        '[ingest]\nflush_interval = "100ms"\n'
        '[schedule]\nrollup = "off"\nanalyze = "off"\nevaluate = "off"\ndashboards = "off"\n'
    )
    path = tmp_path / "spans.jsonl"
    _write_jsonl(path, 10, 1)
    export = RemoteService._export
    exports: list[int] = []

    def ctrl_c_after_the_third(self: RemoteService, request: object, spans: int, result: object) -> None:
        export(self, request, spans, result)  # type: ignore[arg-type]
        exports.append(spans)
        if len(exports) == 3:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, taken by the command's handler

    monkeypatch.setattr(RemoteService, "_export", ctrl_c_after_the_third)
    service = Service(load_config(config, env={}))
    service.start()
    try:
        args = ["ingest", "--store", f"chdb://{store_path}", "--batch-rows", "100", str(path)]
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 130, result.output
        assert (
            f"interrupted: 300 spans committed to the tailwatch service at {service.api_url} (acknowledged "
            f"into its spool): {path} in part (its first 300 spans)"
        ) in result.output
        assert f"not ingested whole: {path}" in result.output and exports == [100, 100, 100]
        assert service.pipeline is not None and service.pipeline.flush(30)
        assert service.store is not None
        assert service.store.query_value("SELECT count() FROM otel_traces") == 300
    finally:
        service.stop()
