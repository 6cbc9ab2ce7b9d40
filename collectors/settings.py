"""Ingest settings: argument → ``TAILWATCH_*`` environment variable → documented default.

Every variable the collectors read is a constant here. A value that does not parse raises a
:class:`SettingsError` naming the variable (settings are configuration: failing loudly at start
beats ingesting with a surprising default).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from storage import TailwatchError

__all__ = [
    "BATCH_ROWS_ENV",
    "DEFAULT_GRPC_ADDRESS",
    "DEFAULT_HTTP_ADDRESS",
    "FLUSH_INTERVAL_ENV",
    "INGEST_TOKEN_ENV",
    "MAX_INFLIGHT_BYTES_ENV",
    "MAX_QUEUE_BYTES_ENV",
    "MAX_QUEUE_SPANS_ENV",
    "MAX_REQUEST_BYTES_ENV",
    "NATIVE_INSERT_ENV",
    "SPOOL_DIR_ENV",
    "PipelineSettings",
    "SettingsError",
    "parse_address",
]

BATCH_ROWS_ENV = "TAILWATCH_BATCH_ROWS"
FLUSH_INTERVAL_ENV = "TAILWATCH_FLUSH_INTERVAL_S"
MAX_QUEUE_SPANS_ENV = "TAILWATCH_MAX_QUEUE_SPANS"
MAX_QUEUE_BYTES_ENV = "TAILWATCH_MAX_QUEUE_BYTES"
MAX_INFLIGHT_BYTES_ENV = "TAILWATCH_MAX_INFLIGHT_BYTES"
SPOOL_DIR_ENV = "TAILWATCH_SPOOL_DIR"
MAX_REQUEST_BYTES_ENV = "TAILWATCH_MAX_REQUEST_BYTES"
NATIVE_INSERT_ENV = "TAILWATCH_NATIVE_INSERT"
INGEST_TOKEN_ENV = "TAILWATCH_INGEST_TOKEN"  # noqa: S105 - a variable name, not a secret

DEFAULT_HTTP_ADDRESS = "127.0.0.1:4318"
DEFAULT_GRPC_ADDRESS = "127.0.0.1:4317"


class SettingsError(TailwatchError, ValueError):
    """A setting (argument or environment variable) has a value that cannot be used."""


@dataclass(frozen=True)
class PipelineSettings:
    """How the ingest pipeline batches, bounds and persists spans.

    ``batch_rows``: insert as soon as this many spans are queued. Fewer, larger inserts make fewer
    parts for ClickHouse to write and merge: at 50k the receiver spends about 40% less CPU per span
    than at 10k (``bench/ingest``), while ``flush_interval_s`` still bounds the wait at low rates.
    ``flush_interval_s``: insert at least this often when fewer are queued.
    ``max_queue_spans``: spans accepted but not yet inserted; beyond it receivers answer 429/503.
    ``max_queue_bytes``: the same bound in bytes (Arrow ``nbytes`` or raw body length of each
    queued export), so a few huge spans cannot hold gigabytes either.
    ``spool_dir``: fsync'd write-ahead spool; an acknowledged export is on disk before the 200 and
    is replayed on the next start. Without it, an export is acknowledged only once inserted.
    ``max_request_bytes``: body limit of one export, compressed and decompressed (spec: 64 MiB).
    ``max_inflight_bytes``: OTLP/HTTP bodies being read, decompressed and decoded at once (compressed
    plus decompressed bytes); beyond it requests get 429 + ``Retry-After``. A request alone may
    exceed it (up to ``max_request_bytes`` each way), so the largest valid export is never refused.
    ``native_insert``: on an embedded store, let ClickHouse map raw protobuf exports itself (verified
    against the Python mapping at start; the Arrow path is used otherwise).
    """

    batch_rows: int = 50_000
    flush_interval_s: float = 1.0
    max_queue_spans: int = 200_000
    max_queue_bytes: int = 256 * 1024 * 1024
    spool_dir: Path | None = None
    max_request_bytes: int = 64 * 1024 * 1024
    max_inflight_bytes: int = 256 * 1024 * 1024
    native_insert: bool = True

    def __post_init__(self) -> None:
        if self.batch_rows < 1:
            raise SettingsError(f"batch_rows must be at least 1, got {self.batch_rows}")
        if not self.flush_interval_s > 0:
            raise SettingsError(f"flush_interval_s must be positive, got {self.flush_interval_s}")
        if self.max_queue_spans < self.batch_rows:
            raise SettingsError(
                f"max_queue_spans ({self.max_queue_spans}) must be at least batch_rows ({self.batch_rows})"
            )
        if self.max_request_bytes < 1024:
            raise SettingsError(f"max_request_bytes must be at least 1024, got {self.max_request_bytes}")
        for name in ("max_queue_bytes", "max_inflight_bytes"):
            if getattr(self, name) < 1024:
                raise SettingsError(f"{name} must be at least 1024, got {getattr(self, name)}")

    @classmethod
    def from_env(cls, **overrides: Any) -> PipelineSettings:
        """Arguments that are not None win, then ``TAILWATCH_*`` variables, then the defaults."""
        values: dict[str, Any] = {}
        env_names: dict[str, tuple[str, Callable[[str], Any]]] = {
            "batch_rows": (BATCH_ROWS_ENV, int),
            "flush_interval_s": (FLUSH_INTERVAL_ENV, float),
            "max_queue_spans": (MAX_QUEUE_SPANS_ENV, int),
            "max_queue_bytes": (MAX_QUEUE_BYTES_ENV, int),
            "spool_dir": (SPOOL_DIR_ENV, Path),
            "max_request_bytes": (MAX_REQUEST_BYTES_ENV, int),
            "max_inflight_bytes": (MAX_INFLIGHT_BYTES_ENV, int),
            "native_insert": (NATIVE_INSERT_ENV, _parse_bool),
        }
        known = {f.name for f in fields(cls)}
        for key in overrides:
            if key not in known:
                raise SettingsError(f"unknown pipeline setting {key!r}; known: {', '.join(sorted(known))}")
        for key, (env, parse) in env_names.items():
            if overrides.get(key) is not None:
                values[key] = overrides[key]
                continue
            raw = os.environ.get(env, "").strip()
            if raw:
                try:
                    values[key] = parse(raw)
                except ValueError:
                    kind = getattr(parse, "__name__", "value")
                    raise SettingsError(f"{env}={raw!r} is not a valid {kind}") from None
        return replace(cls(), **values) if values else cls()


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


_parse_bool.__name__ = "boolean (true/false)"


def parse_address(value: str, *, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) → (host, port); port 0 picks a free port."""
    host, sep, port_text = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise SettingsError(f"{what} must be HOST:PORT (e.g. 127.0.0.1:4318), got {value!r}")
    return host, int(port_text)
