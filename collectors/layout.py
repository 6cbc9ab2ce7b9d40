"""Which trace table a store holds, read from the store itself, and how tailwatch reads it.

Users arrive with ``otel_traces`` made by something else: the Collector's ``clickhouseexporter``
(its Map layout of 2024–25, its 2026 layout with ``*AttributeItems`` aliases and a shorter primary
key, or its ``json: true`` variant with ``JSON`` attribute columns), ClickStack/HyperDX's seed
migration (the Map layout plus ``SampleRate`` and a RUM session column), or tailwatch itself. All
share the 22 columns the reads use; they differ in the attribute columns' type, the skip indexes, the
trace-id lookup table and, on a cluster, whether a ``Distributed`` table stands in front.

:func:`inspect_traces` reads ``system.tables``, ``system.columns`` and
``system.data_skipping_indices`` once per store and names what it found (:class:`TracesLayout`).
Every read of the span table passes its SQL through :meth:`TracesLayout.adapt`: the reads are
written against the Map layout; on a JSON table the few Map idioms they use (a key's value, the key
list) are rewritten to the JSON type's own (``getSubcolumn``, ``JSONAllPaths``), so one SQL text
serves every variant and attribute names stay query parameters.
"""

from __future__ import annotations

import re
import threading
import weakref
from dataclasses import dataclass, field

from collectors.schema import TRACE_ID_TS_TABLE, TRACES_TABLE
from storage import Store, StoreError

__all__ = [
    "JSON_LIST_KEYS",
    "REQUIRED_COLUMNS",
    "TracesLayout",
    "TracesLayoutError",
    "distributed_parts",
    "distributed_target",
    "inspect_traces",
    "json_first",
    "json_lookups",
    "to_json_dialect",
]

# What every read needs, by name (types are checked where they matter: the attribute columns).
REQUIRED_COLUMNS = (
    "Timestamp",
    "TraceId",
    "SpanId",
    "ParentSpanId",
    "TraceState",
    "SpanName",
    "SpanKind",
    "ServiceName",
    "ResourceAttributes",
    "SpanAttributes",
    "Duration",
    "StatusCode",
    "StatusMessage",
    "Events.Timestamp",
    "Events.Name",
    "Events.Attributes",
    "Links.TraceId",
    "Links.SpanId",
    "Links.TraceState",
    "Links.Attributes",
)

# On a JSON table an attribute list is looked up one key at a time (a JSON path must be a constant,
# so no lambda can walk the list): lists longer than this are read up to this many keys.
JSON_LIST_KEYS = 16

_ATTRIBUTE_COLUMNS = ("SpanAttributes", "ResourceAttributes")
_PARAM = r"\{\w+:(?:String|Array\(String\))\}(?:\[\d+\])?"


class TracesLayoutError(StoreError):
    """The store's span table lacks what tailwatch reads."""


@dataclass(frozen=True)
class TracesLayout:
    """What :func:`inspect_traces` found. ``variant`` is one of ``collector`` (the exporter's Map
    layout of 2024–25, also tailwatch's own), ``collector-2026``, ``collector-json``, ``clickstack``,
    ``custom`` (the columns tailwatch reads, made by something else) or ``missing`` (no table)."""

    database: str
    table: str
    variant: str
    attributes: str  # "map" | "json"
    engine: str  # e.g. MergeTree, ReplicatedMergeTree, Distributed
    distributed_over: str | None = None  # the data table behind a Distributed one
    created_by_tailwatch: bool = False
    trace_id_lookup: str | None = None  # e.g. "otel_traces_trace_id_ts (MergeTree)"
    sample_rate_column: bool = False
    skip_indexes: tuple[str, ...] = ()
    extra_columns: tuple[str, ...] = ()
    missing_columns: tuple[str, ...] = ()
    # How a (key, value) resource attribute can be found by index: "values" (a bloom filter over
    # mapValues(ResourceAttributes), the 2024-25 layout), "items" (an index over the 2026 layout's
    # ResourceAttributeItems 'key=value' list) or None (only by a scan).
    resource_value_index: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def exists(self) -> bool:
        return self.variant != "missing"

    @property
    def json(self) -> bool:
        return self.attributes == "json"

    def adapt(self, sql: str) -> str:
        """``sql`` written against the Map layout, as this table reads it (unchanged on Map tables)."""
        return sql if not self.json else to_json_dialect(sql)

    def describe(self) -> list[str]:
        """Lines for ``tailwatch schema inspect`` and start-up messages: what was found, how tailwatch
        reads it, and what it lacks."""
        where = f"{self.database}.{self.table}"
        if not self.exists:
            return [f"table {where}: missing", *(f"note: {note}" for note in self.notes)]
        engine = self.engine + (f" over {self.distributed_over}" if self.distributed_over else "")
        lines = [
            f"table {where}: {self.variant} layout ({self.attributes} attributes, engine {engine})",
            "created by tailwatch: "
            + ("yes" if self.created_by_tailwatch else "no (tailwatch does not alter it without --yes)"),
        ]
        if self.missing_columns:
            lines.append("tailwatch reads: nothing (columns missing, see below)")
        elif self.json:
            lines.append("tailwatch reads: the spans, looking up JSON attribute paths")
        else:
            lines.append("tailwatch reads: the spans, attributes as maps")
        lines += [
            f"trace-id lookup: {self.trace_id_lookup or 'none'}",
            f"sample rate column: {'SampleRate' if self.sample_rate_column else 'none'}",
        ]
        if self.skip_indexes:
            lines.append("skip indexes: " + ", ".join(self.skip_indexes))
        release_lookup = {
            "values": "by the bloom filter over resource attribute values",
            "items": "by the index over ResourceAttributeItems (key=value)",
        }.get(self.resource_value_index or "", "by a scan (no index over resource attribute values)")
        lines.append(f"release times: {release_lookup}")
        used = {"ResourceAttributeItems"} if self.resource_value_index == "items" else set()
        ignored = [c for c in self.extra_columns if c not in used]
        if ignored:
            lines.append("extra columns (ignored): " + ", ".join(ignored))
        lacks = ", ".join(self.missing_columns) if self.missing_columns else "nothing tailwatch reads"
        lines.append(f"lacks: {lacks}")
        lines.extend(f"note: {note}" for note in self.notes)
        return lines


def _value_of(column: str, key: str) -> str:
    return f"toString(getSubcolumn({column}, {key}))"


def json_lookups(value: str, keys: str, start: int = 1) -> list[tuple[str, str]]:
    """(key, value) SQL of the elements ``start``.. of the ``Array(String)`` parameter ``keys`` looked
    up in the JSON ``value`` (a column or a lambda argument), as many as ``JSON_LIST_KEYS``: a JSON
    path must be a constant, so a list of names is unrolled (a past-the-end element is '', which no
    path has, so its value is '')."""
    param = f"{{{keys}:Array(String)}}"
    return [(f"{param}[{i}]", _value_of(value, f"{param}[{i}]")) for i in range(start, JSON_LIST_KEYS + 1)]


def json_first(value: str, keys: str) -> str:
    """The value of the first name of the parameter ``keys`` with a non-empty value in the JSON
    ``value`` ('' when none): the JSON form of an attribute-list lookup."""
    lookups = ", ".join(f"nullIf({v}, '')" for _, v in json_lookups(value, keys))
    return f"coalesce({lookups}, '')"


def to_json_dialect(sql: str) -> str:
    """Rewrite the Map idioms tailwatch's reads use into the JSON type's.

    - ``C.values[indexOf(C.keys, K)]`` and ``C[K]`` (K a query parameter or an element of one) →
      the path's value as a string ('' when absent, as for a map);
    - an attribute list walked by a lambda (``arrayMap(k -> C.values[indexOf(C.keys, k)], L)``) →
      the same list unrolled into ``JSON_LIST_KEYS`` constant lookups (a past-the-end element is '',
      which no path has);
    - ``C.keys`` / ``mapKeys(C)`` → ``JSONAllPaths(C)`` (the dotted paths, i.e. the attribute names).
    A JSON table has no value list: ``has(mapValues(C), V)`` (a bloom-filter shortcut) becomes true.
    """
    for column in _ATTRIBUTE_COLUMNS:
        c = re.escape(column)
        sql = re.sub(
            rf"{c}\.values\[indexOf\({c}\.keys, ({_PARAM})\)\]",
            lambda m, col=column: _value_of(col, m.group(1)),  # type: ignore[misc]
            sql,
        )
        sql = re.sub(
            rf"{c}\[({_PARAM})\]",
            lambda m, col=column: _value_of(col, m.group(1)),  # type: ignore[misc]
            sql,
        )

        def _unrolled(m: re.Match[str], col: str = column) -> str:
            items = [v for _, v in json_lookups(col, m.group(1), int(m.group(2)))]
            return "[" + ", ".join(items) + "]" if items else "CAST([], 'Array(String)')"

        sql = re.sub(
            rf"arrayMap\(k -> {c}\.values\[indexOf\({c}\.keys, k\)\], "
            rf"arraySlice\(\{{(\w+):Array\(String\)\}}, (\d+)\)\)",
            _unrolled,
            sql,
        )
        sql = re.sub(rf"has\(mapValues\({c}\), [^)]*\)", "true", sql)
        sql = re.sub(rf"mapKeys\({c}\)", f"JSONAllPaths({column})", sql)
        sql = re.sub(rf"\b{c}\.keys\b", f"JSONAllPaths({column})", sql)
    leftover = re.search(
        r"\b(?:Span|Resource)Attributes\.values\b|mapValues\((?:Span|Resource)Attributes\)", sql
    )
    if leftover:
        # A read written with an idiom this rewrite does not know would fail on the server with a
        # type error; say which instead.
        raise TracesLayoutError(f"a read uses {leftover.group(0)!r}, which has no JSON-table form")
    return sql


_cache: weakref.WeakKeyDictionary[Store, TracesLayout] = weakref.WeakKeyDictionary()
_cache_lock = threading.Lock()


def inspect_traces(store: Store, *, refresh: bool = False, table: str = TRACES_TABLE) -> TracesLayout:
    """The layout of ``store``'s span table, read once per store object (``refresh`` reads again)."""
    if table == TRACES_TABLE and not refresh:
        with _cache_lock:
            cached = _cache.get(store)
        if cached is not None and cached.exists:
            return cached
    layout = _inspect(store, table)
    if table == TRACES_TABLE:
        with _cache_lock:
            _cache[store] = layout
    return layout


def _table_row(store: Store, name: str, database: str | None = None) -> tuple[str, str, str] | None:
    rows = store.query_rows(
        "SELECT engine, engine_full, create_table_query FROM system.tables "
        "WHERE database = {db:String} AND name = {t:String}",
        {"db": database or store.database, "t": name},
    )
    return (str(rows[0][0]), str(rows[0][1]), str(rows[0][2])) if rows else None


def distributed_parts(engine_full: str, database: str) -> tuple[str, str, str] | None:
    """(cluster, database, table) of a ``Distributed(cluster, db, table[, key])`` engine; an empty
    or ``currentDatabase()`` database is ``database`` (the Distributed table's own)."""
    args = re.findall(r"'((?:[^'\\]|\\.)*)'|(\w+\(\))|(\w+)", engine_full.partition("(")[2])
    values = [a or b or c for a, b, c in args]
    if len(values) < 3:
        return None
    db = values[1] if values[1] not in ("", "currentDatabase()") else database
    return values[0], db, values[2]


def distributed_target(engine_full: str, database: str) -> tuple[str, str] | None:
    """(database, table) a ``Distributed(cluster, db, table[, key])`` engine reads (see
    :func:`distributed_parts`)."""
    parts = distributed_parts(engine_full, database)
    return None if parts is None else parts[1:]


def _inspect(store: Store, table: str) -> TracesLayout:
    row = _table_row(store, table)
    if row is None:
        return TracesLayout(store.database, table, "missing", "map", "", notes=(f"no table {table}",))
    engine, engine_full, _ = row
    data_db, data_table = store.database, table
    distributed_over = None
    if engine == "Distributed":
        target = distributed_target(engine_full, store.database)
        if target is not None:
            distributed_over = target[1] if target[0] == store.database else f"{target[0]}.{target[1]}"
            # The indexes are the data table's: read them where it is, when this node holds it.
            if _table_row(store, target[1], target[0]) is not None:
                data_db, data_table = target
    columns = {
        str(name): (str(type_), str(kind))
        for name, type_, kind in store.query_rows(
            "SELECT name, type, default_kind FROM system.columns "
            "WHERE database = {db:String} AND table = {t:String}",
            {"db": store.database, "t": table},
        )
    }
    indexes = tuple(
        f"{name} {type_}"
        for name, type_ in store.query_rows(
            "SELECT name, type FROM system.data_skipping_indices "
            "WHERE database = {db:String} AND table = {t:String} "
            "ORDER BY name",
            {"db": data_db, "t": data_table},
        )
    )
    missing = tuple(c for c in REQUIRED_COLUMNS if c not in columns)
    json_type = columns.get("SpanAttributes", ("", ""))[0].startswith("JSON")
    sample_rate = "SampleRate" in columns
    items = "SpanAttributeItems" in columns
    extra = tuple(sorted(set(columns) - set(REQUIRED_COLUMNS) - {"ScopeName", "ScopeVersion"}))
    if missing:
        variant = "custom"
    elif json_type:
        variant = "collector-json"
    elif sample_rate or "__hdx_materialized_rum.sessionId" in columns:
        variant = "clickstack"
    elif items:
        variant = "collector-2026"
    else:
        variant = "collector"
    created = _created_by_tailwatch(store)
    lookup = _table_row(store, TRACE_ID_TS_TABLE)
    lookup_text = f"{TRACE_ID_TS_TABLE} ({lookup[0]})" if lookup else None
    notes: list[str] = []
    if missing:
        notes.append(
            "missing columns tailwatch reads: " + ", ".join(missing) + " — create the table with "
            "`tailwatch schema apply` or point TAILWATCH_STORE at the Collector's database"
        )
    if lookup is None:
        notes.append(
            f"no trace-id lookup table ({TRACE_ID_TS_TABLE}): trace lookups scan by the TraceId bloom filter"
        )
    if json_type:
        notes.append(
            "JSON attributes: reads look up each attribute path; attribute lists longer than "
            f"{JSON_LIST_KEYS} names are read up to that many"
        )
    if sample_rate:
        notes.append("SampleRate column: counts and percentiles are weighted by the sample rate")
    value_index = None
    if not json_type and _has_index_on(store, data_db, data_table, "mapValues(ResourceAttributes)"):
        value_index = "values"
    elif (
        not json_type and "ResourceAttributeItems" in columns and _has_items_index(store, data_db, data_table)
    ):
        value_index = "items"
    else:
        notes.append("no index over resource attribute values: release times are found by a scan")
    return TracesLayout(
        database=store.database,
        table=table,
        variant=variant,
        attributes="json" if json_type else "map",
        engine=engine,
        distributed_over=distributed_over,
        created_by_tailwatch=created,
        trace_id_lookup=lookup_text,
        sample_rate_column=sample_rate,
        skip_indexes=indexes,
        extra_columns=extra,
        missing_columns=missing,
        resource_value_index=value_index,
        notes=tuple(notes),
    )


def _has_items_index(store: Store, database: str, table: str) -> bool:
    # The server records an index over an ALIAS column by the alias's expression.
    return bool(
        store.query_value(
            "SELECT count() FROM system.data_skipping_indices WHERE database = {db:String} "
            "AND table = {t:String} AND (replaceAll(expr, ' ', '') = 'ResourceAttributeItems' "
            "OR (position(expr, 'CAST(ResourceAttributes') > 0 AND position(expr, 'concat(') > 0))",
            {"db": database, "t": table},
        )
    )


def _has_index_on(store: Store, database: str, table: str, expression: str) -> bool:
    # ``skip_indexes`` names each index and its type; whether one covers an expression is in ``expr``.
    return bool(
        store.query_value(
            "SELECT count() FROM system.data_skipping_indices WHERE database = {db:String} "
            "AND table = {t:String} AND replaceAll(expr, ' ', '') = {e:String}",
            {"db": database, "t": table, "e": expression.replace(" ", "")},
        )
    )


def _created_by_tailwatch(store: Store) -> bool:
    """Whether tailwatch's migration created the table (rather than finding it already there).

    ``storage.apply_schema`` records the span-table migration as ``found`` when the table existed
    before it ran; a store set up before that record existed counts as tailwatch's own."""
    from storage import migration_state

    try:
        return migration_state(store, "collectors", 1) == "applied"
    except StoreError:
        return False
