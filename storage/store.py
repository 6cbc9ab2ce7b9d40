"""Open the ClickHouse store from a DSN: embedded chDB by default, a server or cluster over HTTP.

Every stage talks to ClickHouse through :class:`Store`, a thin wrapper over one clickhouse-connect
client. Values always travel as server-side parameters (``{name:Type}`` in the SQL text and a
``parameters`` mapping), never formatted into the statement.

DSN forms::

    chdb:///abs/path/to/store          in-process ClickHouse (chDB); the directory is created
    http://user:password@host:8123/db  a ClickHouse server (https:// for TLS, e.g. ClickHouse Cloud)
"""

from __future__ import annotations

import fcntl
import os
import threading
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import unquote, urlsplit

import polars as pl
import pyarrow as pa

from storage.errors import StoreError, StoreInUseError

DEFAULT_STORE_DIR = ".tailwatch/store"

__all__ = [
    "DEFAULT_STORE_DIR",
    "Store",
    "StoreLocation",
    "default_store_dsn",
    "open_store",
    "parse_dsn",
    "quote_identifier",
]


def default_store_dsn() -> str:
    """The embedded store under the working directory, made absolute."""
    return "chdb://" + str(Path(DEFAULT_STORE_DIR).resolve())


@dataclass(frozen=True)
class StoreLocation:
    """A parsed DSN. ``path`` is set for embedded stores, ``host``/``port`` for servers."""

    dsn: str
    scheme: str
    database: str
    path: str = ""
    host: str = ""
    port: int = 0
    username: str = ""
    password: str = ""

    @property
    def embedded(self) -> bool:
        return self.scheme == "chdb"

    def redacted(self) -> str:
        """The DSN with its password masked, for logs and error messages."""
        if self.embedded:
            return self.dsn
        auth = f"{self.username}:***@" if self.password else (f"{self.username}@" if self.username else "")
        return f"{self.scheme}://{auth}{self.host}:{self.port}/{self.database}"


def parse_dsn(dsn: str) -> StoreLocation:
    """Parse a store DSN, raising :class:`StoreError` with the accepted forms when it is not one."""
    parts = urlsplit(dsn)
    scheme = parts.scheme.lower()
    if scheme == "chdb":
        path = unquote(parts.path)
        if parts.netloc or not path.startswith("/"):
            raise StoreError(
                f"store DSN {dsn!r}: an embedded store needs an absolute path, e.g. chdb:///var/lib/tailwatch"
            )
        return StoreLocation(dsn=dsn, scheme="chdb", database="default", path=path)
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise StoreError(
                f"store DSN {dsn!r}: no host; expected {scheme}://user:password@host:port/database"
            )
        database = parts.path.strip("/") or "default"
        if "/" in database:
            raise StoreError(f"store DSN {dsn!r}: the path must be a single database name")
        port = parts.port or (8443 if scheme == "https" else 8123)
        return StoreLocation(
            dsn=dsn,
            scheme=scheme,
            database=database,
            host=parts.hostname,
            port=port,
            username=unquote(parts.username or "default"),
            password=unquote(parts.password or ""),
        )
    raise StoreError(
        f"store DSN {dsn!r} is not supported: use chdb:///abs/path (embedded) or "
        "http(s)://user:password@host:port/database (a ClickHouse server)"
    )


def _check_not_locked(path: Path, dsn: str) -> None:
    """Fail with one clear line when another process holds the embedded store.

    ClickHouse takes an exclusive ``flock`` on ``<path>/status`` while it runs; probing the same lock
    first turns chDB's native error (and its stderr noise) into a sentence a user can act on.
    """
    status = path / "status"
    if not status.exists():
        return
    try:
        fd = os.open(status, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise StoreInUseError(
            f"store {dsn} is in use by another process; stop that process (e.g. `tailwatch serve`), "
            "or keep data in a ClickHouse server (--store http://host:8123) that several processes share"
        ) from None
    finally:
        os.close(fd)


class Store:
    """One ClickHouse client plus the store's identity. Thread-safe: calls are serialized.

    Usage::

        with open_store("chdb:///tmp/tw") as store:
            rows = store.query_rows("SELECT {x:String}", {"x": "it's data"})
    """

    def __init__(self, location: StoreLocation, client: Any, *, shares: Store | None = None) -> None:
        """``shares``: another handle on that store's client (e.g. one that counts a job's reads):
        it takes the same lock and schema record, and closing it leaves the client open."""
        self.location = location
        self.client = client
        # clickhouse-connect clients are not safe for concurrent queries on one session, and the
        # embedded engine is one per process anyway: one lock keeps receivers, jobs and API calls
        # from interleaving on the same client.
        self._lock: threading.RLock = shares._lock if shares is not None else threading.RLock()
        # What storage.ensure_schema applied through this store: later calls are a set lookup.
        self.schema_lock: threading.Lock = shares.schema_lock if shares is not None else threading.Lock()
        self.schema_applied: set[tuple[str, int]] = shares.schema_applied if shares is not None else set()
        self._owns_client = shares is None
        self._closed = False

    @property
    def dsn(self) -> str:
        return self.location.dsn

    @property
    def database(self) -> str:
        return self.location.database

    @property
    def embedded(self) -> bool:
        return self.location.embedded

    def table(self, name: str) -> str:
        """A table name qualified with the store's database, quoted as an identifier."""
        return f"`{self.database}`.`{name}`"

    def query_arrow(
        self,
        sql: str,
        parameters: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> pa.Table:
        """The result as an Arrow table. ``settings`` apply to this query only; on the embedded store
        the client applies them with a read of the session's settings and a ``SET`` before and after
        the query (about 20 ms), so a frequent read puts them in its own ``SETTINGS`` clause."""
        with self._guard(sql):
            return self.client.query_arrow(sql, parameters=dict(parameters or {}), settings=settings)

    def query_polars(
        self,
        sql: str,
        parameters: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> pl.DataFrame:
        frame = pl.from_arrow(self.query_arrow(sql, parameters, settings))
        assert isinstance(frame, pl.DataFrame)
        # One chunk per ClickHouse block arrives (hundreds for a large result); joins and group-bys
        # over a contiguous frame run several times faster than the one copy costs.
        return frame.rechunk()

    def query_rows(
        self,
        sql: str,
        parameters: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
    ) -> list[tuple[Any, ...]]:
        with self._guard(sql):
            result = self.client.query(sql, parameters=dict(parameters or {}), settings=settings)
            return [tuple(row) for row in result.result_rows]

    def query_value(self, sql: str, parameters: Mapping[str, Any] | None = None) -> Any:
        rows = self.query_rows(sql, parameters)
        return rows[0][0] if rows else None

    def command(
        self,
        sql: str,
        parameters: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
        data: bytes | None = None,
    ) -> Any:
        """Run a statement. ``data`` is sent as the request's body, for an ``INSERT … SELECT … FROM
        input() FORMAT …`` (a server reads it as the input; the embedded engine has no body)."""
        with self._guard(sql):
            if data is not None:
                return self.client.command(
                    sql, parameters=dict(parameters) if parameters else None, data=data, settings=settings
                )
            return self.client.command(
                sql, parameters=dict(parameters) if parameters else None, settings=settings
            )

    def insert_arrow(self, table: str, data: pa.Table, settings: Mapping[str, Any] | None = None) -> None:
        if data.num_rows == 0:
            return
        with self._guard(f"INSERT INTO {table}"):
            self.client.insert_arrow(table, data, database=self.database, settings=settings)

    @contextmanager
    def key_set(self, keys: pl.Series) -> Iterator[str]:
        """A temporary ``Set`` table of the 64-bit ``keys``, for ``expr IN <name>`` in the queries run
        inside the block; dropped when the block ends. Embedded stores only.

        A large set as a query parameter costs far more than the query using it: a 100k-key array
        takes about 0.3 s to pass, the same keys sent as RowBinary into a Set table about 0.03 s.
        The table lives in the client's session (not in the database), so it is never seen by other
        processes and disappears with the session if the block is never left.
        """
        if not self.embedded:
            raise StoreError("key_set() needs the embedded store: a server session may not be sticky")
        name = f"tailwatch_keys_{uuid.uuid4().hex}"
        # RowBinary of one UInt64 column is the values' little-endian bytes, back to back.
        data = keys.cast(pl.UInt64).to_numpy().astype("<u8", copy=False).tobytes()
        self.command(f"CREATE TEMPORARY TABLE {name} (key UInt64) ENGINE = Set SETTINGS persistent = 0")
        try:
            if data:
                with self._guard(f"INSERT INTO {name}"):
                    self.client.raw_insert(name, ["key"], data, fmt="RowBinary")
            yield name
        finally:
            self.command(f"DROP TEMPORARY TABLE IF EXISTS {name}")

    def table_exists(self, name: str) -> bool:
        return bool(
            self.query_value(
                "SELECT count() FROM system.tables WHERE database = {db:String} AND name = {name:String}",
                {"db": self.database, "name": name},
            )
        )

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                if self._owns_client:
                    self.client.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @contextmanager
    def _guard(self, what: str) -> Iterator[None]:
        from clickhouse_connect.driver.exceptions import ClickHouseError

        with self._lock:
            if self._closed:
                raise StoreError(f"store {self.location.redacted()} is closed")
            try:
                yield
            except ClickHouseError as exc:
                first = " ".join(str(exc).split())[:600]
                raise StoreError(f"ClickHouse error ({self.location.redacted()}): {first}") from exc


# The driver's messages bury the cause in a urllib3 retry report: name it in the user's words.
_UNREACHABLE = (
    ("Connection refused", "connection refused"),
    ("Name or service not known", "unknown host"),
    ("timed out", "connection timed out"),
)


def open_store(dsn: str | None = None, *, connect_timeout: float = 10.0, create: bool = True) -> Store:
    """Open the store the DSN names (``None``: the embedded default, ``.tailwatch/store``).

    ``create=False`` (the read commands) refuses an embedded store that does not exist instead of
    creating an empty one wherever a mistyped path or an unset variable points."""
    import clickhouse_connect
    from clickhouse_connect.driver.exceptions import ClickHouseError

    location = parse_dsn(dsn or default_store_dsn())
    if location.embedded:
        path = Path(location.path)
        if not create and not path.is_dir():
            raise StoreError(
                f"no store at {location.dsn}: nothing was ingested there; point --store (or "
                f"TAILWATCH_STORE) at the store your collectors write, or fill this one with "
                "`tailwatch ingest FILE...` or `tailwatch collect`"
            )
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"store {location.dsn}: cannot create the directory: {exc.strerror}") from None
        _check_not_locked(path, location.dsn)
        try:
            client = clickhouse_connect.get_client(dsn=f"chdb://{path}")
        except ClickHouseError as exc:
            message = str(exc)
            if "already initialized" in message:
                raise StoreError(
                    f"store {location.dsn}: this process already has another embedded store open; "
                    "close it first (one embedded engine per process)"
                ) from None
            if "lock" in message.lower() or "Another server instance" in message:
                raise StoreInUseError(
                    f"store {location.dsn} is in use by another process; stop that process "
                    "(e.g. `tailwatch serve`) first"
                ) from None
            raise StoreError(
                f"store {location.dsn} could not be opened: {' '.join(message.split())[:300]}"
            ) from None
        # Arrow results never leave the process: compressing each record batch (LZ4 by default) only
        # for pyarrow to decompress it again cost a fifth of a large read. A session setting, so
        # that no query pays clickhouse-connect's per-call SET and restore for it.
        client.command("SET output_format_arrow_compression_method = 'none'")
        return Store(location, client)
    try:
        client = clickhouse_connect.get_client(
            host=location.host,
            port=location.port,
            username=location.username,
            password=location.password,
            database=location.database,
            secure=location.scheme == "https",
            connect_timeout=connect_timeout,
        )
    except ClickHouseError as exc:
        message = " ".join(str(exc).split())
        for symptom, meaning in _UNREACHABLE:
            if symptom in message:
                raise StoreError(
                    f"store {location.redacted()} could not be reached: {meaning} "
                    f"(is ClickHouse listening on {location.host}:{location.port}?)"
                ) from None
        raise StoreError(f"store {location.redacted()} could not be reached: {message[:300]}") from None
    except OSError as exc:
        raise StoreError(f"store {location.redacted()} could not be reached: {exc}") from None
    return Store(location, client)


def quote_identifier(name: str) -> str:
    """Backtick-quote an identifier (table, database, cluster name) for DDL."""
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"
