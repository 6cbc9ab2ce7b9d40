"""Named leases in the store: only the holder of a lease does the work it guards (the scheduler's
jobs, a summary build).

A ClickHouse server has no compare-and-set, so a lease is append-and-read-back: an instance that
finds no unexpired lease of that name held by someone else appends a renewal stamped with the
*server's* clock (so instance clocks never matter), then reads the newest renewal back; whoever
wrote the newest one holds it. Two instances racing for an expired lease can both believe they hold
it until the loser's next check, never longer. An embedded store is opened by one process only: its
leases are held by that process, and threads inside it take turns on a lock per store and name.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from storage.migrations import DDLContext, Migration, ensure_schema, register_migrations
from storage.store import Store

__all__ = ["LEASE_MIGRATIONS", "LEASE_TABLE", "Lease", "instance_id", "lease_table"]

LEASE_TABLE = "tailwatch_scheduler_lease"


def instance_id() -> str:
    """``host:pid``, the name a run and a lease are recorded under."""
    return f"{socket.gethostname()}:{os.getpid()}"


def lease_table(ctx: DDLContext) -> list[str]:
    body = """    name LowCardinality(String),
    holder String,
    renewed_at DateTime64(3, 'UTC'),
    expires_at DateTime64(3, 'UTC')"""
    # Renewals accumulate until a merge keeps the newest; readers never depend on merges
    # (they ORDER BY renewed_at DESC LIMIT 1).
    return ctx.create_table(
        LEASE_TABLE,
        body,
        kind="ReplacingMergeTree",
        engine_args="renewed_at",
        tail="ORDER BY (name, holder)",
    )


# The table was the service's (its migration "service" v2 made it first); leases are everyone's now.
LEASE_MIGRATIONS: tuple[Migration, ...] = (Migration("storage", 1, LEASE_TABLE, lease_table),)
register_migrations(LEASE_MIGRATIONS)

# Threads of one process holding an embedded store's leases: one lock per (store path, lease name).
_LOCAL: dict[tuple[str, str], threading.Lock] = {}
_LOCAL_GUARD = threading.Lock()


class Lease:
    """The lease ``name`` on ``store`` for ``ttl_s`` seconds, renewed by :meth:`acquire`.

    Usage::

        lease = Lease(store, "summaries", ttl_s=120)
        with lease.held() as mine:
            if mine:
                ...  # renew with lease.acquire() during long work
    """

    def __init__(
        self,
        store: Store,
        name: str,
        ttl_s: float,
        holder: str | None = None,
        *,
        exclusive_store: bool | None = None,
    ) -> None:
        self.store = store
        self.name = name
        self.ttl_ms = max(1, round(ttl_s * 1000))
        self.holder = holder or instance_id()
        self.current_holder: str | None = None
        # An embedded store is exclusive to this process: nobody else can hold its leases.
        self.exclusive = store.embedded if exclusive_store is None else exclusive_store

    def _newest(self) -> tuple[str, bool] | None:
        rows = self.store.query_rows(
            f"SELECT holder, expires_at > now64(3) FROM {self.store.table(LEASE_TABLE)} "
            "WHERE name = {name:String} ORDER BY renewed_at DESC, holder LIMIT 1",
            {"name": self.name},
        )
        return (str(rows[0][0]), bool(rows[0][1])) if rows else None

    def acquire(self) -> bool:
        """Take or renew the lease; ``True`` while this instance holds it."""
        if self.exclusive:
            self.current_holder = self.holder
            return True
        ensure_schema(self.store, LEASE_MIGRATIONS)
        newest = self._newest()
        if newest is not None and newest[1] and newest[0] != self.holder:
            self.current_holder = newest[0]
            return False
        self.store.command(
            f"INSERT INTO {self.store.table(LEASE_TABLE)} (name, holder, renewed_at, expires_at) "
            "SELECT {name:String}, {holder:String}, now64(3), now64(3) + toIntervalMillisecond({ttl:UInt32})",
            {"name": self.name, "holder": self.holder, "ttl": self.ttl_ms},
        )
        newest = self._newest()
        self.current_holder = newest[0] if newest else None
        return self.current_holder == self.holder

    def release(self) -> None:
        """Expire our lease now so another instance takes over at its next check, not after the TTL."""
        if self.exclusive or self.current_holder != self.holder:
            return
        self.store.command(
            f"INSERT INTO {self.store.table(LEASE_TABLE)} (name, holder, renewed_at, expires_at) "
            "SELECT {name:String}, {holder:String}, now64(3), now64(3) - toIntervalMillisecond(1)",
            {"name": self.name, "holder": self.holder},
        )
        self.current_holder = None

    @contextmanager
    def held(self) -> Iterator[bool]:
        """The lease for the block (``False``: another instance holds it), released after. Threads
        of this process sharing an embedded store take turns (they wait instead of skipping)."""
        if self.exclusive:
            with _LOCAL_GUARD:
                lock = _LOCAL.setdefault((self.store.location.dsn, self.name), threading.Lock())
            with lock:
                self.current_holder = self.holder
                yield True
            return
        mine = self.acquire()
        try:
            yield mine
        finally:
            if mine:
                self.release()
