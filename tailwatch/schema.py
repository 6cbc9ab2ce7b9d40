"""Every stage's migrations in order, for ``tailwatch schema`` and the service.

Stages own their tables (``analytics.schema``, ``slo_rules.schema``); this module, at the top of
the import graph, is the one place that knows them all.
"""

from __future__ import annotations

import importlib

from collectors.schema import TRACES_MIGRATIONS, Migration, SchemaReport, apply_schema
from collectors.store import Store

# Stage modules whose MIGRATIONS join the schema, in data-flow order.
_STAGE_SCHEMAS = ("analytics.schema", "slo_rules.schema", "tailwatch.service_schema")


def all_migrations() -> list[Migration]:
    migrations: list[Migration] = list(TRACES_MIGRATIONS)
    for module_name in _STAGE_SCHEMAS:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        migrations.extend(getattr(module, "MIGRATIONS", ()))
    return migrations


def ensure_all(store: Store, *, cluster: str | None = None, ttl_days: int | None = None) -> SchemaReport:
    """Create every table tailwatch uses (idempotent)."""
    return apply_schema(store, all_migrations(), cluster=cluster, ttl_days=ttl_days)
