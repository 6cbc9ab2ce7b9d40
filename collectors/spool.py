"""The fsync'd write-ahead spool: what makes an acknowledged export survive ``kill -9``.

A receiver answers 200 only after the export's rows are in a spool segment *and* fsync'd, so a crash
between the acknowledgement and the insert into ClickHouse loses nothing: the next start replays
every segment still on disk. Segments are deleted once every record in them has been inserted.

Layout: ``<dir>/LOCK`` (flock; one process per spool) and ``<dir>/seg-<n>.spool`` files of records
``<u32 length><u32 crc32><Arrow IPC stream>``. A torn record at the tail (the process died inside
``write``) fails its length or CRC check and is ignored: it was never acknowledged, because the
fsync that precedes the acknowledgement had not returned. A write that fails while the process
lives (a full disk) is cut back off the segment before the error is returned, so records appended
once space returns never follow a torn one; replay still resynchronises past any damaged record.

Concurrent receivers share fsyncs (group commit): each caller appends under a short lock and then
waits until some fsync covers its record; one thread's fsync serves everyone who appended before it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from storage import TailwatchError

__all__ = ["Spool", "SpoolError", "SpoolTicket", "table_to_ipc"]

log = logging.getLogger(__name__)

_HEADER = struct.Struct("<II")
_SEGMENT_GLOB = "seg-*.spool"


class SpoolError(TailwatchError):
    """The spool directory cannot be used (locked by another process, not writable)."""


@dataclass(frozen=True)
class SpoolTicket:
    """Where a record went: its segment and its position in the global append order."""

    segment: int
    seq: int
    size: int


def table_to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _intact_at(data: bytes, pos: int) -> bool:
    """Whether a whole record with a matching CRC starts at ``pos`` (records are never empty: zero
    bytes would otherwise read as an empty record with a matching CRC)."""
    length, crc = _HEADER.unpack_from(data, pos)
    start = pos + _HEADER.size
    return length > 0 and start + length <= len(data) and zlib.crc32(data[start : start + length]) == crc


def _segment_number(path: Path) -> int:
    return int(path.stem.split("-", 1)[1])


class Spool:
    """Append-only segments with group-commit fsync and per-segment release.

    Usage::

        spool = Spool(Path("/var/lib/tailwatch/spool"), segment_bytes=32 << 20)
        leftovers = spool.open()               # segments from a previous run, to replay
        ticket = spool.append(table_to_ipc(t))
        spool.sync(ticket)                     # now it is safe to acknowledge
        ...insert t...
        spool.release({ticket.segment: 1})
    """

    def __init__(self, directory: Path, *, segment_bytes: int = 32 * 1024 * 1024) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._lock_fd: int | None = None
        self._fd: int | None = None
        self._segment = 0
        self._segment_size = 0
        self._seq = 0
        self._synced_seq = 0
        self._pending: dict[int, int] = {}
        self._bytes: dict[int, int] = {}

    # --- lifecycle -----------------------------------------------------------------------------

    def open(self) -> list[Path]:
        """Lock the directory and return the segments a previous run left behind (oldest first)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise SpoolError(f"spool {self.directory}: cannot create it: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SpoolError(
                f"spool {self.directory} is in use by another process; give each collector its own spool"
            ) from None
        self._lock_fd = fd
        leftovers = sorted(self.directory.glob(_SEGMENT_GLOB), key=_segment_number)
        self._segment = max((_segment_number(p) for p in leftovers), default=0)
        return leftovers

    def close(self) -> None:
        """Close the active segment (deleting it when nothing in it is pending) and unlock."""
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None
                if self._pending.get(self._segment, 0) == 0:
                    self._unlink(self._segment)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    @property
    def pending_bytes(self) -> int:
        with self._lock:
            return sum(self._bytes.values())

    # --- writing -------------------------------------------------------------------------------

    def _path(self, segment: int) -> Path:
        return self.directory / f"seg-{segment:012d}.spool"

    def _open_segment(self) -> None:
        self._segment += 1
        self._fd = os.open(self._path(self._segment), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._segment_size = 0
        self._pending[self._segment] = 0
        self._bytes[self._segment] = 0
        # The new directory entry must survive a power loss too, not only the data.
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def append(self, payload: bytes) -> SpoolTicket:
        """Write one record (not yet durable: call :meth:`sync` before acknowledging)."""
        record = _HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        with self._lock:
            if self._lock_fd is None:
                raise SpoolError(f"spool {self.directory} is not open")
            if self._fd is not None and self._segment_size >= self.segment_bytes:
                # Rotating closes the file: make what it holds durable first, since those
                # records' writers may still be waiting for a sync that now targets the new file.
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd = None
                self._synced_seq = max(self._synced_seq, self._seq)
            if self._fd is None:
                self._open_segment()
            assert self._fd is not None
            try:
                written = os.write(self._fd, record)
                if written != len(record):
                    raise OSError(errno.ENOSPC, f"short write ({written} of {len(record)} bytes)")
            except OSError as exc:
                # Whatever part of the record reached the file must not stay: records appended
                # after it (once space returns) would follow a torn one.
                self._cut_back()
                raise SpoolError(f"spool {self.directory}: cannot append: {exc.strerror or exc}") from None
            self._segment_size += len(record)
            self._pending[self._segment] += 1
            self._bytes[self._segment] += len(record)
            self._seq += 1
            return SpoolTicket(self._segment, self._seq, len(record))

    def _cut_back(self) -> None:
        """Truncate the active segment to its last whole record; if even that fails, retire the
        segment (nothing is appended after the torn bytes) and start a new one on the next append."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, self._segment_size)
            return
        except OSError:
            log.error(
                "spool %s: cannot truncate segment %d after a failed write; starting a new segment",
                self.directory,
                self._segment,
            )
        with contextlib.suppress(OSError):
            os.fsync(self._fd)
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = None
        self._synced_seq = max(self._synced_seq, self._seq)
        if self._pending.get(self._segment, 0) == 0:
            self._unlink(self._segment)

    def sync(self, ticket: SpoolTicket) -> None:
        """Return once the record behind ``ticket`` is on stable storage (one fsync serves many)."""
        if self._synced_seq >= ticket.seq:
            return
        with self._sync_lock:
            if self._synced_seq >= ticket.seq:
                return
            with self._lock:
                if self._fd is None:  # rotated or released since: already durable or already inserted
                    return
                target = self._seq
                fd = os.dup(self._fd)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._synced_seq = max(self._synced_seq, target)

    def release(self, counts: dict[int, int]) -> None:
        """Records inserted into the store: delete segments that no longer hold pending records."""
        with self._lock:
            for segment, n in counts.items():
                left = self._pending.get(segment, 0) - n
                self._pending[segment] = max(left, 0)
                if left > 0:
                    continue
                if segment == self._segment and self._fd is not None:
                    # Everything in the active segment is inserted: start a fresh one on the next
                    # append instead of letting a long-lived segment grow and be replayed whole.
                    os.close(self._fd)
                    self._fd = None
                    self._synced_seq = max(self._synced_seq, self._seq)
                self._unlink(segment)

    def _unlink(self, segment: int) -> None:
        self._pending.pop(segment, None)
        self._bytes.pop(segment, None)
        with contextlib.suppress(FileNotFoundError):
            self._path(segment).unlink()

    # --- recovery ------------------------------------------------------------------------------

    @staticmethod
    def read_segment(path: Path) -> Iterator[bytes]:
        """The intact records of a segment. A torn or corrupt record is reported with its offset and
        skipped: the scan resumes at the next offset where a whole record with a matching CRC
        starts, so no intact record after it is lost (a torn tail is normal after a crash inside
        ``write``; a torn record in the middle is a bug or damage, never silently the end)."""
        data = path.read_bytes()
        pos = 0
        while pos + _HEADER.size <= len(data):
            if _intact_at(data, pos):
                length = _HEADER.unpack_from(data, pos)[0]
                start = pos + _HEADER.size
                yield data[start : start + length]
                pos = start + length
                continue
            resume = next(
                (p for p in range(pos + 1, len(data) - _HEADER.size + 1) if _intact_at(data, p)), None
            )
            if resume is None:
                log.warning(
                    "spool %s: ignoring %d bytes of a torn record at byte %d (never acknowledged)",
                    path,
                    len(data) - pos,
                    pos,
                )
                return
            log.error(
                "spool %s: skipped %d corrupt bytes at byte %d; replay resumes at byte %d",
                path,
                resume - pos,
                pos,
                resume,
            )
            pos = resume

    def discard(self, path: Path) -> None:
        """Delete a replayed segment of a previous run."""
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
