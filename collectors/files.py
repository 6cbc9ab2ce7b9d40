"""Import OTLP trace files: protobuf, OTLP/JSON, and the Collector file exporter's formats.

Accepted per file (each optionally gzipped, detected by its magic bytes, not its name):

* one binary ``ExportTraceServiceRequest``;
* the Collector ``file`` exporter's protobuf output: messages each prefixed by a 4-byte big-endian
  length;
* one OTLP/JSON object (``{"resourceSpans": …}``, the spec's ``examples/trace.json`` shape);
* JSON lines, one OTLP/JSON object per line (the ``file`` exporter's default).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pyarrow as pa
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from tqdm import tqdm

from collectors.native_insert import NativeInserter, checked_inserter
from collectors.otlp_decode import (
    OtlpDecodeError,
    decode_json,
    decode_protobuf,
    request_to_arrow,
    validate_request,
)
from collectors.schema import TRACES_MIGRATIONS
from collectors.settings import PipelineSettings
from collectors.writer import StoreSpanWriter
from storage import Store, TailwatchError, ensure_schema

__all__ = ["FileReport", "IngestReport", "ingest_files", "read_export_requests"]

_GZIP_MAGIC = b"\x1f\x8b"
_MAX_RECORD = 256 * 1024 * 1024
MAX_REJECTION_REASONS = 5
# What skips one request (recorded, the file goes on) and what ends reading a file.
_DECODE_ERRORS = (OtlpDecodeError, ValueError, TypeError, OverflowError)
_READ_ERRORS = (OSError, EOFError, zlib.error)


def _cannot_read(exc: BaseException) -> str:
    return f"cannot read: {getattr(exc, 'strerror', None) or exc}"


@dataclass
class FileReport:
    path: Path
    format: str = ""
    requests: int = 0
    # Spans read and valid; ``committed`` of them are in the store (inserted, or acknowledged by the
    # receiver they were sent to). They differ only while a batch waits or after an interruption.
    accepted: int = 0
    rejected: int = 0
    committed: int = 0
    # Read to its end (or given up on with an error): nothing of it is left to read.
    finished: bool = False
    errors: list[str] = field(default_factory=list)
    # Why spans were rejected: the first reason of each request that lost some, at most a few.
    rejections: list[str] = field(default_factory=list)

    def note_rejection(self, request_index: int, reason: str) -> None:
        if reason and len(self.rejections) < MAX_REJECTION_REASONS:
            self.rejections.append(f"request {request_index + 1}: {reason}")


@dataclass
class IngestReport:
    files: list[FileReport] = field(default_factory=list)
    # Stopped early (``stop``), with what was read inserted; the files not finished are left.
    interrupted: bool = False
    # Spans whose insert was under way when an exception (a second Ctrl-C) ended the ingest: they
    # may or may not be in the store.
    in_flight: int = 0

    @property
    def accepted(self) -> int:
        return sum(f.accepted for f in self.files)

    @property
    def committed(self) -> int:
        return sum(f.committed for f in self.files)

    @property
    def rejected(self) -> int:
        return sum(f.rejected for f in self.files)

    @property
    def errors(self) -> list[str]:
        return [f"{f.path}: {e}" for f in self.files for e in f.errors]


def _open(raw: IO[bytes]) -> IO[bytes]:
    magic = raw.read(2)
    raw.seek(0)
    if magic == _GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def _requests(handle: IO[bytes], report: FileReport) -> Iterator[bytes | tuple[str, bytes]]:
    """Yield raw protobuf bodies or ("json", text) pairs, after sniffing the format.

    JSON lines are streamed line by line, so a large Collector file-exporter output is never held
    whole; a single JSON document or protobuf message has to be read whole anyway.
    """
    head = handle.read(64)
    handle.seek(0)
    if head.lstrip().startswith(b"{"):
        first = handle.readline()
        rest_starts = handle.read(1)
        if rest_starts:
            try:
                decode_json(first)
            except OtlpDecodeError:
                pass  # a pretty-printed document: its first line is not a whole object
            else:
                report.format = "otlp-json-lines"
                yield ("json", first)
                pending = rest_starts + handle.readline()
                while pending:
                    if pending.strip():
                        yield ("json", pending)
                    pending = handle.readline()
                return
        handle.seek(0)
        report.format = "otlp-json"
        yield ("json", handle.read())
        return
    data = handle.read()
    try:
        decode_protobuf(data)
        report.format = "otlp-protobuf"
        yield data
        return
    except OtlpDecodeError:
        pass
    framed = list(_length_prefixed(data))
    if framed:
        report.format = "otlp-protobuf-framed"
        yield from framed
        return
    report.format = "otlp-protobuf"
    yield data  # fails to decode below, with the decoder's message


def _length_prefixed(data: bytes) -> Iterator[bytes]:
    pos = 0
    records: list[bytes] = []
    while pos + 4 <= len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        if length > _MAX_RECORD or pos + 4 + length > len(data):
            return
        records.append(data[pos + 4 : pos + 4 + length])
        pos += 4 + length
    if pos == len(data):
        yield from records


class _Batcher:
    """Collects requests until ``batch_rows`` spans, then inserts them in one go; each file's
    ``committed`` counts the spans of its requests once their batch is inserted."""

    def __init__(
        self, store: Store, batch_rows: int, native: NativeInserter | None, report: IngestReport
    ) -> None:
        self.writer = StoreSpanWriter(store)
        self.batch_rows = batch_rows
        self.native = native
        self.report = report
        self.tables: list[pa.Table] = []
        self.raw: list[bytes] = []
        self.rows = 0
        self.owners: list[tuple[FileReport, int]] = []

    def add(self, body: bytes | tuple[str, bytes], owner: FileReport) -> tuple[int, int, str]:
        """Decode and queue one request; returns (accepted, rejected, why the first was rejected)."""
        if isinstance(body, tuple):
            decoded = request_to_arrow(decode_json(body[1]))
            accepted, rejected, reason = decoded.accepted, decoded.rejected, decoded.error_message
            if accepted:
                self.tables.append(decoded.table)
        else:
            request = decode_protobuf(body)
            if self.native is not None:
                received, rejected, reason = validate_request(request)
                accepted = received - rejected
                if accepted:
                    self.raw.append(request.SerializeToString() if rejected else body)
            else:
                decoded = request_to_arrow(request)
                accepted, rejected, reason = decoded.accepted, decoded.rejected, decoded.error_message
                if accepted:
                    self.tables.append(decoded.table)
        self.rows += accepted
        if accepted:
            self.owners.append((owner, accepted))
        if self.rows >= self.batch_rows:
            self.flush()
        return accepted, rejected, reason

    def flush(self) -> None:
        # Until both inserts return, the batch's spans are neither committed nor safely absent.
        self.report.in_flight = self.rows
        if self.tables:
            self.writer.write(pa.concat_tables(self.tables))
        if self.raw and self.native is not None:
            self.native.insert(self.raw)
        for owner, spans in self.owners:
            owner.committed += spans
        self.report.in_flight = 0
        self.tables, self.raw, self.rows, self.owners = [], [], 0, []


def read_export_requests(path: Path | str, report: FileReport) -> Iterator[ExportTraceServiceRequest]:
    """Each export request of one OTLP file, decoded, in the formats :func:`ingest_files` reads.

    For sending a file elsewhere (a running service's receiver) instead of inserting it here:
    ``report`` gets the file's format and request count; an undecodable request and an unreadable
    file are recorded in ``report.errors`` and skipped, like :func:`ingest_files` does. The span
    counts are the caller's, who learns them from wherever the requests go.
    """
    try:
        with Path(path).open("rb") as raw, _open(raw) as handle:
            for index, body in enumerate(_requests(handle, report)):
                report.requests += 1
                try:
                    yield decode_json(body[1]) if isinstance(body, tuple) else decode_protobuf(body)
                except _DECODE_ERRORS as exc:
                    report.errors.append(f"request {index + 1}: {exc}")
    except _READ_ERRORS as exc:
        report.errors.append(_cannot_read(exc))


def size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def ingest_files(
    store: Store,
    paths: Sequence[Path | str],
    *,
    batch_rows: int = PipelineSettings.batch_rows,
    progress: bool = False,
    progress_file: IO[str] | None = None,
    native: bool = True,
    stop: Callable[[], bool] | None = None,
    report: IngestReport | None = None,
) -> IngestReport:
    """Insert the spans of every file into ``otel_traces``; invalid spans are counted, not fatal.

    An undecodable file (or line) is reported in ``errors`` and skipped; the others still import.
    Protobuf requests on an embedded store are mapped by ClickHouse itself (``native``, see
    :mod:`collectors.native_insert`); JSON and server stores use the Arrow path.

    ``stop`` is asked after each request: once it answers True, reading stops, the spans read so
    far are inserted and the report says ``interrupted`` (the files not ``finished`` are left).
    ``report``, when given, is filled as the ingest goes, so a caller whose ingest an exception
    ended (KeyboardInterrupt) still knows what each file committed and what was ``in_flight``.
    """
    report = IngestReport() if report is None else report
    ensure_schema(store, TRACES_MIGRATIONS)
    batcher = _Batcher(store, batch_rows, checked_inserter(store) if native else None, report)
    total_bytes = sum(size_of(Path(p)) for p in paths)
    bar = tqdm(
        total=total_bytes,
        unit="B",
        unit_scale=True,
        desc="ingest",
        disable=not progress,
        file=progress_file,
    )
    try:
        for raw_path in paths:
            if stop is not None and stop():
                report.interrupted = True
                break
            path = Path(raw_path)
            file_report = FileReport(path)
            report.files.append(file_report)
            done = 0
            try:
                with path.open("rb") as raw, _open(raw) as handle:
                    for index, body in enumerate(_requests(handle, file_report)):
                        file_report.requests += 1
                        try:
                            accepted, rejected, reason = batcher.add(body, file_report)
                        except _DECODE_ERRORS as exc:
                            file_report.errors.append(f"request {index + 1}: {exc}")
                            continue
                        file_report.accepted += accepted
                        file_report.rejected += rejected
                        if rejected:
                            file_report.note_rejection(index, reason)
                        # Progress in bytes of the file as stored (compressed or not).
                        position = raw.tell()
                        bar.update(position - done)
                        done = position
                        if stop is not None and stop():
                            report.interrupted = True
                            break
            except _READ_ERRORS as exc:
                file_report.errors.append(_cannot_read(exc))
                file_report.finished = True
            else:
                if report.interrupted:
                    break
                file_report.finished = True
                # A file that decodes to no span at all is not a trace export (an empty file, or
                # JSON of another kind): say so rather than "0 accepted, 0 rejected".
                if not file_report.errors and file_report.accepted + file_report.rejected == 0:
                    file_report.errors.append(
                        "empty file"
                        if file_report.requests == 0 or size_of(path) == 0
                        else "no spans: not an OTLP trace export (expected resourceSpans with spans)"
                    )
            bar.update(max(0, size_of(path) - done))
        batcher.flush()
    finally:
        bar.close()
    if not paths:
        raise TailwatchError("no files to ingest")
    return report
