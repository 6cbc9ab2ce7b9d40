"""Hostile load on the OTLP/HTTP receiver: memory bounded in bytes, decode CPU bounded per body.

Every test runs the real receivers (uvicorn on loopback) and pipeline on a fresh store, with httpx
as the client, and measures what it asserts (times, RSS of this process, which also runs the
receiver). Figures from a 2-core machine are in the comments.
"""

from __future__ import annotations

import ctypes
import gc
import gzip
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import httpx
import psutil
import pyarrow as pa
import pytest

import collectors.receiver as receiver_module
from collectors.otlp_decode import (
    MAX_JSON_CONTAINERS,
    OtlpDecodeError,
    check_protobuf_shape,
    decode_json,
)
from collectors.pipeline import IngestPipeline
from collectors.receivers import Receivers
from collectors.settings import PipelineSettings, SettingsError
from storage import Store
from tests.collectors.otlp_samples import make_request
from tests.collectors.processes import start_collector
from tests.collectors.test_pipeline import FlakyWriter, SlowWriter

PB = {"Content-Type": "application/x-protobuf"}
JS = {"Content-Type": "application/json"}
GZ = {"Content-Encoding": "gzip"}
MiB = 1024 * 1024


def _rss() -> int:
    """This process's RSS, with freed heap returned to the OS first (glibc keeps it otherwise, and
    the figure would count garbage instead of what is held)."""
    gc.collect()
    with suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return int(psutil.Process().memory_info().rss)


class _PeakRss:
    """The highest RSS seen while the block runs, sampled every 5 ms."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        process = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, int(process.memory_info().rss))
            self._stop.wait(0.005)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def _serving(
    store: Store, settings: PipelineSettings, writer: Any = None
) -> Iterator[tuple[IngestPipeline, Receivers, str]]:
    pipeline = IngestPipeline(store, settings, writer=writer)
    pipeline.start()
    receivers = Receivers(pipeline, http="127.0.0.1:0", grpc=None)
    receivers.start()
    try:
        yield pipeline, receivers, f"http://127.0.0.1:{receivers.http_port}"
    finally:
        if isinstance(writer, FlakyWriter):
            writer.failures = 0  # the store recovers: what was acknowledged gets inserted
        receivers.stop()
        pipeline.stop(timeout_s=30)


def _held(receivers: Receivers) -> int:
    return int(receivers.app.state.inflight_bytes.held)


def _valid_export(url: str, seed: int, timeout: float = 10.0) -> tuple[int, float]:
    body = make_request(5, seed=seed)[0].SerializeToString()
    started = time.monotonic()
    r = httpx.post(f"{url}/v1/traces", content=body, headers=PB, timeout=timeout)
    return r.status_code, time.monotonic() - started


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _len_field(field: int, payload: bytes) -> bytes:
    return bytes([field << 3 | 2]) + _varint(len(payload)) + payload


@pytest.fixture(scope="module")
def json_bombs() -> list[bytes]:
    # ~34 MB of `{},` in ~33 KB of gzip: once as the resourceSpans array, once as a bare array.
    n = 34_000_000 // 3
    inner = b"{}," * n + b"{}"
    return [
        gzip.compress(b'{"resourceSpans":[' + inner + b"]}", 6),
        gzip.compress(b"[" + inner + b"]", 6),
    ]


def test_gzip_json_bombs_get_a_fast_400_and_do_not_starve_a_concurrent_export(
    store: Store, tmp_path: Path, json_bombs: list[bytes]
) -> None:
    assert all(len(b) < 100_000 for b in json_bombs)
    settings = PipelineSettings(flush_interval_s=0.05, spool_dir=tmp_path / "s")
    with _serving(store, settings) as (_, receivers, url):
        bomb_results: list[tuple[int, float]] = []

        def bomb(body: bytes) -> None:
            started = time.monotonic()
            r = httpx.post(f"{url}/v1/traces", content=body, headers={**JS, **GZ}, timeout=30)
            bomb_results.append((r.status_code, time.monotonic() - started))

        threads = [threading.Thread(target=bomb, args=(b,)) for b in json_bombs]
        for t in threads:
            t.start()
        time.sleep(0.05)  # the bombs are being decoded
        status, elapsed = _valid_export(url, seed=1)
        for t in threads:
            t.join(30)
        # Measured: each bomb answered 400 in ~0.3 s (was 130 s of CPU and 3.5 GB); the export
        # sent meanwhile in ~0.3 s (was 128 s).
        assert status == 200 and elapsed < 10.0
        assert [s for s, _ in bomb_results] == [400, 400]
        assert max(t for _, t in bomb_results) < 5.0
        r = httpx.post(f"{url}/v1/traces", content=json_bombs[0], headers={**JS, **GZ}, timeout=30)
        assert "more than 500000 objects and arrays" in r.json()["message"]
        assert _held(receivers) == 0


def test_json_container_limit_counts_outside_strings_only() -> None:
    at_limit = b'{"resourceSpans":[' + b",".join([b"{}"] * (MAX_JSON_CONTAINERS - 2)) + b"]}"
    assert len(decode_json(at_limit).resource_spans) == MAX_JSON_CONTAINERS - 2
    over = at_limit[:-2] + b",{}]}"
    with pytest.raises(OtlpDecodeError, match="objects and arrays"):
        decode_json(over)
    # Brackets inside a string value are text: a long prompt full of them is not refused.
    prompt = b'"' + b"{[" * MAX_JSON_CONTAINERS + b'"'
    request = decode_json(
        b'{"resourceSpans":[{"resource":{"attributes":[{"key":"p","value":{"stringValue":'
        + prompt
        + b"}}]}}]}"
    )
    assert len(request.resource_spans[0].resource.attributes[0].value.string_value) == 2 * MAX_JSON_CONTAINERS


def _empty_resources(n: int) -> bytes:
    return b"\x0a\x00" * n


def _empty_scopes(n: int) -> bytes:
    return _len_field(1, b"\x12\x00" * n)


def _empty_spans(n: int) -> bytes:
    return _len_field(1, _len_field(2, b"\x12\x00" * n))


@pytest.mark.parametrize(
    ("shape", "message", "max_s", "max_peak_mib"),
    [
        # Counted on the wire before upb's parse: nothing is allocated per element.
        (_empty_resources, "resource_spans", 1.5, 100),
        (_empty_scopes, "scope_spans", 1.5, 100),
        # Counted after the parse, which holds ~85 bytes per empty span for a moment (documented).
        (_empty_spans, "mostly empty spans", 4.0, 1024),
    ],
)
def test_small_gzip_protobuf_of_empty_elements_gets_a_fast_400(
    store: Store,
    tmp_path: Path,
    shape: Callable[[int], bytes],
    message: str,
    max_s: float,
    max_peak_mib: int,
) -> None:
    body = gzip.compress(shape(4_000_000), 9)  # 8 MB of 2-byte messages
    assert len(body) < 10_000
    settings = PipelineSettings(flush_interval_s=0.05, spool_dir=tmp_path / "s")
    with _serving(store, settings) as (_, receivers, url):
        rss_before = _rss()
        with _PeakRss() as rss:
            started = time.monotonic()
            r = httpx.post(f"{url}/v1/traces", content=body, headers={**PB, **GZ}, timeout=30)
            elapsed = time.monotonic() - started
        peak = (rss.peak - rss_before) / MiB
        # Measured: empty resources/scopes 0.1 s and peak RSS +20 MiB (was 2.6 s and +300 MB);
        # empty spans 0.7 s and +680 MiB (upb's parse).
        assert r.status_code == 400
        assert message in r.text
        assert elapsed < max_s
        assert peak < max_peak_mib, f"peak RSS grew by {peak:.0f} MiB"
        assert _valid_export(url, seed=2)[0] == 200
        assert _held(receivers) == 0


def _big_span_export(seed: int, size: int) -> bytes:
    request, _ = make_request(1, seed=seed)
    span = request.resource_spans[0].scope_spans[0].spans[0]
    span.attributes.add(key="gen_ai.prompt").value.string_value = "x" * size
    return request.SerializeToString()


def test_queue_is_bounded_in_bytes_while_inserts_fail(store: Store, tmp_path: Path) -> None:
    budget = 32 * MiB
    settings = PipelineSettings(flush_interval_s=0.05, max_queue_bytes=budget, spool_dir=tmp_path / "s")
    writer = FlakyWriter(store, failures=10**9)  # the store refuses every insert
    acked = 0
    with _serving(store, settings, writer) as (pipeline, _, url):
        bodies = [_big_span_export(i, 5 * MiB) for i in range(20)]
        rss_before = _rss()
        statuses = []
        peak = 0
        with httpx.Client(timeout=30) as http:
            for body in bodies:
                r = http.post(f"{url}/v1/traces", content=body, headers=PB)
                statuses.append(r.status_code)
                peak = max(peak, pipeline.queue_bytes)
                if r.status_code != 200:
                    assert r.status_code in (429, 503)
                    assert r.headers["Retry-After"] == "1"
            ready = http.get(f"{url}/readyz").status_code
        growth = _rss() - rss_before  # the request bodies (100 MiB) are the client's: still held
        del bodies
        acked = statuses.count(200)
        # Measured: 6 of 20 acknowledged (6 × 5 MiB), then 429; RSS +66-71 MiB (without the
        # byte bound all 20 were acknowledged and RSS grew by 145 MiB).
        assert 1 <= acked <= 7
        assert statuses[acked:] == [429] * (20 - acked)
        assert peak <= budget
        assert ready == 503
        assert growth < 100 * MiB, f"RSS grew by {growth / MiB:.0f} MiB"
    assert int(store.query_rows("SELECT count() FROM otel_traces")[0][0]) == acked


class _BlockedWriter(SlowWriter):
    """Inserts wait until released: the queue fills while the store looks healthy."""

    def __init__(self, store: Store) -> None:
        super().__init__(store, 0.0)
        self.release = threading.Event()

    def write(self, table: pa.Table) -> None:
        self.release.wait(30)
        super().write(table)


def test_readyz_reflects_the_byte_budget(store: Store, tmp_path: Path) -> None:
    writer = _BlockedWriter(store)
    settings = PipelineSettings(flush_interval_s=0.05, max_queue_bytes=MiB, spool_dir=tmp_path / "s")
    with _serving(store, settings, writer) as (pipeline, _, url):
        try:
            assert httpx.get(f"{url}/readyz").status_code == 200
            # The first export is taken although larger than the budget (the queue was empty).
            statuses = [
                httpx.post(f"{url}/v1/traces", content=_big_span_export(i, MiB), headers=PB).status_code
                for i in range(3)
            ]
            assert statuses == [200, 429, 429]
            assert pipeline.queue_depth == 1  # far below max_queue_spans: the bytes are the bound
            assert httpx.get(f"{url}/readyz").status_code == 503
        finally:
            writer.release.set()
        assert pipeline.flush(15)
        assert pipeline.queue_bytes == 0
        assert httpx.get(f"{url}/readyz").status_code == 200


def test_concurrent_garbage_uploads_are_bounded_in_flight(store: Store, tmp_path: Path) -> None:
    garbage = os.urandom(20 * MiB)
    settings = PipelineSettings(flush_interval_s=0.05, max_inflight_bytes=32 * MiB, spool_dir=tmp_path / "s")
    with _serving(store, settings) as (_, receivers, url):
        rss_before = _rss()
        statuses: list[int] = []
        retry_after: list[str] = []
        lock = threading.Lock()

        def chunks() -> Iterator[bytes]:  # sent as is: no client-side copy of the body
            view = memoryview(garbage)
            for offset in range(0, len(garbage), 1 << 16):
                yield bytes(view[offset : offset + (1 << 16)])

        def upload() -> None:
            headers = {**PB, "Content-Length": str(len(garbage))}
            r = httpx.post(f"{url}/v1/traces", content=chunks(), headers=headers, timeout=60)
            with lock:
                statuses.append(r.status_code)
                retry_after.append(r.headers.get("Retry-After", ""))

        threads = [threading.Thread(target=upload) for _ in range(8)]
        with _PeakRss() as rss:
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        growth = rss.peak - rss_before
        # Measured: 1 upload read and refused 400, the rest 429 (drained, not kept); peak RSS
        # +35-55 MiB (without the budget all 8 bodies were kept and decoded: +250 MiB).
        assert len(statuses) == 8
        assert set(statuses) <= {400, 429}
        assert statuses.count(429) >= 1 and statuses.count(400) >= 1
        assert all(r == "1" for s, r in zip(statuses, retry_after, strict=True) if s == 429)
        assert growth < 100 * MiB, f"peak RSS grew by {growth / MiB:.0f} MiB"
        assert _held(receivers) == 0
        assert _valid_export(url, seed=3)[0] == 200


def test_busy_decoders_answer_503_with_retry_after_instead_of_queuing(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(receiver_module, "DECODE_WAIT_S", 0.2)
    slots = receiver_module._DECODE_SLOTS
    settings = PipelineSettings(flush_interval_s=0.05, spool_dir=tmp_path / "s")
    with _serving(store, settings) as (_, receivers, url):
        taken = 0
        while slots.acquire(blocking=False):  # a hostile body in every decoder
            taken += 1
        try:
            status, elapsed = _valid_export(url, seed=4)
        finally:
            for _ in range(taken):
                slots.release()
        assert taken >= 2
        assert status == 503 and elapsed < 2.0
        assert _valid_export(url, seed=5)[0] == 200
        assert _held(receivers) == 0


def test_byte_bounds_have_defaults_and_validate() -> None:
    s = PipelineSettings()
    assert (s.max_queue_bytes, s.max_inflight_bytes) == (256 * MiB, 256 * MiB)
    with pytest.raises(SettingsError, match="max_queue_bytes"):
        PipelineSettings(max_queue_bytes=10)


def test_protobuf_shape_walk_passes_real_exports_and_counts_every_field() -> None:
    request, _ = make_request(3, seed=7)
    many = type(request)()
    for i in range(3):
        rs = many.resource_spans.add()
        rs.CopyFrom(request.resource_spans[0])
        rs.scope_spans.add().CopyFrom(request.resource_spans[0].scope_spans[0])
        rs.schema_url = f"https://opentelemetry.io/schemas/1.{i}"
    check_protobuf_shape(many.SerializeToString())
    check_protobuf_shape(b"")
    check_protobuf_shape(b"\x0a\x05\x00")  # truncated: upb's parse decides (400)
    # Unknown top-level fields cost a step each too, so junk cannot make the walk long.
    with pytest.raises(OtlpDecodeError, match="resource_spans"):
        check_protobuf_shape(b"\x10\x01" * 70_000)


def test_gunzip_is_capped_charged_and_keeps_multi_member_bodies() -> None:
    body = gzip.compress(b"a" * 3 * MiB) + gzip.compress(b"b" * 10)
    budget = receiver_module._ByteBudget(64 * MiB)
    charge = receiver_module._Charge(budget)
    assert receiver_module._gunzip_capped(body, 4 * MiB, charge) == b"a" * 3 * MiB + b"b" * 10
    assert budget.held == 3 * MiB + 10
    charge.release()
    assert budget.held == 0
    with pytest.raises(receiver_module._TooLarge):
        receiver_module._gunzip_capped(body, 2 * MiB)
    with pytest.raises(OtlpDecodeError, match="truncated"):
        receiver_module._gunzip_capped(body[: len(body) // 2], 4 * MiB)
    other = receiver_module._Charge(budget)
    assert other.take(63 * MiB)  # another request holds most of the budget
    with pytest.raises(receiver_module._Busy):
        receiver_module._gunzip_capped(body, 4 * MiB, receiver_module._Charge(budget))


# --- the ingest bounds, at their stated volumes, on a `tailwatch collect` process -------------------


def test_collect_process_stays_under_1_5_gib_through_bombs_and_16_concurrent_60_mb_uploads(
    tmp_path: Path, json_bombs: list[bytes]
) -> None:
    proc, port, _ = start_collector("chdb://" + str(tmp_path / "store"))
    url = f"http://127.0.0.1:{port}"
    process = psutil.Process(proc.pid)
    peak = [process.memory_info().rss]
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            with suppress(psutil.Error):
                peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        answers: list[int] = []

        def post(body: bytes, headers: dict[str, str]) -> None:
            with suppress(httpx.TransportError):
                answers.append(
                    httpx.post(f"{url}/v1/traces", content=body, headers=headers, timeout=60).status_code
                )

        garbage = os.urandom(60 * MiB)
        threads = [threading.Thread(target=post, args=(b, {**JS, **GZ})) for b in json_bombs]
        threads += [threading.Thread(target=post, args=(garbage, PB)) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        status, elapsed = _valid_export(url, seed=3)
    finally:
        sampling.set()
        sampler.join(5)
        proc.terminate()
        proc.wait(30)
    assert answers and not [a for a in answers if a >= 500 and a != 503], answers
    assert status == 200 and elapsed < 10.0
    print(f"collect process peak RSS {peak[0] / MiB:.0f} MiB; answers {sorted(answers)}")
    assert peak[0] <= 1.5 * 1024 * MiB, f"peak RSS {peak[0] / MiB:.0f} MiB"


def test_80_exports_of_20_mb_while_the_store_cannot_insert(store: Store, tmp_path: Path) -> None:
    # The defaults (256 MiB queued, 256 MiB in flight); the test process holds the client too.
    settings = PipelineSettings(flush_interval_s=0.05, spool_dir=tmp_path / "s")
    writer = FlakyWriter(store, failures=10**9)
    body = _big_span_export(1, 20 * MiB)
    # This process also holds pytest and every earlier test's leftovers: the bound is on what the
    # receiver adds. An idle `tailwatch collect` with its embedded engine holds ~400 MiB, so a
    # growth under 1.5 GiB keeps that process under the 2 GiB asked for (measured: ~600 MiB).
    before = _rss()
    with _serving(store, settings, writer) as (pipeline, _, url), _PeakRss() as rss:
        statuses = []
        with httpx.Client(timeout=60) as http:
            for _ in range(80):
                statuses.append(http.post(f"{url}/v1/traces", content=body, headers=PB).status_code)
        queued = pipeline.queue_bytes
    assert set(statuses) <= {200, 429, 503} and statuses.count(200) >= 1 and statuses[-1] in (429, 503)
    assert queued <= settings.max_queue_bytes
    growth = rss.peak - before
    print(f"RSS growth {growth / MiB:.0f} MiB; {statuses.count(200)} of 80 acknowledged")
    assert growth <= 1.5 * 1024 * MiB, f"RSS grew by {growth / MiB:.0f} MiB"
