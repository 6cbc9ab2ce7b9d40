"""storage: the ground floor every stage stands on.

The ClickHouse store (one clickhouse-connect client from a DSN: embedded chDB or a server), the one
error family, versioned migrations with the registry that creates every stage's tables, and the
time and duration vocabulary the stages share. It imports no other tailwatch package.

Usage::

    from storage import open_store, ensure_schema
    store = open_store("chdb:///tmp/tw")    # or http(s)://user:password@host:8123/db
    ensure_schema(store)                    # every table registered by the stages imported so far
    store.query_rows("SELECT {x:String}", {"x": "it's data"})
"""

from storage.errors import SchemaError, StoreError, StoreInUseError, TailwatchError
from storage.lease import LEASE_TABLE, Lease, instance_id, lease_table
from storage.migrations import (
    MIGRATIONS_TABLE,
    DDLContext,
    Migration,
    SchemaReport,
    apply_schema,
    ensure_schema,
    migration_state,
    register_migrations,
    registered_migrations,
    render_ddl,
)
from storage.store import Store, StoreLocation, default_store_dsn, open_store, parse_dsn, quote_identifier
from storage.times import as_utc, format_duration, iso_z, parse_duration, parse_time, utc_now

__all__ = [
    "LEASE_TABLE",
    "MIGRATIONS_TABLE",
    "DDLContext",
    "Lease",
    "Migration",
    "SchemaError",
    "SchemaReport",
    "Store",
    "StoreError",
    "StoreInUseError",
    "StoreLocation",
    "TailwatchError",
    "apply_schema",
    "as_utc",
    "default_store_dsn",
    "ensure_schema",
    "format_duration",
    "instance_id",
    "iso_z",
    "lease_table",
    "migration_state",
    "open_store",
    "parse_dsn",
    "parse_duration",
    "parse_time",
    "quote_identifier",
    "register_migrations",
    "registered_migrations",
    "render_ddl",
    "utc_now",
]
