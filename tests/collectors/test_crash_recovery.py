"""``kill -9`` of a collecting ``tailwatch collect`` process, then a restart: nothing acknowledged is lost.

The receiver runs in subprocesses (one embedded store per process); the test opens the store only
after the last collector has exited.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx

from collectors.spans import read_spans
from storage import open_store
from tests.collectors.otlp_samples import make_request
from tests.collectors.processes import start_collector


def test_kill_9_during_ingest_then_restart_keeps_every_acknowledged_span(tmp_path: Path) -> None:
    dsn = "chdb://" + str(tmp_path / "store")
    # Small batches with a long interval: at the kill some spans are inserted, most only spooled.
    proc, port, _ = start_collector(dsn, "--batch-rows", "2000", "--flush-interval", "30")
    url = f"http://127.0.0.1:{port}/v1/traces"
    acked: set[str] = set()
    lock = threading.Lock()
    killed = threading.Event()

    def client(worker: int) -> None:
        with httpx.Client(timeout=10) as http:
            for i in range(200):
                if killed.is_set():
                    return
                request, expected = make_request(300, seed=worker * 1000 + i)
                try:
                    r = http.post(
                        url,
                        content=request.SerializeToString(),
                        headers={"Content-Type": "application/x-protobuf"},
                    )
                except httpx.HTTPError:
                    return  # the connection died with the process: not acknowledged
                if r.status_code == 200:
                    with lock:
                        acked.update(e.trace_id + e.span_id for e in expected)

    threads = [threading.Thread(target=client, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with lock:
            if len(acked) >= 9_000:
                break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)  # mid-stream: requests are in flight
    killed.set()
    proc.wait(30)
    for t in threads:
        t.join()
    assert len(acked) >= 9_000
    assert any((tmp_path / "store.spool").glob("seg-*"))

    proc, _, lines = start_collector(dsn)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    assert any("replayed" in line for line in lines)

    with open_store(dsn) as store:
        total, distinct = store.query_rows("SELECT count(), uniqExact(TraceId, SpanId) FROM otel_traces")[0]
        stored = {t + s for t, s in store.query_rows("SELECT TraceId, SpanId FROM otel_traces")}
        deduped = read_spans(store).num_rows
    assert acked <= stored  # every acknowledged span survived
    assert total == distinct == deduped  # and exactly once: replay skipped what was already inserted
    assert list((tmp_path / "store.spool").glob("seg-*")) == []


def test_sigterm_flushes_the_queue(tmp_path: Path) -> None:
    dsn = "chdb://" + str(tmp_path / "store")
    proc, port, _ = start_collector(dsn, "--flush-interval", "60", "--no-spool", "--batch-rows", "100000")
    request, expected = make_request(50)
    result: list[int] = []

    def send() -> None:  # without a spool the 200 waits for the insert, which SIGTERM triggers
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/traces",
            content=request.SerializeToString(),
            headers={"Content-Type": "application/x-protobuf"},
            timeout=60,
        )
        result.append(r.status_code)

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    sender.join(60)
    assert result == [200]
    with open_store(dsn) as store:
        assert store.query_value("SELECT count() FROM otel_traces") == len(expected)
