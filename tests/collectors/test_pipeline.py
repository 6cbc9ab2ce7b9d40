"""Batching, backpressure, the spool and replay, on a real store."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pyarrow as pa
import pytest

from collectors.otlp_decode import request_to_arrow
from collectors.pipeline import IngestPipeline, spool_record
from collectors.receivers import Receivers
from collectors.settings import PipelineSettings, SettingsError
from collectors.spool import Spool, table_to_ipc
from collectors.writer import StoreSpanWriter
from storage import Store
from tests.collectors.otlp_samples import make_request


def _table(n: int, seed: int) -> pa.Table:
    return request_to_arrow(make_request(n, seed=seed)[0]).table


class SlowWriter:
    """The real store writer, throttled: a store that accepts fewer spans than clients send."""

    def __init__(self, store: Store, delay_s: float) -> None:
        self.inner = StoreSpanWriter(store)
        self.delay_s = delay_s
        self.batches: list[int] = []

    def write(self, table: pa.Table) -> None:
        time.sleep(self.delay_s)
        self.inner.write(table)
        self.batches.append(table.num_rows)

    def present(self, table: pa.Table) -> np.ndarray:
        return self.inner.present(table)


class FlakyWriter(SlowWriter):
    def __init__(self, store: Store, failures: int) -> None:
        super().__init__(store, 0.0)
        self.failures = failures

    def write(self, table: pa.Table) -> None:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("store unavailable")
        super().write(table)


def _count(store: Store) -> tuple[int, int]:
    row = store.query_rows("SELECT count(), uniqExact(TraceId, SpanId) FROM otel_traces")[0]
    return int(row[0]), int(row[1])


def test_settings_validate() -> None:
    with pytest.raises(SettingsError, match="max_queue_spans"):
        PipelineSettings(batch_rows=100, max_queue_spans=10)
    with pytest.raises(SettingsError, match="flush_interval_s"):
        PipelineSettings(flush_interval_s=0)


def test_batches_by_size_and_by_time(store: Store, tmp_path: Path) -> None:
    writer = SlowWriter(store, 0.0)
    p = IngestPipeline(
        store,
        PipelineSettings(batch_rows=1_000, flush_interval_s=3.0, spool_dir=tmp_path / "s"),
        writer=writer,
    )
    p.start()

    def wait_for(rows: int) -> float:
        started = time.monotonic()
        while sum(writer.batches) < rows and time.monotonic() - started < 20:
            time.sleep(0.01)
        return time.monotonic() - started

    try:
        for i in range(10):
            assert p.submit(_table(250, i)).ok
        wait_for(2_000)
        assert writer.batches[:2] == [1_000, 1_000]  # size-triggered, long before the interval
        assert p.submit(_table(10, 99)).ok
        waited = wait_for(2_510)
        assert writer.batches[-1] == 510  # the rest went out on the timer
        assert waited > 1.0
    finally:
        p.stop()
    assert _count(store) == (2_510, 2_510)
    assert list((tmp_path / "s").glob("seg-*")) == []  # everything inserted → spool empty


def test_without_spool_the_ack_waits_for_the_insert(store: Store) -> None:
    p = IngestPipeline(store, PipelineSettings(batch_rows=100, flush_interval_s=0.05))
    p.start()
    try:
        assert p.submit(_table(30, 1)).ok
        assert _count(store) == (30, 30)  # no flush needed: already inserted when acknowledged
    finally:
        p.stop()


def test_failed_inserts_are_retried_not_lost(store: Store, tmp_path: Path) -> None:
    writer = FlakyWriter(store, failures=3)
    p = IngestPipeline(
        store, PipelineSettings(flush_interval_s=0.02, spool_dir=tmp_path / "s"), writer=writer
    )
    p.start()
    try:
        assert p.submit(_table(40, 2)).ok
        assert p.flush(15)
        assert p.metrics.insert_errors._value.get() == 3
    finally:
        p.stop()
    assert _count(store) == (40, 40)


def test_overload_gets_429_memory_stays_bounded_and_acked_spans_are_stored(
    store: Store, tmp_path: Path
) -> None:
    settings = PipelineSettings(
        batch_rows=1_000, flush_interval_s=0.05, max_queue_spans=3_000, spool_dir=tmp_path / "s"
    )
    writer = SlowWriter(store, delay_s=0.15)  # ~6k spans/s at most
    p = IngestPipeline(store, settings, writer=writer)
    p.start()
    receivers = Receivers(p, http="127.0.0.1:0", grpc=None)
    receivers.start()
    url = f"http://127.0.0.1:{receivers.http_port}/v1/traces"
    acked: set[str] = set()
    statuses: list[int] = []
    peak_queue = 0
    lock = threading.Lock()
    stop = threading.Event()
    rss_before = psutil.Process().memory_info().rss

    def client(worker: int) -> None:
        with httpx.Client(timeout=30) as http:
            seed = worker * 10_000
            while not stop.is_set():
                seed += 1
                request, expected = make_request(512, seed=seed)
                r = http.post(
                    url,
                    content=request.SerializeToString(),
                    headers={"Content-Type": "application/x-protobuf"},
                )
                with lock:
                    statuses.append(r.status_code)
                    if r.status_code == 200:
                        acked.update(e.trace_id + e.span_id for e in expected)
                    else:
                        assert r.status_code in (429, 503)
                        assert r.headers["Retry-After"] == "1"

    threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        peak_queue = max(peak_queue, p.queue_depth)
        time.sleep(0.005)
    stop.set()
    for t in threads:
        t.join()
    rss_growth = psutil.Process().memory_info().rss - rss_before
    receivers.stop()
    assert p.stop(timeout_s=60)
    assert statuses.count(429) > 0 and statuses.count(200) > 0
    assert peak_queue <= settings.max_queue_spans
    assert rss_growth < 300 * 1024 * 1024
    stored = {
        t + s for t, s in store.query_rows("SELECT TraceId, SpanId FROM otel_traces GROUP BY TraceId, SpanId")
    }
    assert stored == acked


def test_spool_ignores_a_torn_tail_and_releases_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s", segment_bytes=1)
    assert spool.open() == []
    tickets = [spool.append(table_to_ipc(_table(5, i))) for i in range(3)]
    for t in tickets:
        spool.sync(t)
    assert len({t.segment for t in tickets}) == 3  # tiny segments rotate on every record
    spool.release({tickets[0].segment: 1})
    assert len(list((tmp_path / "s").glob("seg-*"))) == 2
    with pytest.raises(Exception, match="in use"):
        Spool(tmp_path / "s").open()
    # Simulate a crash: the process dies mid-write of a record.
    last = sorted((tmp_path / "s").glob("seg-*"))[-1]
    with last.open("ab") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00")
    segments = sorted((tmp_path / "s").glob("seg-*"))
    records = [list(Spool.read_segment(s)) for s in segments]
    assert [len(r) for r in records] == [1, 1]
    assert pa.ipc.open_stream(records[1][0]).read_all().num_rows == 5


def test_replay_inserts_spooled_spans_once(store: Store, tmp_path: Path) -> None:
    spool_dir = tmp_path / "s"
    already, pending = _table(20, 1), _table(30, 2)
    raw_request = make_request(7, seed=3)[0].SerializeToString()
    # A previous run spooled three exports (Arrow and raw protobuf) but crashed after inserting
    # only the first one.
    StoreSpanWriter(store).write(already)
    crashed = Spool(spool_dir)
    crashed.open()
    for record in (spool_record(already), spool_record(pending), spool_record(raw=raw_request)):
        crashed.sync(crashed.append(record))
    crashed.close()  # records stay: nothing was released; the dead process's lock goes away
    p = IngestPipeline(store, PipelineSettings(spool_dir=spool_dir, flush_interval_s=0.05))
    p.start()
    p.stop()
    assert p.replayed == 37
    assert _count(store) == (57, 57)
    assert list(spool_dir.glob("seg-*")) == []


def test_present_finds_stored_spans_across_many_traces(store: Store) -> None:
    # More trace ids than one query parameter takes on a server: the lookup runs in slices.
    stored, fresh = _table(5_000, 11), _table(300, 12)
    writer = StoreSpanWriter(store)
    writer.write(stored)
    both = pa.concat_tables([stored, fresh])
    mask = writer.present(both)
    assert mask.sum() == 5_000 and mask[:5_000].all() and not mask[5_000:].any()


def test_a_full_disk_mid_append_loses_no_acknowledged_span(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression (full disk): a write that fails part-way left its torn bytes in the segment, the
    # records acknowledged after space returned followed them, and replay stopped at the tear.
    # The disk fills once, mid-record: the file layer writes half of it and reports ENOSPC.
    import errno
    import os

    import collectors.spool as spool_module

    spool_dir = tmp_path / "s"
    spool = Spool(spool_dir)
    spool.open()
    before, after, failed = _table(1_000, 21), _table(1_000, 22), _table(500, 23)
    spool.sync(spool.append(spool_record(before)))
    real_write = os.write

    def disk_full_once(fd: int, data: bytes) -> int:
        monkeypatch.setattr(spool_module.os, "write", real_write)
        real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(spool_module.os, "write", disk_full_once)
    with pytest.raises(Exception, match="No space left"):
        spool.append(spool_record(failed))  # not acknowledged: the receiver answers a retryable error
    spool.sync(spool.append(spool_record(after)))  # space is back: acknowledged
    spool.close()  # the process stops with both records still spooled (SIGTERM before the insert)

    p = IngestPipeline(store, PipelineSettings(spool_dir=spool_dir, flush_interval_s=0.05))
    p.start()
    p.stop()
    assert p.replayed == 2_000
    assert _count(store) == (2_000, 2_000)


def test_replay_resumes_after_a_corrupt_record_and_reports_its_offset(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = Spool(tmp_path / "s")
    spool.open()
    payloads = [table_to_ipc(_table(3, i)) for i in range(3)]
    tickets = [spool.append(p) for p in payloads]
    spool.sync(tickets[-1])
    spool.close()
    segment = next((tmp_path / "s").glob("seg-*"))
    data = bytearray(segment.read_bytes())
    second = 8 + len(payloads[0])
    data[second + 8 + 10] ^= 0xFF  # damage the middle record's payload
    segment.write_bytes(bytes(data))
    with caplog.at_level("ERROR", logger="collectors.spool"):
        records = list(Spool.read_segment(segment))
    assert records == [payloads[0], payloads[2]]
    assert f"at byte {second}" in caplog.text


def test_a_failing_spool_release_does_not_stop_the_inserts(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression: an exception from Spool.release (outside the insert's try) ended the insert thread
    # silently; later exports were still acknowledged (spooled) but never inserted, /readyz said 200.
    p = IngestPipeline(store, PipelineSettings(flush_interval_s=0.05, spool_dir=tmp_path / "s"))
    p.start()
    try:
        assert p._spool is not None
        real_release = p._spool.release
        calls = {"n": 0}

        def release_fails_once(counts: dict[int, int]) -> None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise OSError(5, "Input/output error")
            real_release(counts)

        monkeypatch.setattr(p._spool, "release", release_fails_once)
        assert p.submit(_table(100, 31)).status == "accepted"
        assert p.flush(10)
        assert p.submit(_table(100, 32)).status == "accepted"
        assert p.flush(10)
        assert calls["n"] >= 2 and p.ready
    finally:
        p.stop()
    assert _count(store) == (200, 200)


def test_an_unexpected_writer_error_restarts_the_loop_and_loses_nothing(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = IngestPipeline(store, PipelineSettings(flush_interval_s=0.05, spool_dir=tmp_path / "s"))
    real_take = p._take_batch
    calls = {"n": 0}

    def take_fails_once() -> object:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("bug in the batching")
        return real_take()

    monkeypatch.setattr(p, "_take_batch", take_fails_once)
    p.start()
    try:
        assert p.submit(_table(50, 33)).status == "accepted"
        assert p.flush(10)
        assert p.ready and p._thread is not None and p._thread.is_alive()
    finally:
        p.stop()
    assert _count(store) == (50, 50)
