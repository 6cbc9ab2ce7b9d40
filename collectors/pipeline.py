"""The batching ingest pipeline: bounded queue, backpressure, spool, columnar inserts.

Receivers hand decoded Arrow tables to :meth:`IngestPipeline.submit`. The pipeline

* refuses work it cannot hold (``queue_full`` → HTTP 429 / gRPC RESOURCE_EXHAUSTED, ``unavailable``
  → 503 / UNAVAILABLE), so memory stays bounded by ``max_queue_spans`` and ``max_queue_bytes``
  under any overload;
* makes accepted work durable before it is acknowledged: with a spool, an fsync'd record; without
  one, ``submit`` returns only after the insert;
* inserts from one background thread in batches of ``batch_rows`` or every ``flush_interval_s``,
  keeping a failed batch at the head of the queue and retrying it with backoff.

Duplicates: a client that retries after a timeout may deliver a span twice. tailwatch deduplicates
at read time on (TraceId, SpanId) (``read_spans``, analytics); replay after a crash additionally
skips rows that already reached the store, so a restart does not add copies of its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pyarrow as pa
from prometheus_client import CollectorRegistry

from collectors.metrics import IngestMetrics
from collectors.native_insert import NativeInserter, checked_inserter
from collectors.otlp_decode import decode_protobuf, request_to_arrow
from collectors.schema import TRACES_ARROW_SCHEMA, TRACES_MIGRATIONS
from collectors.settings import PipelineSettings
from collectors.spool import Spool, SpoolTicket, table_to_ipc
from collectors.writer import SpanWriter, StoreSpanWriter
from storage import Store, ensure_schema

__all__ = ["IngestPipeline", "SubmitResult", "SubmitStatus", "spool_record"]

log = logging.getLogger(__name__)

SubmitStatus = Literal["accepted", "queue_full", "unavailable"]
_State = Literal["new", "running", "stopping", "stopped"]


@dataclass(frozen=True)
class SubmitResult:
    """The outcome of one :meth:`IngestPipeline.submit`.

    ``accepted``: every row is durable (spooled or inserted) — acknowledge.
    ``queue_full``: too much queued; retry after ``retry_after_s`` (HTTP 429).
    ``unavailable``: stopping, spool or store failing; retry after ``retry_after_s`` (HTTP 503).
    """

    status: SubmitStatus
    accepted: int = 0
    retry_after_s: float = 0.0
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "accepted"


@dataclass
class _Item:
    table: pa.Table | None  # mapped rows (Arrow path) ...
    raw: bytes | None  # ... or a validated protobuf request that ClickHouse maps itself
    rows: int
    nbytes: int
    ticket: SpoolTicket | None
    done: threading.Event | None = None
    inserted: bool = False
    enqueued_at: float = field(default_factory=time.monotonic)


class IngestPipeline:
    """Queue → batch → insert, with an optional fsync'd spool in front.

    Usage::

        pipeline = IngestPipeline(store, PipelineSettings(spool_dir=Path("spool")))
        pipeline.start()                      # replays what a crashed run left in the spool
        result = pipeline.submit(arrow_table) # from a receiver thread
        pipeline.stop(timeout_s=30)           # flushes everything queued
    """

    def __init__(
        self,
        store: Store | None,
        settings: PipelineSettings | None = None,
        registry: CollectorRegistry | None = None,
        *,
        writer: SpanWriter | None = None,
    ) -> None:
        if store is None and writer is None:
            raise ValueError("IngestPipeline needs a store or a writer")
        self.store = store
        self.settings = settings or PipelineSettings()
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = IngestMetrics(self.registry)
        self._writer: SpanWriter = writer if writer is not None else StoreSpanWriter(_require(store))
        self._custom_writer = writer is not None
        self._native: NativeInserter | None = None
        self._spool = Spool(self.settings.spool_dir) if self.settings.spool_dir is not None else None
        self._cond = threading.Condition()
        self._queue: deque[_Item] = deque()
        self._queued = 0
        self._reserved = 0
        self._queued_bytes = 0
        self._reserved_bytes = 0
        self._state: _State = "new"
        self._store_ok = True
        self._writer_ok = True  # false while the insert loop restarts after an unexpected error
        self._flush_requested = False
        self._draining = False
        self._thread: threading.Thread | None = None
        self._stop_deadline = 0.0
        self.replayed = 0
        self.inserted = 0

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Create the trace schema if needed, replay the spool, start the insert thread."""
        with self._cond:
            if self._state != "new":
                raise RuntimeError(f"pipeline already {self._state}")
        if self.store is not None:
            ensure_schema(self.store, TRACES_MIGRATIONS)
            if self.settings.native_insert and not self._custom_writer:
                # None on a server without inline schemas, or when the engine does not map OTLP exactly.
                work_dir = self.settings.spool_dir / "tmp" if self.settings.spool_dir is not None else None
                self._native = checked_inserter(self.store, work_dir)
        if self._spool is not None:
            leftovers = self._spool.open()
            try:
                for path in leftovers:
                    self._replay(path)
            except BaseException:
                self._spool.close()
                raise
        self._thread = threading.Thread(target=self._run, name="tailwatch-ingest-writer", daemon=True)
        with self._cond:
            self._state = "running"
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop accepting, insert everything queued, close the spool. True if nothing was left behind.

        Spans that could not be inserted before the deadline stay in the spool for the next start.
        """
        with self._cond:
            if self._state in ("new", "stopped"):
                self._state = "stopped"
                return True
            self._state = "stopping"
            self._stop_deadline = time.monotonic() + timeout_s
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s + 5.0)
        with self._cond:
            left = self._queued
            self._state = "stopped"
            for item in self._queue:
                if item.done is not None:
                    item.done.set()
        if self._spool is not None:
            self._spool.close()
        if left:
            where = "kept in the spool for the next start" if self._spool is not None else "not inserted"
            log.warning("ingest stopped with %d spans %s", left, where)
        return left == 0

    @property
    def accepts_raw(self) -> bool:
        """True when :meth:`submit_raw` is available (ClickHouse-side mapping supported and verified)."""
        return self._native is not None

    @property
    def running(self) -> bool:
        return self._state == "running"

    @property
    def ready(self) -> bool:
        """Accepting and able to insert: what ``/readyz`` reports."""
        with self._cond:
            return (
                self._state == "running"
                and self._store_ok
                and self._writer_ok
                and self._thread is not None
                and self._thread.is_alive()
                and self._queued + self._reserved < self.settings.max_queue_spans
                and self._queued_bytes + self._reserved_bytes < self.settings.max_queue_bytes
            )

    @property
    def queue_depth(self) -> int:
        with self._cond:
            return self._queued

    @property
    def queue_bytes(self) -> int:
        """Bytes of the exports queued or being spooled (bounded by ``max_queue_bytes``)."""
        with self._cond:
            return self._queued_bytes + self._reserved_bytes

    def drain(self) -> None:
        """From now on insert whatever is queued without waiting for a full batch or the timer.

        Receivers call this as they shut down: exports still in flight (without a spool they wait
        for their insert) complete promptly instead of waiting out ``flush_interval_s``.
        """
        with self._cond:
            self._draining = True
            self._cond.notify_all()

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Insert what is queued now, without waiting for a full batch. True once the queue is empty."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            self._flush_requested = True
            self._cond.notify_all()
            while self._queued or self._reserved:
                left = deadline - time.monotonic()
                if left <= 0 or self._state not in ("running", "stopping"):
                    return False
                self._cond.wait(min(left, 0.05))
            return True

    # --- submit --------------------------------------------------------------------------------

    def submit(self, table: pa.Table, *, protocol: str = "direct") -> SubmitResult:
        """Take responsibility for ``table`` (rows in the trace schema) or refuse it."""
        return self._submit(table, None, table.num_rows, protocol)

    def submit_raw(self, body: bytes, spans: int, *, protocol: str = "direct") -> SubmitResult:
        """Like :meth:`submit` for a serialized ExportTraceServiceRequest whose ``spans`` spans are all
        valid (see ``validate_request``); ClickHouse maps it at insert time. Needs :attr:`accepts_raw`."""
        if self._native is None:
            return self.submit(request_to_arrow(decode_protobuf(body)).table, protocol=protocol)
        return self._submit(None, body, spans, protocol)

    def _submit(self, table: pa.Table | None, raw: bytes | None, rows: int, protocol: str) -> SubmitResult:
        if rows == 0:
            return SubmitResult("accepted", 0)
        nbytes = len(raw) if raw is not None else _require_table(table).nbytes
        retry_after = max(1.0, self.settings.flush_interval_s)
        with self._cond:
            if self._state != "running":
                return self._refuse(
                    "unavailable", rows, protocol, retry_after, "the collector is shutting down"
                )
            if not self._store_ok and self._spool is None:
                return self._refuse(
                    "unavailable", rows, protocol, retry_after, "the store is not accepting inserts"
                )
            held = self._queued + self._reserved
            held_bytes = self._queued_bytes + self._reserved_bytes
            # A request larger than the whole queue is still taken when the queue is empty, so one
            # oversized export cannot be refused forever.
            if held > 0 and (
                held + rows > self.settings.max_queue_spans
                or held_bytes + nbytes > self.settings.max_queue_bytes
            ):
                return self._refuse("queue_full", rows, protocol, retry_after, "the ingest queue is full")
            self._reserved += rows
            self._reserved_bytes += nbytes
        ticket: SpoolTicket | None = None
        try:
            if self._spool is not None:
                payload = spool_record(table, raw)
                ticket = self._spool.append(payload)
                self._spool.sync(ticket)
        except Exception as exc:  # a full disk must become a retryable answer, not a 500
            log.error("spool write failed: %s", exc)
            with self._cond:
                self._reserved -= rows
                self._reserved_bytes -= nbytes
                self._cond.notify_all()
            return self._refuse("unavailable", rows, protocol, retry_after, f"spool write failed: {exc}")
        item = _Item(table, raw, rows, nbytes, ticket, None if ticket is not None else threading.Event())
        with self._cond:
            self._reserved -= rows
            self._reserved_bytes -= nbytes
            self._queue.append(item)
            self._queued += rows
            self._queued_bytes += nbytes
            self.metrics.queue_depth.set(self._queued)
            if self._queued >= self.settings.batch_rows or self._draining or self._state != "running":
                self._cond.notify_all()
        if item.done is not None:
            # No spool: the acknowledgement must wait for the insert itself.
            item.done.wait(self.settings.flush_interval_s + 60.0)
            if not item.inserted:
                return self._refuse("unavailable", rows, protocol, retry_after, "the insert did not complete")
        self.metrics.accepted.labels(protocol=protocol).inc(rows)
        return SubmitResult("accepted", rows)

    def _refuse(
        self, status: SubmitStatus, rows: int, protocol: str, retry_after: float, message: str
    ) -> SubmitResult:
        self.metrics.dropped.labels(protocol=protocol, reason=status).inc(rows)
        return SubmitResult(status, 0, retry_after, message)

    # --- the insert thread ---------------------------------------------------------------------

    def _take_batch(self) -> list[_Item] | None:
        """Wait for a batch to be due; None when stopping with nothing left (or past the deadline)."""
        interval = self.settings.flush_interval_s
        with self._cond:
            while True:
                stopping = self._state != "running"
                # A submit that passed its check before the stop may still be spooling: wait for it
                # (it is reserved), so its acknowledged spans are inserted now, not at the next start.
                idle = not self._queue and not self._reserved
                if stopping and (idle or time.monotonic() > self._stop_deadline):
                    return None
                if self._queue:
                    age = time.monotonic() - self._queue[0].enqueued_at
                    if (
                        self._queued >= self.settings.batch_rows
                        or age >= interval
                        or stopping
                        or self._flush_requested
                        or self._draining
                    ):
                        break
                    self._cond.wait(interval - age)
                else:
                    self._flush_requested = False
                    self._cond.wait(interval)
            batch: list[_Item] = []
            rows = 0
            for item in self._queue:
                if batch and rows + item.rows > self.settings.batch_rows:
                    break
                # One kind per insert, so a retried batch never re-inserts a half that succeeded.
                if batch and (item.raw is None) != (batch[0].raw is None):
                    break
                batch.append(item)
                rows += item.rows
            return batch

    def _run(self) -> None:
        """The insert thread. An unexpected error restarts its loop (the queue lives on the pipeline,
        so nothing is lost) and makes the pipeline unready meanwhile: the thread never dies silently
        while exports keep being acknowledged."""
        restarts = 0
        while True:
            try:
                self._insert_loop()
                return
            except Exception:
                restarts += 1
                log.exception("ingest writer failed (restart %d); restarting it", restarts)
                with self._cond:
                    self._writer_ok = False
                    self._cond.wait(min(0.1 * 2 ** min(restarts, 6), 5.0))
                    self._writer_ok = True

    def _insert_loop(self) -> None:
        failures = 0
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            rows = sum(item.rows for item in batch)
            started = time.perf_counter()
            try:
                if batch[0].raw is not None:
                    assert self._native is not None
                    self._native.insert([item.raw for item in batch if item.raw is not None])
                else:
                    self._writer.write(pa.concat_tables([_require_table(item.table) for item in batch]))
            except Exception as exc:
                failures += 1
                self.metrics.insert_errors.inc()
                if failures == 1 or failures % 50 == 0:
                    log.error(
                        "insert of %d spans failed (attempt %d, kept and retried): %s", rows, failures, exc
                    )
                with self._cond:
                    self._store_ok = False
                    if self._state == "running" or time.monotonic() < self._stop_deadline:
                        self._cond.wait(min(0.1 * 2 ** min(failures, 6), 5.0))
                continue
            failures = 0
            self.inserted += rows
            released: dict[int, int] = {}
            # The batch is in the store: take it off the queue before anything else can fail, so a
            # restarted loop never inserts it twice.
            with self._cond:
                self._store_ok = True
                for _ in batch:
                    item = self._queue.popleft()
                    item.inserted = True
                    if item.done is not None:
                        item.done.set()
                    if item.ticket is not None:
                        released[item.ticket.segment] = released.get(item.ticket.segment, 0) + 1
                self._queued -= rows
                self._queued_bytes -= sum(item.nbytes for item in batch)
                self._cond.notify_all()
            self.metrics.queue_depth.set(self._queued)
            self.metrics.insert_seconds.observe(time.perf_counter() - started)
            self.metrics.batch_rows.observe(rows)
            self.metrics.inserted.inc(rows)
            if self._spool is not None and released:
                try:
                    self._spool.release(released)
                except Exception as exc:
                    # The spans are inserted; a segment left behind is replayed at the next start
                    # and its rows found present, so this costs disk, not data.
                    log.error("spool release failed (segments kept until the next start): %s", exc)
                self.metrics.spool_bytes.set(self._spool.pending_bytes)

    # --- recovery ------------------------------------------------------------------------------

    def _replay(self, segment: Path) -> None:
        """Insert a previous run's spool segment, skipping rows that already reached the store."""
        assert self._spool is not None
        tables = []
        for payload in Spool.read_segment(segment):
            try:
                tables.append(_payload_table(payload))
            except Exception as exc:  # CRC-valid but unreadable: keep the segment's other records
                log.error("spool %s: skipping an unreadable record: %s", segment.name, exc)
        tables = [t for t in tables if t.num_rows]
        if tables:
            table = pa.concat_tables(
                [t.select(TRACES_ARROW_SCHEMA.names).cast(TRACES_ARROW_SCHEMA) for t in tables]
            )
            for offset in range(0, table.num_rows, self.settings.batch_rows):
                chunk = table.slice(offset, self.settings.batch_rows)
                present = self._writer.present(chunk)
                if present.any():
                    chunk = chunk.filter(pa.array(~present))
                if chunk.num_rows:
                    self._writer.write(chunk)
                    self.metrics.replayed.inc(chunk.num_rows)
                    self.replayed += chunk.num_rows
            log.info("replayed %d spans from spool segment %s", self.replayed, segment.name)
        self._spool.discard(segment)


def _require(store: Store | None) -> Store:
    if store is None:
        raise ValueError("IngestPipeline needs a store or a writer")
    return store


_ARROW = b"A"
_RAW = b"P"


def spool_record(table: pa.Table | None = None, raw: bytes | None = None) -> bytes:
    """How an accepted export is spooled: a kind byte, then Arrow IPC or the raw protobuf request."""
    if raw is not None:
        return _RAW + raw
    return _ARROW + table_to_ipc(_require_table(table))


def _payload_table(payload: bytes) -> pa.Table:
    """A spool record back as rows: Arrow IPC, or a raw request mapped by the Python path."""
    if payload[:1] == _RAW:
        return request_to_arrow(decode_protobuf(payload[1:])).table
    return pa.ipc.open_stream(payload[1:]).read_all()


def _require_table(table: pa.Table | None) -> pa.Table:
    assert table is not None
    return table
